//! How long joining takes with the version-2 handshake (HELLO, CHALLENGE,
//! JOIN with HMAC-SHA256): N workers (default 64) join the loopback
//! stand-in switch at once, each on its own thread and socket, five times;
//! prints the wall time of each round, and one all-reduce of one element by the
//! same workers as the baseline measured in the same run.
//!
//! Run: `cargo run --release -p agg-worker --example join_time [N]`

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Instant;

use worker::loopback::{LoopbackConfig, LoopbackSwitch};
use worker::{Worker, WorkerConfig, WorkerError};

/// Every rank joins at once, one thread each (a JOIN_ACK comes only when
/// all have joined).
fn join_all(cfg: &WorkerConfig) -> Result<Vec<Worker>, WorkerError> {
    std::thread::scope(|s| {
        let joins: Vec<_> = (0..cfg.n_workers)
            .map(|r| {
                let mut c = cfg.clone();
                c.rank = r;
                s.spawn(move || Worker::join(c))
            })
            .collect();
        joins
            .into_iter()
            .map(|h| h.join().expect("join thread panicked"))
            .collect()
    })
}

fn main() -> anyhow::Result<()> {
    let n: u16 = std::env::args()
        .nth(1)
        .map_or(Ok(64), |s| s.parse())
        .map_err(|e| anyhow::anyhow!("N must be a number of workers: {e}"))?;
    let secret = [0x5a; 32];
    let mut joins = Vec::new();
    let mut reduces = Vec::new();
    for _ in 0..5 {
        let sw = LoopbackSwitch::start(
            LoopbackConfig::new(1, n, secret),
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
        )?;
        let cfg = WorkerConfig::new(sw.addr(), 1, 0, n, secret);
        let t = Instant::now();
        let workers = join_all(&cfg)?;
        joins.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        std::thread::scope(|s| {
            for mut w in workers {
                s.spawn(move || {
                    let mut data = vec![1.0f32; 1];
                    w.all_reduce(&mut data).expect("all-reduce");
                });
            }
        });
        reduces.push(t.elapsed().as_secs_f64());
    }
    joins.sort_by(f64::total_cmp);
    reduces.sort_by(f64::total_cmp);
    println!(
        "{n} workers: join {:.1} ms median (min {:.1}, max {:.1}); one 1-element all-reduce (a round trip for every rank) \
         {:.1} ms median; join / all-reduce = {:.2}",
        joins[2] * 1e3,
        joins[0] * 1e3,
        joins[4] * 1e3,
        reduces[2] * 1e3,
        joins[2] / reduces[2]
    );
    Ok(())
}
