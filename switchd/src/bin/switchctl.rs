//! `switchctl`: the operator's command for a running switchd, over its admin
//! socket (`switch.admin_socket` in the config).
//!
//!   switchctl jobs
//!   switchctl job add --id 2 --workers 4 --allow 198.18.0.0/24 --secret HEX
//!   switchctl job rm 2
//!   switchctl stats [ID] [--json]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use ipnet::Ipv4Net;
use switchd::admin::{request, AdminRequest, DEFAULT_SOCKET};
use switchd::config::JobSection;

#[derive(Parser)]
#[command(version, about = "Control a running switchd")]
struct Cli {
    /// The admin socket of switchd.
    #[arg(long, global = true, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print the raw JSON reply.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List the jobs and their state.
    Jobs,
    /// Add or remove a job.
    Job {
        #[command(subcommand)]
        cmd: JobCmd,
    },
    /// Counters of one job (chunks, bytes, retransmissions, drops by reason,
    /// ranks joined, ranks missing on the oldest incomplete seq), or of the
    /// whole switch.
    Stats { id: Option<u16> },
}

#[derive(Subcommand)]
enum JobCmd {
    /// Declare a job while switchd runs.
    Add {
        #[arg(long)]
        id: u16,
        #[arg(long)]
        workers: u16,
        /// Source prefixes allowed to join (repeat for several).
        #[arg(long = "allow", required = true)]
        allowed: Vec<Ipv4Net>,
        /// 64 hex digits.
        #[arg(long)]
        secret: String,
        #[arg(long, default_value_t = 256)]
        slots: u16,
        #[arg(long)]
        elems: Option<u16>,
        #[arg(long)]
        window: Option<u16>,
    },
    /// Remove a job: frees its memory; its workers fail with "unknown job".
    Rm { id: u16 },
}

fn print_job(j: &serde_json::Value) {
    println!(
        "job {}: {} ({}/{} ranks joined), window {}, oldest incomplete seq {}",
        j["id"],
        j["state"].as_str().unwrap_or("?"),
        j["ranks_joined"],
        j["n_workers"],
        j["window"],
        j["floor_seq"]
    );
    println!(
        "  chunks completed {}, bytes aggregated {}, results sent {}, retransmissions served {}, ECE marked {}",
        j["chunks_completed"], j["bytes_aggregated"], j["results_sent"], j["retransmits_served"], j["ece_marked"]
    );
    let missing = &j["ranks_missing_on_floor"];
    if missing.as_array().is_some_and(|a| !a.is_empty()) {
        println!("  seq {} waits for ranks {}", j["floor_seq"], missing);
    }
    if let Some(drops) = j["drops"].as_object() {
        let nonzero: Vec<String> = drops
            .iter()
            .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!(
            "  drops: {}",
            if nonzero.is_empty() {
                "none".to_string()
            } else {
                nonzero.join(" ")
            }
        );
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchctl: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    let req = match cli.cmd {
        Cmd::Jobs => AdminRequest::Jobs,
        Cmd::Stats { id } => AdminRequest::Stats { job: id },
        Cmd::Job {
            cmd: JobCmd::Rm { id },
        } => AdminRequest::RemoveJob { id },
        Cmd::Job {
            cmd:
                JobCmd::Add {
                    id,
                    workers,
                    allowed,
                    secret,
                    slots,
                    elems,
                    window,
                },
        } => AdminRequest::AddJob {
            job: JobSection {
                id,
                n_workers: workers,
                allowed_sources: allowed,
                secret,
                pool_slots: slots,
                elems_per_chunk: elems,
                window,
            },
        },
    };
    let reply = request(&cli.socket, &req).context("asking switchd")?;
    if !reply.ok {
        bail!("{}", reply.error.unwrap_or_else(|| "failed".into()));
    }
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&reply.data)?);
        return Ok(());
    }
    match req {
        AdminRequest::Jobs => {
            let jobs = reply.data.as_array().cloned().unwrap_or_default();
            if jobs.is_empty() {
                println!("no jobs");
            }
            println!(
                "{:>6}  {:<8} {:>7} {:>7} {:>6} {:>6}",
                "job", "state", "ranks", "joined", "slots", "window"
            );
            for j in jobs {
                println!(
                    "{:>6}  {:<8} {:>7} {:>7} {:>6} {:>6}",
                    j["id"],
                    j["state"].as_str().unwrap_or("?"),
                    j["n_workers"],
                    j["ranks_joined"],
                    j["pool_slots"],
                    j["window"]
                );
            }
        }
        AdminRequest::Stats { job: Some(_) } => print_job(&reply.data),
        AdminRequest::Stats { job: None } => {
            let d = &reply.data;
            println!(
                "switch generation {:#010x}, up {:.0} s: rx {} frames, tx {} frames, tx ring full {}, malformed {}, unknown job {}",
                d["generation"].as_u64().unwrap_or(0), d["uptime_secs"].as_f64().unwrap_or(0.0),
                d["rx_frames"], d["tx_frames"], d["tx_ring_full"], d["malformed_total"], d["unknown_job"]
            );
            if d["echoed"].as_u64().unwrap_or(0) > 0 {
                println!("echo mode: {} frames echoed", d["echoed"]);
            }
            for p in d["ports"].as_array().cloned().unwrap_or_default() {
                println!(
                    "port {}: XDP steered {}, passed {}, malformed {}, dropped {}, forwarded {}",
                    p["name"].as_str().unwrap_or("?"),
                    p["xdp_steered"],
                    p["xdp_passed"],
                    p["xdp_malformed"],
                    p["xdp_dropped"],
                    p["xdp_forwarded"]
                );
            }
            for j in d["jobs"].as_array().cloned().unwrap_or_default() {
                print_job(&j);
            }
        }
        AdminRequest::AddJob { job } => println!("job {} added", job.id),
        AdminRequest::RemoveJob { id } => println!("job {id} removed"),
    }
    Ok(())
}
