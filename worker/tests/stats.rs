//! `Worker::gradient_stats` against the loopback stand-in of a
//! `stats = true` job: every rank gets `reference_grad_stats` bit for bit,
//! through loss and a switch restart between collectives (re-join); and the
//! typed errors when there are none.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use proto::member::{reference_grad_stats, Shape};
use proto::reference::fill_pattern;
use worker::loopback::{LoopbackConfig, LoopbackSwitch};
use worker::{GradStats, GradStatsError, Worker, WorkerConfig};

const SECRET: [u8; 32] = [0x3c; 32];

fn stand_in(n: u16, drop_every: u64, stats: bool) -> LoopbackSwitch {
    let mut cfg = LoopbackConfig::new(1, n, SECRET);
    cfg.elems_per_chunk = 100;
    cfg.drop_every = drop_every;
    cfg.stats = stats;
    LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap()
}

fn join(sw: &LoopbackSwitch, rank: u16, n: u16) -> Worker {
    let mut cfg = WorkerConfig::new(sw.addr(), 1, rank, n, SECRET);
    cfg.join_timeout = Duration::from_secs(20);
    Worker::join(cfg).expect("join")
}

#[test]
fn every_rank_gets_the_reference_statistics_through_loss_and_a_restart() {
    const N: u16 = 3;
    const LEN: usize = 2_345;
    let sw = stand_in(N, 13, true);
    let got: Vec<Vec<GradStats>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..N)
            .map(|rank| {
                let sw = &sw;
                s.spawn(move || {
                    let mut w = join(sw, rank, N);
                    assert!(w.has_gradient_stats());
                    let mut data = vec![0f32; LEN];
                    (0..3)
                        .map(|it| {
                            if rank == 0 && it == 1 {
                                sw.restart();
                            }
                            fill_pattern(rank, it, &mut data);
                            w.all_reduce(&mut data).expect("all_reduce");
                            w.gradient_stats().expect("a stats job's all-reduce")
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for it in 0..3u32 {
        let inputs: Vec<Vec<f32>> = (0..N)
            .map(|r| {
                let mut v = vec![0f32; LEN];
                fill_pattern(r, it, &mut v);
                v
            })
            .collect();
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let want = reference_grad_stats(Shape::all_reduce(LEN), 100, &refs).unwrap();
        for (r, g) in got.iter().enumerate() {
            assert!(
                g[it as usize].bits_eq(&want),
                "rank {r} iteration {it}: {:?} != {want:?}",
                g[it as usize]
            );
        }
    }
}

#[test]
fn without_statistics_the_error_says_why() {
    let sw = stand_in(1, 0, true);
    let mut w = join(&sw, 0, 1);
    let e = w.gradient_stats().unwrap_err();
    assert_eq!(e, GradStatsError::NoCollective { job: 1, rank: 0 });
    assert!(e.to_string().contains("after all_reduce or reduce_scatter"));
    let mut x = [1.0f32, 2.0, 3.0];
    w.all_reduce(&mut x).unwrap();
    assert_eq!(
        w.gradient_stats().unwrap(),
        GradStats {
            sum_of_squares: 14.0,
            square_of_sum: 14.0,
            ranks: 1,
        }
    );
    let mut out = [0f32; 3];
    w.all_gather(&[1.0f32, 2.0, 3.0], &mut out).unwrap();
    let e = w.gradient_stats().unwrap_err();
    assert!(matches!(e, GradStatsError::NotSummed { .. }), "{e}");
    assert!(e.to_string().contains("all-gather or broadcast"), "{e}");

    let plain = stand_in(1, 0, false);
    let mut w = join(&plain, 0, 1);
    w.all_reduce(&mut x).unwrap();
    let e = w.gradient_stats().unwrap_err();
    assert_eq!(e, GradStatsError::NotAStatsJob { job: 1, rank: 0 });
    assert!(e.to_string().contains("stats = true"), "{e}");
}
