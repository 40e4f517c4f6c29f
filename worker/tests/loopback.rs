//! The worker library against `worker::loopback`, the userspace stand-in
//! for the switch on loopback (the same `proto` job table behind a plain UDP
//! socket, with optional loss). Tests the worker's I/O shell (join, windows,
//! resends, re-join after a switch restart) without XDP or root.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use proto::reference::{expected_sum, fill_pattern};
use worker::loopback::{LoopbackConfig, LoopbackSwitch};
use worker::{Worker, WorkerConfig};

const SECRET: [u8; 32] = [0x5a; 32];

fn stand_in(n: u16, drop_every: u64) -> LoopbackSwitch {
    let mut cfg = LoopbackConfig::new(1, n, SECRET);
    cfg.elems_per_chunk = 100;
    cfg.drop_every = drop_every;
    LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap()
}

fn run_workers(sw: &LoopbackSwitch, n: u16, len: usize, iterations: u32, mid: impl Fn(u32) + Sync) {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let addr = sw.addr();
                let mid = &mid;
                s.spawn(move || {
                    let mut cfg = WorkerConfig::new(addr, 1, rank, n, SECRET);
                    cfg.join_timeout = Duration::from_secs(20);
                    let mut w = Worker::join(cfg).expect("join");
                    let mut data = vec![0f32; len];
                    for it in 0..iterations {
                        if rank == 0 {
                            mid(it);
                        }
                        fill_pattern(rank, it, &mut data);
                        w.all_reduce(&mut data).expect("all_reduce");
                        for (i, v) in data.iter().enumerate() {
                            assert_eq!(
                                v.to_bits(),
                                expected_sum(n, it, i).to_bits(),
                                "rank {rank} it {it} elem {i}"
                            );
                        }
                    }
                    w.stats()
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn four_workers_bit_exact_over_loopback() {
    let sw = stand_in(4, 0);
    run_workers(&sw, 4, 10_001, 3, |_| {});
}

#[test]
fn lossy_stand_in_still_exact() {
    let sw = stand_in(3, 17);
    run_workers(&sw, 3, 5_000, 3, |_| {});
}

#[test]
fn switch_restart_between_collectives_rejoins() {
    let sw = stand_in(2, 0);
    let restart = sw.restarter();
    run_workers(&sw, 2, 3_000, 4, move |it| {
        if it == 2 {
            restart();
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

#[test]
fn wrong_secret_is_refused_with_its_reason() {
    let sw = stand_in(2, 0);
    let cfg = WorkerConfig::new(sw.addr(), 1, 0, 2, [1; 32]);
    let err = Worker::join(cfg).err().expect("must be refused");
    assert!(err.to_string().contains("bad secret"), "{err}");
}
