//! `aggblast`: the packet generator of the switch's rate benchmarks
//! (`scripts/bench allreduce`, rate section), on raw AF_PACKET frames ([`blast`]).
//! Prints one JSON object.
//!
//! * `aggblast echo …`: open loop, frames of one size to the switch's
//!   aggregation port as fast as possible (echo mode, XDP-drop baselines).
//! * `aggblast aggregate …`: closed loop, every rank of one job from this
//!   process; exits 2 when a sampled RESULT is not N × value.
//!
//! Not part of the worker library: it builds its own frames and drives the
//! protocol past the library (after joining through it).

mod blast;

use std::io::IsTerminal;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use proto::wire::{DEFAULT_AGG_PORT, SECRET_LEN};
use worker::WorkerConfig;

#[derive(Parser)]
#[command(
    version,
    about = "Packet generator for the aggregation switch's rate benchmarks (raw AF_PACKET frames)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Open loop: frames of one size to the switch's aggregation port as
    /// fast as possible (for echo mode and XDP-drop baselines).
    Echo(EchoArgs),
    /// Closed loop: all ranks of one job from this process, DATA as raw
    /// frames, completion from rank 0's RESULTs.
    Aggregate(AggArgs),
}

#[derive(Args)]
struct Common {
    /// Interface to send raw frames on.
    #[arg(long, default_value = "eth0")]
    ifname: String,
    /// The switch's MAC (default: from the neighbour table).
    #[arg(long)]
    dst_mac: Option<String>,
    /// Seconds to send for.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Messages per sendmmsg.
    #[arg(long, default_value_t = blast::DEFAULT_BATCH)]
    batch: usize,
    /// Go through the interface's qdisc (no PACKET_QDISC_BYPASS), so that
    /// the flow hash, not the sending CPU, picks the transmit queue: flows
    /// then spread over the queues of a multi-queue link.
    #[arg(long)]
    spread_queues: bool,
}

#[derive(Args)]
struct EchoArgs {
    #[command(flatten)]
    common: Common,
    /// The switch's IPv4 address.
    #[arg(long)]
    switch: Ipv4Addr,
    #[arg(long, default_value_t = DEFAULT_AGG_PORT)]
    port: u16,
    /// Bytes per frame, Ethernet header included, FCS not (≥ 64).
    #[arg(long, default_value_t = 1512)]
    frame_bytes: usize,
    /// Source ports to spread the frames over (queues of a multi-queue link).
    #[arg(long, default_value_t = 1)]
    flows: usize,
}

#[derive(Args)]
struct AggArgs {
    #[command(flatten)]
    common: Common,
    /// The switch's IPv4 address.
    #[arg(long)]
    switch: Ipv4Addr,
    /// The switch's aggregation UDP port.
    #[arg(long, default_value_t = DEFAULT_AGG_PORT)]
    port: u16,
    #[arg(long)]
    job: u16,
    /// Number of workers in the job, all played by this process.
    #[arg(long)]
    workers: u16,
    /// The job's secret: 64 hex digits (32 bytes).
    #[arg(long)]
    secret: String,
    /// Seconds to wait for every rank to join.
    #[arg(long, default_value_t = 30.0)]
    join_timeout: f64,
    /// Seqs in flight at most (default and cap: the switch's window).
    #[arg(long)]
    window: Option<u16>,
    /// Resend a seq's DATA when its RESULT has not come within this.
    #[arg(long, default_value_t = 50.0)]
    rto_ms: f64,
    /// Every element of every DATA payload.
    #[arg(long, default_value_t = 1.0)]
    value: f32,
    /// Check the RESULT payload (= N × value) of every K-th completed chunk.
    #[arg(long, default_value_t = 1024)]
    verify_every: u64,
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

fn dst_mac(c: &Common) -> Result<Option<[u8; 6]>> {
    c.dst_mac
        .as_deref()
        .map(|m| blast::parse_mac(m).with_context(|| format!("bad --dst-mac {m}")))
        .transpose()
}

fn echo(a: EchoArgs) -> Result<ExitCode> {
    let to = SocketAddrV4::new(a.switch, a.port);
    let mac = match dst_mac(&a.common)? {
        Some(m) => m,
        None => blast::resolve_mac(a.switch, &a.common.ifname)?,
    };
    let r = blast::blast_echo(&blast::EchoConfig {
        ifname: a.common.ifname.clone(),
        to,
        dst_mac: mac,
        frame_bytes: a.frame_bytes,
        flows: a.flows,
        secs: a.common.seconds,
        batch: a.common.batch,
        qdisc_bypass: !a.common.spread_queues,
    })
    .context("blasting")?;
    println!("{}", serde_json::to_string(&r)?);
    Ok(ExitCode::SUCCESS)
}

fn aggregate(a: AggArgs) -> Result<ExitCode> {
    if a.workers == 0 {
        bail!("--workers must be at least 1");
    }
    let mut wc = WorkerConfig::new(
        SocketAddrV4::new(a.switch, a.port),
        a.job,
        0,
        a.workers,
        parse_secret(&a.secret)?,
    );
    wc.join_timeout = Duration::from_secs_f64(a.join_timeout);
    // aggblast reads RESULTs from the sockets itself, one datagram per
    // message: no UDP_GRO buffers.
    wc.transport_kind = worker::TransportKind::Mmsg;
    let cfg = blast::AggConfig {
        ifname: a.common.ifname.clone(),
        dst_mac: dst_mac(&a.common)?,
        worker: wc,
        secs: a.common.seconds,
        window: a.window,
        rto: Duration::from_secs_f64(a.rto_ms.max(0.1) / 1e3),
        value: a.value,
        verify_every: a.verify_every,
        batch: a.common.batch,
        qdisc_bypass: !a.common.spread_queues,
    };
    let r = blast::blast_aggregate(&cfg)?;
    println!("{}", serde_json::to_string(&r)?);
    if r.verify_failed > 0 {
        eprintln!(
            "FAILED: {} sampled RESULTs differ from N × value",
            r.verify_failed
        );
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
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
        Cmd::Echo(a) => echo(a),
        Cmd::Aggregate(a) => aggregate(a),
    };
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("aggblast: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
