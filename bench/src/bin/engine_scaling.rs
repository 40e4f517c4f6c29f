//! `engine_scaling`: how the switch's engine scales over threads, with no
//! kernel (issue 21). T threads feed pre-built DATA datagrams in memory to a
//! backend ([`agg_bench::engine`]) and encode its RESULTs; per (backend,
//! layout, T) it reports DATA Mpps, payload GB/s summed, RESULTs/s and DATA
//! per CPU-second of the feeding threads, the median of the repeats, and the
//! lowest share of their CPUs the threads got (below 1: other load ran
//! there, or a thread slept on a contended lock) (the repeats of all configurations interleaved, so
//! that a burst of other load spreads over them). Prints a table, and with
//! `--json` writes every repeat. Before and after each run of 2 or more
//! pinned threads it measures how long a cache line takes from the first
//! thread's CPU to the second's and back ([`engine::probe`]): on a virtual
//! machine that changes as the hypervisor moves the CPUs, and every
//! cross-thread hand-over pays it (column `c2c ns`: per repeat the larger
//! of the two, the median of the repeats). A wrong
//! RESULT, or any refused DATA, fails the run (exit status 1) instead of
//! reporting a number.
//! `scripts/bench scaling` runs it.

use std::path::PathBuf;
use std::time::Duration;

use agg_bench::engine::{self, BackendKind, EngineError, Layout, Measured, Spec, Until};
use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use serde::Serialize;

#[derive(Parser)]
#[command(
    version,
    about = "In-memory scaling benchmark of the switch's engine: T threads feed DATA, encode RESULTs"
)]
struct Cli {
    /// Thread counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Ranks per job.
    #[arg(long, default_value_t = 4)]
    ranks: u16,
    /// float32 elements per DATA (362: a 1500-byte MTU).
    #[arg(long, default_value_t = 362)]
    elems: u16,
    /// Slots per job.
    #[arg(long, default_value_t = 256)]
    slots: u16,
    /// Each job's window (default: --slots).
    #[arg(long)]
    window: Option<u16>,
    /// Seq lanes of each job's engine (0: one per thread in the steered
    /// layout, where each thread takes its own lanes; 1 elsewhere).
    #[arg(long, default_value_t = 0)]
    seq_lanes: u16,
    /// Seqs of pre-built frames per rank, reused cyclically.
    #[arg(long, default_value_t = 4096)]
    frames: u32,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Measurements per configuration (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, value_enum, default_value_t = BackendArg::All)]
    backend: BackendArg,
    #[arg(long, value_enum, default_value_t = LayoutArg::All)]
    layout: LayoutArg,
    /// Do not pin thread t to the t-th CPU this process may use.
    #[arg(long)]
    no_pin: bool,
    /// Write every measurement here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    /// One Mutex<JobTable>, taken per batch of 64 (switchd before issue 21).
    TableLock,
    /// The lock-free DATA path (issue 21).
    Lockfree,
    /// The lock-free DATA path behind software seq lanes: a DATA of
    /// another thread's lane (seq mod T) is copied to that thread.
    Lanes,
    /// Every backend that is built (the others are listed as not built).
    All,
}

#[derive(Clone, Copy, ValueEnum)]
enum LayoutArg {
    /// One job; rank r's DATA on thread r mod T.
    Rss,
    /// One job; rank r's DATA on thread ⌊r·T/n⌋ (neighbouring ranks on one
    /// thread, as switchd deals a port per worker).
    RankBlocks,
    /// One job; seq s's DATA, of every rank, on thread s mod T (slots
    /// steered to threads: switchd's seq lanes with an ntuple rule per lane
    /// port).
    Steered,
    /// T jobs; thread t feeds every rank of job t.
    JobPerThread,
    All,
}

#[derive(Serialize)]
struct Params {
    ranks: u16,
    elems: u16,
    slots: u16,
    window: u16,
    frames: u32,
    seconds: f64,
    repeats: usize,
    batch: usize,
    sample_every: u32,
    cpus_allowed: usize,
}

#[derive(Serialize)]
struct NotBuilt {
    backend: &'static str,
    error: String,
}

#[derive(Serialize)]
struct Repeat {
    #[serde(flatten)]
    measured: Measured,
    mpps: f64,
    gbps: f64,
    results_mps: f64,
    mpps_per_cpu_s: f64,
    cpu_share: f64,
    /// CPU-to-CPU cache-line round trip measured just before and just
    /// after (2 or more pinned threads).
    core_round_trip_ns: Option<f64>,
    core_round_trip_after_ns: Option<f64>,
}

/// The CPU round trips around one run.
#[derive(Clone, Copy)]
struct Probes {
    before: Option<f64>,
    after: Option<f64>,
}

impl Probes {
    /// The larger of the two (the hypervisor may move a CPU mid-run).
    fn worse(self) -> Option<f64> {
        match (self.before, self.after) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

#[derive(Serialize)]
struct Config {
    backend: &'static str,
    layout: &'static str,
    threads: usize,
    pinned: bool,
    /// Medians over the repeats.
    mpps: f64,
    gbps: f64,
    results_mps: f64,
    mpps_per_cpu_s: f64,
    /// The lowest share of their CPUs the threads got in a repeat.
    cpu_share_min: f64,
    /// Median over the repeats of the larger CPU-to-CPU round trip around
    /// each, if measured.
    core_round_trip_ns: Option<f64>,
    repeats: Vec<Repeat>,
}

#[derive(Serialize)]
struct Report {
    benchmark: &'static str,
    params: Params,
    not_built: Vec<NotBuilt>,
    runs: Vec<Config>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if cli.threads.is_empty() || cli.threads.contains(&0) {
        bail!("--threads needs thread counts of 1 or more, e.g. --threads 1,2");
    }
    if !(cli.seconds > 0.0 && cli.seconds.is_finite()) {
        bail!("--seconds must be a positive number, not {}", cli.seconds);
    }
    if cli.repeats == 0 {
        bail!("--repeats must be 1 or more");
    }
    let backends: &[BackendKind] = match cli.backend {
        BackendArg::TableLock => &[BackendKind::TableLock],
        BackendArg::Lockfree => &[BackendKind::LockFree],
        BackendArg::Lanes => &[BackendKind::Lanes],
        BackendArg::All => &BackendKind::ALL,
    };
    let layouts: &[Layout] = match cli.layout {
        LayoutArg::Rss => &[Layout::Rss],
        LayoutArg::RankBlocks => &[Layout::RankBlocks],
        LayoutArg::Steered => &[Layout::Steered],
        LayoutArg::JobPerThread => &[Layout::JobPerThread],
        LayoutArg::All => &Layout::ALL,
    };
    let cpus = if cli.no_pin {
        Vec::new()
    } else {
        engine::allowed_cpus()
    };
    let window = cli.window.unwrap_or(cli.slots);
    let spec = |backend, layout, threads| Spec {
        backend,
        layout,
        threads,
        ranks: cli.ranks,
        elems: cli.elems,
        slots: cli.slots,
        window,
        frames: cli.frames,
        until: Until::Elapsed(Duration::from_secs_f64(cli.seconds)),
        cpus: cpus.clone(),
        stuck_after: Duration::from_secs(10),
        seq_lanes: cli.seq_lanes,
    };

    // A backend that is not built is named, not measured; asked for alone,
    // that is an error.
    let mut not_built = Vec::new();
    let mut measured_backends = Vec::new();
    for &b in backends {
        let mut probe = spec(b, Layout::Rss, 1);
        probe.until = Until::Seqs(1);
        match engine::run(&probe) {
            Err(e @ EngineError::NotBuilt { .. }) if backends.len() > 1 => {
                eprintln!("engine_scaling: skipping {}: {e}", b.name());
                not_built.push(NotBuilt {
                    backend: b.name(),
                    error: e.to_string(),
                });
            }
            Err(EngineError::NothingCompleted { .. }) | Ok(_) => measured_backends.push(b),
            Err(e) => return Err(e).with_context(|| format!("backend {}", b.name())),
        }
    }
    if measured_backends.is_empty() {
        bail!("no backend to measure");
    }

    let mut configs: Vec<(BackendKind, Layout, usize)> = Vec::new();
    for &b in &measured_backends {
        for &l in layouts {
            for &t in &cli.threads {
                configs.push((b, l, t));
            }
        }
    }
    let mut results: Vec<Vec<(Measured, Probes)>> = configs.iter().map(|_| Vec::new()).collect();
    for rep in 0..cli.repeats {
        for (i, &(b, l, t)) in configs.iter().enumerate() {
            let probe = || match cpus[..] {
                [a, b, ..] if t >= 2 && cpus.len() >= t => engine::probe::core_round_trip(a, b),
                _ => None,
            };
            let before = probe();
            let m = engine::run(&spec(b, l, t)).with_context(|| {
                format!(
                    "{} {} with {t} threads, repeat {}",
                    b.name(),
                    l.name(),
                    rep + 1
                )
            })?;
            eprintln!(
                "engine_scaling: {} {} T={t} repeat {}: {:.3} Mpps, {:.2} GB/s{}",
                b.name(),
                l.name(),
                rep + 1,
                m.mpps(),
                m.gbps(),
                before.map_or(String::new(), |ns| format!(", CPU round trip {ns:.0} ns"))
            );
            let c2c = Probes {
                before,
                after: probe(),
            };
            results[i].push((m, c2c));
        }
    }

    let runs: Vec<Config> = configs
        .iter()
        .zip(results)
        .map(|(&(b, l, t), ms)| {
            let c2c: Vec<f64> = ms.iter().filter_map(|(_, c)| c.worse()).collect();
            Config {
                backend: b.name(),
                layout: l.name(),
                threads: t,
                pinned: ms.iter().all(|(m, _)| m.pinned),
                mpps: median(ms.iter().map(|(m, _)| m.mpps()).collect()),
                gbps: median(ms.iter().map(|(m, _)| m.gbps()).collect()),
                results_mps: median(ms.iter().map(|(m, _)| m.results_mps()).collect()),
                mpps_per_cpu_s: median(ms.iter().map(|(m, _)| m.mpps_per_cpu_s()).collect()),
                cpu_share_min: ms
                    .iter()
                    .map(|(m, _)| m.cpu_share())
                    .fold(f64::INFINITY, f64::min),
                core_round_trip_ns: (!c2c.is_empty()).then(|| median(c2c)),
                repeats: ms
                    .into_iter()
                    .map(|(m, c2c)| Repeat {
                        mpps: m.mpps(),
                        gbps: m.gbps(),
                        results_mps: m.results_mps(),
                        mpps_per_cpu_s: m.mpps_per_cpu_s(),
                        cpu_share: m.cpu_share(),
                        core_round_trip_ns: c2c.before,
                        core_round_trip_after_ns: c2c.after,
                        measured: m,
                    })
                    .collect(),
            }
        })
        .collect();

    println!(
        "{:<11} {:<15} {:>3} {:>8} {:>8} {:>10} {:>7} {:>10} {:>9} {:>6} {:>7}",
        "backend",
        "layout",
        "T",
        "Mpps",
        "GB/s",
        "RESULT M/s",
        "×T1",
        "Mpps/CPUs",
        "CPU share",
        "pinned",
        "c2c ns"
    );
    for c in &runs {
        let base = runs
            .iter()
            .find(|o| o.backend == c.backend && o.layout == c.layout && o.threads == 1)
            .map_or(String::from("-"), |o| format!("{:.2}", c.mpps / o.mpps));
        println!(
            "{:<11} {:<15} {:>3} {:>8.3} {:>8.2} {:>10.3} {:>7} {:>10.3} {:>9.2} {:>6} {:>7}",
            c.backend,
            c.layout,
            c.threads,
            c.mpps,
            c.gbps,
            c.results_mps,
            base,
            c.mpps_per_cpu_s,
            c.cpu_share_min,
            if c.pinned { "yes" } else { "no" },
            c.core_round_trip_ns
                .map_or(String::from("-"), |ns| format!("{ns:.0}"))
        );
    }

    if let Some(path) = &cli.json {
        let report = Report {
            benchmark: "engine_scaling",
            params: Params {
                ranks: cli.ranks,
                elems: cli.elems,
                slots: cli.slots,
                window,
                frames: cli.frames,
                seconds: cli.seconds,
                repeats: cli.repeats,
                batch: engine::BATCH,
                sample_every: engine::SAMPLE_EVERY,
                cpus_allowed: engine::allowed_cpus().len(),
            },
            not_built,
            runs,
        };
        let text = serde_json::to_string_pretty(&report).context("serialise the report")?;
        std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}
