//! The command line's shape: clap's types for `worker allreduce` and
//! `worker join`, and the parsers of the values clap cannot check alone
//! (`--threads`, `--delay-target`).
//!
//! The doc comments here are the help text: editing one changes `--help`.
//! A check that needs several flags at once lives with what it builds:
//! naming the job in [`crate::config`], `--tree-leaves` with `--leaf` in
//! [`crate::tree`], `--elements` against `--workers` in
//! [`crate::allreduce`]; all of them run before anything joins.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use proto::wire::{Dtype, DEFAULT_AGG_PORT};
use worker::{Kind, TransportKind};

/// `--collective`: which collective the iterations run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum CollectiveArg {
    AllReduce,
    ReduceScatter,
    AllGather,
}

impl CollectiveArg {
    pub(crate) fn kind(self) -> Kind {
        match self {
            CollectiveArg::AllReduce => Kind::AllReduce,
            CollectiveArg::ReduceScatter => Kind::ReduceScatter,
            CollectiveArg::AllGather => Kind::AllGather,
        }
    }
}

#[derive(Parser)]
#[command(
    version,
    about = "Aggregation-switch worker: all-reduce f32, bf16 or f16 tensors through the switch"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Join a job and run all-reduces, reporting throughput.
    Allreduce(AllreduceArgs),
    /// Join a job once, print the switch's answer and leave the job again.
    ///
    /// Exit status: 0 joined and left, 3 refused (the reason is printed),
    /// 1 any other error. A LEAVE that could not be sent is an error too,
    /// after the answer is printed: the switch then keeps this rank as a
    /// member, and the rank's next process may be taken for it.
    Join(JobArgs),
}

/// The switch and the job: what every subcommand that joins needs.
#[derive(Args, Clone)]
pub(crate) struct SwitchJobArgs {
    /// The switch's IPv4 address.
    #[arg(long)]
    pub(crate) switch: Ipv4Addr,
    /// The switch's aggregation UDP port.
    #[arg(long, default_value_t = DEFAULT_AGG_PORT)]
    pub(crate) port: u16,
    /// The id of a declared job (with its secret: --secret-file or
    /// AGGSWITCH_SECRET). Or, for a self-provisioned job: --tenant,
    /// --tenant-key-file and --job-name instead.
    #[arg(long)]
    pub(crate) job: Option<u16>,
    /// A self-provisioned job: the tenant the operator declared on the
    /// switch (in place of --job and the secret).
    #[arg(long, value_name = "T")]
    pub(crate) tenant: Option<String>,
    /// File holding the tenant's key: 64 hex digits, mode 0600. Or set
    /// AGGSWITCH_TENANT_KEY. The key never crosses the wire.
    #[arg(long, value_name = "PATH")]
    pub(crate) tenant_key_file: Option<PathBuf>,
    /// A self-provisioned job's name, the same on every rank of a run
    /// (1..=64 of letters, digits, '.', '_', ':' and '-'): the switch
    /// creates the job on the first rank's request.
    #[arg(long, value_name = "NAME")]
    pub(crate) job_name: Option<String>,
    /// A self-provisioned job's auth mode: port or mac (a declared job's
    /// comes from its declaration).
    #[arg(long, value_name = "port|mac")]
    pub(crate) auth: Option<String>,
    /// A self-provisioned job's priority: low, normal or high.
    #[arg(long, value_name = "low|normal|high")]
    pub(crate) priority: Option<String>,
    /// A self-provisioned job with gradient statistics.
    #[arg(long)]
    pub(crate) stats: bool,
    /// Number of workers in the job.
    #[arg(long)]
    pub(crate) workers: u16,
    /// File holding the job's secret: 64 hex digits (32 bytes), mode 0600.
    /// Or set AGGSWITCH_SECRET.
    #[arg(long, value_name = "PATH")]
    pub(crate) secret_file: Option<PathBuf>,
    /// The job's secret as 64 hex digits. Every user of this machine can read
    /// it in /proc/PID/cmdline: prefer --secret-file or AGGSWITCH_SECRET.
    #[arg(long, value_name = "HEX")]
    pub(crate) secret: Option<String>,
    /// Seconds to wait for every rank to join.
    #[arg(long, default_value_t = 30.0)]
    pub(crate) join_timeout: f64,
    /// Element type of the job: f32, bf16 or f16 (the job's declaration
    /// must name the same).
    #[arg(long, default_value = "f32")]
    pub(crate) dtype: Dtype,
}

/// One rank of a job.
#[derive(Args, Clone)]
pub(crate) struct JobArgs {
    #[command(flatten)]
    pub(crate) target: SwitchJobArgs,
    #[arg(long)]
    pub(crate) rank: u16,
    /// Seconds without progress before a collective fails.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) stall_timeout: f64,
}

#[derive(Args)]
pub(crate) struct AllreduceArgs {
    #[command(flatten)]
    pub(crate) job: JobArgs,
    /// Elements (of --dtype) per tensor. For reduce-scatter and all-gather
    /// the whole tensor of n shards (a multiple of --workers): the
    /// reduce-scatter's input, the all-gather's output.
    #[arg(long)]
    pub(crate) elements: usize,
    /// The collective to run: all-reduce, reduce-scatter (each rank gets
    /// its shard of the sum) or all-gather (each rank gets every rank's
    /// shard). Reduce-scatter and all-gather need a job on one switch, not
    /// an aggregation tree.
    #[arg(long, value_enum, default_value = "all-reduce")]
    pub(crate) collective: CollectiveArg,
    /// Number of all-reduces in a row.
    #[arg(long, default_value_t = 1)]
    pub(crate) iterations: u32,
    /// Untimed all-reduces before the timed ones (not in the report's
    /// seconds, nor in --machine-cpu).
    #[arg(long, default_value_t = 0)]
    pub(crate) warmup: u32,
    /// Fill each iteration's deterministic pattern and check every element
    /// bit for bit against the rank-order sum. Without it, the first
    /// iteration reduces iteration 0's pattern and every later one the
    /// previous result (so nothing runs between the timed all-reduces).
    #[arg(long)]
    pub(crate) verify: bool,
    /// Aggregation tree: workers per leaf, in leaf order (`2,2`: two leaves
    /// of two). With `--leaf`, this worker is local rank `--rank` of that
    /// leaf's job (`--workers` is that leaf's size); its pattern is that of
    /// its global rank (the earlier leaves' sizes plus `--rank`), and
    /// `--verify` checks against the tree-order sum over all leaves.
    #[arg(long, value_delimiter = ',', value_name = "W0,W1,...")]
    pub(crate) tree_leaves: Option<Vec<u16>>,
    /// This worker's leaf in `--tree-leaves`, from 0.
    #[arg(long, value_name = "I")]
    pub(crate) leaf: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// For benchmarks: report the whole machine's busy CPU time (every CPU,
    /// kernel and softirq included, from /proc/stat) when the first
    /// all-reduce starts and when the last one ends, so that a script can
    /// charge all the processes' CPU to the all-reduces alone (the earliest
    /// start and the latest end over the ranks).
    #[arg(long)]
    pub(crate) machine_cpu: bool,
    /// For benchmarks, with `--machine-cpu`: also report the CPU seconds
    /// (user + system of every thread, /proc/PID/stat) of process PID,
    /// switchd's on a testbed, at the same two points, so that a script
    /// can charge the switch's CPU to the timed all-reduces apart from the
    /// workers' (`switchd_cpu_s`).
    #[arg(long, value_name = "PID", requires = "machine_cpu")]
    pub(crate) switchd_pid: Option<u32>,
    /// The UDP data path: `udp-gso` (DATA coalesced with UDP_SEGMENT,
    /// RESULTs with UDP_GRO), `mmsg` (one datagram per message), or `auto`
    /// (udp-gso when the kernel takes it, else mmsg).
    #[arg(long, default_value = "auto", value_name = "auto|mmsg|udp-gso")]
    pub(crate) transport: TransportKind,
    /// Threads that carry each collective, each with its own socket,
    /// window and share of the chunks: `auto` picks them from the tensor's
    /// size and the cores this process may use; more than 1 needs a switch
    /// with `seq_lanes` ≥ T (docs/design/worker-threads.md).
    #[arg(long, default_value = "auto", value_name = "auto|T", value_parser = parse_threads)]
    pub(crate) threads: usize,
    /// Disable the DCTCP window reaction to ECE.
    #[arg(long)]
    pub(crate) no_congestion_control: bool,
    /// Count a RESULT as marked, as ECE, when its RTT exceeds the path's
    /// minimum by more than this many milliseconds (0: ECE alone).
    #[arg(long, default_value_t = 2.0, value_name = "MS", value_parser = delay_target_ms)]
    pub(crate) delay_target: f64,
    /// Testing only: keep this many chunks in flight whatever the switch
    /// advertises (to exercise the switch's window enforcement).
    #[arg(long, hide = true)]
    pub(crate) window_override: Option<u16>,
}

/// `--threads`: `auto` (0) or a count in 1..=64.
fn parse_threads(s: &str) -> Result<usize, String> {
    if s == "auto" {
        return Ok(0);
    }
    match s.parse::<usize>() {
        Ok(n @ 1..=64) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a thread count: give `auto` or a number from 1 to 64"
        )),
    }
}

/// `--delay-target`: milliseconds, 0 (off) up to one second.
fn delay_target_ms(s: &str) -> Result<f64, String> {
    let ms: f64 = s.parse().map_err(|_| {
        format!("'{s}' is not a number of milliseconds (0 turns the delay signal off)")
    })?;
    if !(0.0..=1000.0).contains(&ms) {
        return Err(format!(
            "{ms} ms is outside 0..=1000 (0 turns the delay signal off)"
        ));
    }
    Ok(ms)
}

/// Tests: `worker allreduce` of declared job 1, rank 1 of 3, 8 elements,
/// and `extra`.
#[cfg(test)]
pub(crate) fn allreduce_args(extra: &[&str]) -> Result<AllreduceArgs, clap::Error> {
    let mut argv = vec![
        "worker",
        "allreduce",
        "--switch",
        "198.18.0.1",
        "--job",
        "1",
        "--rank",
        "1",
        "--workers",
        "3",
        "--secret",
        "00",
        "--elements",
        "8",
    ];
    argv.extend_from_slice(extra);
    match Cli::try_parse_from(argv)?.cmd {
        Cmd::Allreduce(a) => Ok(a),
        Cmd::Join(_) => unreachable!(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use proto::reference::expected_sum_dtype;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn delay_target_takes_milliseconds_and_says_what_is_wrong() {
        assert_eq!(delay_target_ms("0"), Ok(0.0));
        assert_eq!(delay_target_ms("2.5"), Ok(2.5));
        let e = delay_target_ms("2ms").unwrap_err();
        assert!(e.contains("'2ms' is not a number of milliseconds"), "{e}");
        let e = delay_target_ms("5000").unwrap_err();
        assert!(e.contains("outside 0..=1000"), "{e}");
        assert!(delay_target_ms("-1").is_err());
    }

    #[test]
    fn threads_flag_takes_auto_or_a_count_and_refuses_the_rest() {
        assert_eq!(allreduce_args(&[]).unwrap().threads, 0);
        assert_eq!(allreduce_args(&["--threads", "auto"]).unwrap().threads, 0);
        assert_eq!(allreduce_args(&["--threads", "4"]).unwrap().threads, 4);
        for bad in ["0", "65", "two"] {
            let e = allreduce_args(&["--threads", bad])
                .err()
                .unwrap_or_else(|| panic!("--threads {bad} is refused"))
                .to_string();
            assert!(e.contains("`auto` or a number from 1 to 64"), "{e}");
        }
    }

    #[test]
    fn transport_flag_takes_the_three_names_and_defaults_to_auto() {
        assert_eq!(allreduce_args(&[]).unwrap().transport, TransportKind::Auto);
        for (name, kind) in [
            ("mmsg", TransportKind::Mmsg),
            ("udp-gso", TransportKind::UdpGso),
        ] {
            assert_eq!(
                allreduce_args(&["--transport", name]).unwrap().transport,
                kind
            );
        }
        let e = allreduce_args(&["--transport", "gso"])
            .err()
            .expect("an unknown transport is refused")
            .to_string();
        assert!(e.contains("udp-gso"), "{e}");
    }

    #[test]
    fn collective_flag_takes_the_three_kinds_and_refuses_others_naming_them() {
        assert_eq!(
            allreduce_args(&[]).unwrap().collective,
            CollectiveArg::AllReduce
        );
        for (name, kind) in [
            ("all-reduce", Kind::AllReduce),
            ("reduce-scatter", Kind::ReduceScatter),
            ("all-gather", Kind::AllGather),
        ] {
            let a = allreduce_args(&["--collective", name]).unwrap();
            assert_eq!(a.collective.kind(), kind);
            // The report and errors use the same names.
            assert_eq!(kind.name(), name);
        }
        let e = allreduce_args(&["--collective", "allgather"])
            .err()
            .expect("an unknown collective is refused")
            .to_string();
        for want in ["allgather", "all-reduce", "reduce-scatter", "all-gather"] {
            assert!(e.contains(want), "{want:?} missing from: {e}");
        }
    }

    #[test]
    fn dtype_defaults_to_f32_and_names_the_choices() {
        assert_eq!(allreduce_args(&[]).unwrap().job.target.dtype, Dtype::F32);
        let a = allreduce_args(&["--dtype", "bf16"]).unwrap();
        assert_eq!(a.job.target.dtype, Dtype::Bf16);
        let Err(e) = allreduce_args(&["--dtype", "fp16"]) else {
            panic!("--dtype fp16 was taken");
        };
        let e = e.to_string();
        assert!(e.contains("f32, bf16 or f16"), "{e}");
        // And the reference it verifies against rounds once: some sums of
        // the pattern in bf16 are not the f32 sum.
        let rounds = (0..1000).any(|i| {
            expected_sum_dtype(Dtype::Bf16, 4, 0, i)
                != (0..4)
                    .map(|r| proto::reference::pattern_dtype(Dtype::Bf16, r, 0, i))
                    .sum::<f32>()
        });
        assert!(rounds, "the verify pattern must make bf16 sums round");
    }
}
