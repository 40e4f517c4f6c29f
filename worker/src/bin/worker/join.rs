//! `worker join`: join once, print the switch's answer, and LEAVE again,
//! a probe for operators.
//!
//! Exit status 0: joined and left; 3: refused, the reason printed; any
//! other error (a LEAVE that could not be sent included, after the answer)
//! is main's status 1.

use std::process::ExitCode;

use anyhow::{Context, Result};
use worker::{Worker, WorkerError};

use crate::args::JobArgs;
use crate::config::config;

pub(crate) fn join(a: JobArgs) -> Result<ExitCode> {
    let cfg = config(&a)?;
    match Worker::join(cfg) {
        Ok(w) => {
            println!(
                "joined job {} as rank {}: gen {:#010x}, {} slots, {} {} elements per chunk, \
                 transport {}, auth {}, gradient statistics {}",
                w.job(),
                a.rank,
                w.generation(),
                w.pool_slots(),
                w.elems_per_chunk(),
                w.dtype(),
                w.transport(),
                w.auth(),
                if w.has_gradient_stats() { "on" } else { "off" }
            );
            // Done with the job (docs/PROTOCOL.md, "LEAVE"): a member that
            // exits without it stays one, and this rank's next run (a
            // `worker allreduce`) would be taken for it asking again.
            let (job, rank) = (w.job(), a.rank);
            w.leave().with_context(|| {
                format!(
                    "joined job {job} as rank {rank}, but sending the LEAVE failed: the switch \
                     keeps rank {rank} as a member of job {job}"
                )
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ (WorkerError::Refused { .. } | WorkerError::Provision { .. })) => {
            println!("refused: {e}");
            Ok(ExitCode::from(3))
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Cmd};
    use clap::Parser;
    use proto::wire::SECRET_LEN;
    use std::time::{Duration, Instant};

    /// `worker join` leaves the job it joined: the one rank of a job on the
    /// loopback stand-in joins and leaves, and the job has no member left.
    /// A join without its LEAVE (the library's, the worker dropped) keeps
    /// its member: what `worker join` did before it left.
    #[test]
    fn join_leaves_the_job_again() {
        use std::net::{Ipv4Addr, SocketAddrV4};
        use worker::loopback::{LoopbackConfig, LoopbackSwitch};
        let secret = [7u8; SECRET_LEN];
        let sw = LoopbackSwitch::start(
            LoopbackConfig::new(1, 1, secret),
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
        )
        .unwrap();
        let (port, hex) = (sw.addr().port().to_string(), hex::encode(secret));
        let argv = [
            "worker",
            "join",
            "--switch",
            "127.0.0.1",
            "--port",
            &port,
            "--job",
            "1",
            "--rank",
            "0",
            "--workers",
            "1",
            "--secret",
            &hex,
            "--join-timeout",
            "5",
        ];
        let Cmd::Join(a) = Cli::try_parse_from(argv).unwrap().cmd else {
            unreachable!("parsed as worker join");
        };
        // The switch takes the LEAVE after the join returns: wait for it.
        let settles_at = |want: u16| {
            let deadline = Instant::now() + Duration::from_secs(2);
            while sw.joined_ranks() != want && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            sw.joined_ranks()
        };
        assert_eq!(join(a.clone()).unwrap(), ExitCode::SUCCESS);
        assert_eq!(settles_at(0), 0, "worker join left rank 0 a member");

        let w = Worker::join(config(&a).unwrap()).unwrap();
        drop(w);
        assert_eq!(settles_at(1), 1, "a join without LEAVE keeps its member");
    }
}
