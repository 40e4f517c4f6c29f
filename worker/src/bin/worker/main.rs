//! `worker`: the command line over the worker library, for testbeds and
//! benchmarks. (The raw-frame packet generator of the rate benchmarks is
//! `aggblast`, in `bench/`.)
//!
//! * `worker allreduce …`: join a job and run K all-reduces of E elements
//!   (`--dtype` f32, bf16 or f16), optionally verifying every element bit for
//!   bit against the rank-order sum (for bf16/f16: the float32 sum of the
//!   inputs, rounded once; in a tree, the float32 tree-order sum rounded
//!   once)
//!   (or, for one leaf of an aggregation tree, `--tree-leaves` and `--leaf`,
//!   against the tree-order sum over all leaves).
//!   `--transport auto|mmsg|udp-gso` picks the UDP data path (see the
//!   library's docs); the report says which one ran.
//!   `--collective reduce-scatter|all-gather` runs that kind instead
//!   (`--elements` is then the whole n·m tensor: the reduce-scatter's input,
//!   the all-gather's output); `--verify` checks every output element: the
//!   rank's shard of the rank-order sum, or every rank's pattern copied bit
//!   for bit.
//!   In a `stats = true` job every all-reduce and reduce-scatter reports the
//!   switch's gradient statistics (Σᵢ‖gᵢ‖², ‖Σᵢ gᵢ‖², ranks); `--verify`
//!   checks them bit for bit against `proto::member::reference_grad_stats`
//!   of every rank's pattern (in a tree, `reference_tree_grad_stats` over
//!   every leaf's ranks).
//! * `worker join …`: join once, report the switch's answer and leave (a
//!   probe for operators: bad secret, wrong source, unknown job all print
//!   their reason). Exit status 0: joined and left; 3: refused; 1: any
//!   other error, a LEAVE that could not be sent included (the answer is
//!   printed first).
//!
//! The job secret comes from `--secret-file PATH` or `AGGSWITCH_SECRET`;
//! `--secret HEX` still works but warns (other users see it in
//! /proc/PID/cmdline). [`proto::secret`] holds the rules. A self-provisioned
//! job (docs/PROTOCOL.md, "Tenants and self-provisioned jobs") is named
//! instead by `--tenant T --tenant-key-file F --job-name NAME` (the key by
//! the same rules, or `AGGSWITCH_TENANT_KEY`): exactly one of the two ways.
//!
//! Each command and concern has its own module: [`args`] (the flags),
//! [`config`] (secret and job naming), [`tree`] (`--tree-leaves`),
//! [`cpu`] (`--machine-cpu` readings), [`verify`] (references),
//! [`report`] (what `allreduce` prints), [`allreduce`] and [`join`] (the
//! commands); this file sets up logging, dispatches and turns an error
//! into status 1.

mod allreduce;
mod args;
mod config;
mod cpu;
mod join;
mod report;
mod tree;
mod verify;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Cmd};

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
        Cmd::Allreduce(a) => allreduce::allreduce(a),
        Cmd::Join(a) => join::join(a),
    };
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("worker: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
