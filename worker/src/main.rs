//! `worker`: the command line over the worker library, for testbeds and
//! benchmarks. (The raw-frame packet generator of the rate benchmarks is
//! `aggblast`, in `bench/`.)
//!
//! * `worker allreduce …`: join a job and run K all-reduces of E float32
//!   elements, optionally verifying every element against the rank-order sum.
//! * `worker join …`: join once and report the switch's answer (a probe for
//!   operators: bad secret, wrong source, unknown job all print their reason).

use std::io::IsTerminal;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use proto::reference::{expected_sum, fill_pattern};
use proto::wire::{DEFAULT_AGG_PORT, SECRET_LEN};
use worker::{Worker, WorkerConfig, WorkerError};

#[derive(Parser)]
#[command(
    version,
    about = "Aggregation-switch worker: all-reduce float32 tensors through the switch"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Join a job and run all-reduces, reporting throughput.
    Allreduce(AllreduceArgs),
    /// Join a job once and print the switch's answer.
    Join(JobArgs),
}

/// The switch and the job: what every subcommand that joins needs.
#[derive(Args, Clone)]
struct SwitchJobArgs {
    /// The switch's IPv4 address.
    #[arg(long)]
    switch: Ipv4Addr,
    /// The switch's aggregation UDP port.
    #[arg(long, default_value_t = DEFAULT_AGG_PORT)]
    port: u16,
    #[arg(long)]
    job: u16,
    /// Number of workers in the job.
    #[arg(long)]
    workers: u16,
    /// The job's secret: 64 hex digits (32 bytes).
    #[arg(long)]
    secret: String,
    /// Seconds to wait for every rank to join.
    #[arg(long, default_value_t = 30.0)]
    join_timeout: f64,
}

/// One rank of a job.
#[derive(Args, Clone)]
struct JobArgs {
    #[command(flatten)]
    target: SwitchJobArgs,
    #[arg(long)]
    rank: u16,
    /// Seconds without progress before a collective fails.
    #[arg(long, default_value_t = 5.0)]
    stall_timeout: f64,
}

#[derive(Args)]
struct AllreduceArgs {
    #[command(flatten)]
    job: JobArgs,
    /// Elements (float32) per tensor.
    #[arg(long)]
    elements: usize,
    /// Number of all-reduces in a row.
    #[arg(long, default_value_t = 1)]
    iterations: u32,
    /// Fill each iteration's deterministic pattern and check every element
    /// bit for bit against the rank-order sum. Without it, every iteration
    /// reduces the same input (iteration 0's pattern), copied in.
    #[arg(long)]
    verify: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Disable the DCTCP window reaction to ECE.
    #[arg(long)]
    no_congestion_control: bool,
    /// Testing only: keep this many chunks in flight whatever the switch
    /// advertises (to exercise the switch's window enforcement).
    #[arg(long, hide = true)]
    window_override: Option<u16>,
}

fn parse_secret(s: &str) -> Result<[u8; SECRET_LEN]> {
    let v = hex::decode(s.trim()).context("--secret must be hex digits")?;
    v.try_into().map_err(|v: Vec<u8>| {
        anyhow::anyhow!(
            "--secret must be 32 bytes (64 hex digits), got {} bytes",
            v.len()
        )
    })
}

fn config(a: &JobArgs) -> Result<WorkerConfig> {
    let t = &a.target;
    if a.rank >= t.workers {
        bail!("--rank {} must be below --workers {}", a.rank, t.workers);
    }
    let mut c = WorkerConfig::new(
        SocketAddrV4::new(t.switch, t.port),
        t.job,
        a.rank,
        t.workers,
        parse_secret(&t.secret)?,
    );
    c.join_timeout = Duration::from_secs_f64(t.join_timeout);
    c.stall_timeout = Duration::from_secs_f64(a.stall_timeout);
    Ok(c)
}

#[derive(serde::Serialize)]
struct Report {
    job: u16,
    rank: u16,
    workers: u16,
    elements: usize,
    iterations: u32,
    seconds: f64,
    gbit_per_s: f64,
    chunks_per_s: f64,
    verified: bool,
    mismatches: u64,
    elems_per_chunk: u16,
    pool_slots: u16,
    stats: worker::WorkerStats,
}

fn allreduce(a: AllreduceArgs) -> Result<ExitCode> {
    let mut cfg = config(&a.job)?;
    cfg.transport.congestion_control = !a.no_congestion_control;
    cfg.transport.window_override = a.window_override;
    let (job, rank, n) = (cfg.job, cfg.rank, cfg.n_workers);
    let mut w = Worker::join(cfg).with_context(|| format!("joining job {job} as rank {rank}"))?;
    let mut data = vec![0f32; a.elements];
    // Without --verify every iteration reduces the same input, copied in
    // from here: generating a fresh pattern costs CPU between the timed
    // all-reduces, which on a shared machine slows the other ranks' timed
    // all-reduces and skews their start.
    let mut template = Vec::new();
    if !a.verify {
        template = vec![0f32; a.elements];
        fill_pattern(rank, 0, &mut template);
    }
    let mut busy = Duration::ZERO;
    let mut mismatches = 0u64;
    for it in 0..a.iterations {
        if a.verify {
            fill_pattern(rank, it, &mut data);
        } else {
            data.copy_from_slice(&template);
        }
        let t = Instant::now();
        w.all_reduce(&mut data)
            .with_context(|| format!("all-reduce {it} of job {job} (rank {rank})"))?;
        busy += t.elapsed();
        if a.verify {
            for (i, v) in data.iter().enumerate() {
                let want = expected_sum(n, it, i);
                if v.to_bits() != want.to_bits() {
                    if mismatches < 10 {
                        eprintln!(
                            "MISMATCH job {job} rank {rank} iteration {it} element {i}: got {v:e} ({:#010x}), expected {want:e} ({:#010x})",
                            v.to_bits(),
                            want.to_bits()
                        );
                    }
                    mismatches += 1;
                }
            }
        }
    }
    let stats = w.stats();
    let chunks_per_coll = a.elements.div_ceil(w.elems_per_chunk() as usize) as f64;
    let secs = busy.as_secs_f64().max(1e-9);
    let report = Report {
        job,
        rank,
        workers: n,
        elements: a.elements,
        iterations: a.iterations,
        seconds: secs,
        gbit_per_s: (a.elements as f64 * 4.0 * 8.0 * a.iterations as f64) / secs / 1e9,
        chunks_per_s: chunks_per_coll * a.iterations as f64 / secs,
        verified: a.verify && mismatches == 0,
        mismatches,
        elems_per_chunk: w.elems_per_chunk(),
        pool_slots: w.pool_slots(),
        stats,
    };
    let _ = w.leave();
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "job {job} rank {rank}: {} x {} elements in {:.3} s: {:.3} Gbit/s, {:.0} chunks/s, resent {}, verified: {}",
            a.iterations, a.elements, secs, report.gbit_per_s, report.chunks_per_s,
            stats.chunks_resent,
            if a.verify { if mismatches == 0 { "yes" } else { "NO" } } else { "not checked" }
        );
    }
    if mismatches > 0 {
        eprintln!("FAILED: {mismatches} elements differ from the rank-order sum");
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

fn join(a: JobArgs) -> Result<ExitCode> {
    let cfg = config(&a)?;
    match Worker::join(cfg) {
        Ok(w) => {
            println!(
                "joined job {} as rank {}: gen {:#010x}, {} slots, {} elements per chunk",
                a.target.job,
                a.rank,
                w.generation(),
                w.pool_slots(),
                w.elems_per_chunk()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ WorkerError::Refused { .. }) => {
            println!("refused: {e}");
            Ok(ExitCode::from(3))
        }
        Err(e) => Err(e.into()),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let r = match Cli::parse().cmd {
        Cmd::Allreduce(a) => allreduce(a),
        Cmd::Join(a) => join(a),
    };
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("worker: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
