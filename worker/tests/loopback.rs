//! The worker library against `worker::loopback`, the userspace stand-in
//! for the switch on loopback (the same `proto` switch, its lock-free data
//! path and job table, behind a plain UDP socket, with optional loss). Tests the worker's I/O shell (join, windows,
//! resends, re-join after a switch restart) and each of its transports
//! without XDP or root.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use proto::reference::{expected_sum, fill_pattern};
use worker::loopback::{LoopbackConfig, LoopbackSwitch};
use worker::{AuthMode, TransportKind, Worker, WorkerConfig, WorkerStats};

const SECRET: [u8; 32] = [0x5a; 32];

fn stand_in(n: u16, drop_every: u64) -> LoopbackSwitch {
    let mut cfg = LoopbackConfig::new(1, n, SECRET);
    cfg.elems_per_chunk = 100;
    cfg.drop_every = drop_every;
    LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap()
}

/// `n` ranks all-reduce `iterations` tensors of `len` over `sw` with
/// transport `kind`, checking every element bit for bit; `mid(it)` runs on
/// rank 0 before iteration `it`. Returns each rank's transport and stats.
fn run_workers(
    sw: &LoopbackSwitch,
    kind: TransportKind,
    n: u16,
    len: usize,
    iterations: u32,
    mid: impl Fn(u32) + Sync,
) -> Vec<(TransportKind, WorkerStats)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let addr = sw.addr();
                let mid = &mid;
                s.spawn(move || {
                    let mut cfg = WorkerConfig::new(addr, 1, rank, n, SECRET);
                    cfg.join_timeout = Duration::from_secs(20);
                    cfg.transport_kind = kind;
                    // ECE alone: on a loaded machine the scheduler's delays
                    // would count as queueing and shrink the window, and
                    // with it the runs of DATA that GSO coalesces, which
                    // these tests count (CI once saw 371 of 1018).
                    cfg.transport.delay_target = None;
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
                                "{kind} rank {rank} it {it} elem {i}"
                            );
                        }
                    }
                    (w.transport(), w.stats())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn four_workers_bit_exact_over_loopback() {
    let sw = stand_in(4, 0);
    run_workers(&sw, TransportKind::Auto, 4, 10_001, 3, |_| {});
    // The stand-in runs switchd's path: every DATA (4 ranks × 3 × 101
    // chunks, and any resend) on the lock-free data path, not the table.
    let data = 4 * 3 * 101;
    let lock_free = sw.lock_free_datagrams();
    assert!(lock_free >= data, "{lock_free} of {data} DATA lock-free");
}

#[test]
fn lossy_stand_in_still_exact() {
    let sw = stand_in(3, 17);
    run_workers(&sw, TransportKind::Auto, 3, 5_000, 3, |_| {});
}

#[test]
fn switch_restart_between_collectives_rejoins() {
    let sw = stand_in(2, 0);
    let restart = sw.restarter();
    run_workers(&sw, TransportKind::Auto, 2, 3_000, 4, move |it| {
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

/// A stand-in serving a `dtype` job; `n` workers of that dtype reduce the
/// rounded pattern with loss, every result checked bit for bit against the
/// float32 rank-order sum rounded once.
fn half_run<T: worker::Element + Send>(
    dtype: proto::wire::Dtype,
    conv: fn(f32) -> T,
    widen: fn(T) -> f32,
) {
    use proto::reference::{expected_sum_dtype, pattern};
    let n = 4;
    let mut cfg = LoopbackConfig::new(1, n, SECRET);
    cfg.elems_per_chunk = 200;
    cfg.dtype = dtype;
    cfg.drop_every = 13;
    let sw = LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let len = 4_001;
    std::thread::scope(|s| {
        for rank in 0..n {
            let addr = sw.addr();
            s.spawn(move || {
                let mut cfg = WorkerConfig::new(addr, 1, rank, n, SECRET);
                cfg.dtype = dtype;
                cfg.join_timeout = Duration::from_secs(20);
                let mut w = Worker::join(cfg).expect("join");
                assert_eq!(w.elems_per_chunk(), 200);
                for it in 0..2 {
                    let mut data: Vec<T> = (0..len).map(|i| conv(pattern(rank, it, i))).collect();
                    w.all_reduce(&mut data).expect("all_reduce");
                    for (i, v) in data.iter().enumerate() {
                        let want = expected_sum_dtype(dtype, n, it, i);
                        assert_eq!(
                            widen(*v).to_bits(),
                            want.to_bits(),
                            "{dtype} rank {rank} it {it} elem {i}"
                        );
                    }
                }
                // The stand-in lost datagrams, so resends were served.
                assert!(w.stats().chunks_resent > 0);
            });
        }
    });
}

#[test]
fn bf16_workers_bit_exact_over_a_lossy_stand_in() {
    half_run(
        proto::wire::Dtype::Bf16,
        half::bf16::from_f32,
        half::bf16::to_f32,
    );
}

#[test]
fn f16_workers_bit_exact_over_a_lossy_stand_in() {
    half_run(
        proto::wire::Dtype::F16,
        half::f16::from_f32,
        half::f16::to_f32,
    );
}

#[test]
fn a_worker_of_another_dtype_is_refused_naming_its_dtype() {
    let mut cfg = LoopbackConfig::new(1, 2, SECRET);
    cfg.dtype = proto::wire::Dtype::Bf16;
    let sw = LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let cfg = WorkerConfig::new(sw.addr(), 1, 0, 2, SECRET);
    let err = Worker::join(cfg).err().expect("must be refused");
    let msg = err.to_string();
    assert!(
        msg.contains("parameters differ") && msg.contains("dtype f32"),
        "{msg}"
    );
}

#[test]
fn a_tensor_of_another_dtype_is_an_error_not_a_send() {
    let sw = stand_in(1, 0);
    let cfg = WorkerConfig::new(sw.addr(), 1, 0, 1, SECRET);
    let mut w = Worker::join(cfg).expect("join");
    let mut t = vec![half::bf16::ONE; 8];
    let msg = w.all_reduce(&mut t).unwrap_err().to_string();
    assert!(
        msg.contains("bf16 elements") && msg.contains("joined the job as f32"),
        "{msg}"
    );
    assert_eq!(w.stats().chunks_sent, 0);
    // The worker still works with its own dtype.
    let mut f = vec![1.5f32; 8];
    w.all_reduce(&mut f).unwrap();
    assert_eq!(f, vec![1.5f32; 8]);
}

// The transports (`mmsg`, `udp-gso`, `auto`): each all-reduces bit-exactly,
// with loss and across a switch restart, and reports which transport ran.
// Loopback keeps checksum offload on, so `udp-gso` works here and `auto`
// must pick it.

#[test]
fn mmsg_is_bit_exact_and_sends_no_super_datagrams() {
    let sw = stand_in(3, 0);
    for (kind, stats) in run_workers(&sw, TransportKind::Mmsg, 3, 50_000, 2, |_| {}) {
        assert_eq!(kind, TransportKind::Mmsg);
        assert_eq!((stats.tx_coalesced, stats.rx_coalesced), (0, 0));
    }
}

#[test]
fn udp_gso_is_bit_exact_and_coalesces_its_data() {
    let sw = stand_in(3, 0);
    for (kind, stats) in run_workers(&sw, TransportKind::UdpGso, 3, 50_000, 2, |_| {}) {
        assert_eq!(kind, TransportKind::UdpGso);
        assert!(
            stats.tx_coalesced > stats.chunks_sent / 2,
            "most DATA leaves in super-datagrams: {stats:?}"
        );
    }
}

/// A switch with seq lanes (docs/PROTOCOL.md, "Seq lanes"): each worker
/// learns them from its CHALLENGE and sends DATA of seq s to port P + (s mod
/// 4), by either transport; the sums stay bit-exact, every lane's port
/// takes at least each worker's DATA of its seqs, no chunk is resent (a
/// lane overtaking another is no loss), and GSO still coalesces (runs of
/// one lane).
#[test]
fn data_goes_to_its_seq_lanes_port() {
    for kind in [TransportKind::Mmsg, TransportKind::UdpGso] {
        let mut cfg = LoopbackConfig::new(1, 3, SECRET);
        cfg.elems_per_chunk = 100;
        cfg.seq_lanes = 4;
        let sw = LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
        let got = run_workers(&sw, kind, 3, 50_000, 2, |_| {});
        let per_lane = sw.datagrams_per_lane();
        // 500 chunks per all-reduce, 2 of them: 250 seqs per lane, from
        // each of 3 workers; lane 0's port also takes the control messages.
        for (lane, n) in per_lane.iter().enumerate() {
            assert!(*n >= 750, "{kind}: lane {lane} took {n}: {per_lane:?}");
        }
        for (_, stats) in &got {
            assert_eq!(stats.chunks_fast_resent, 0, "{kind}: {stats:?}");
        }
        let sent: u64 = got.iter().map(|(_, s)| s.chunks_sent).sum();
        assert!(
            per_lane.iter().sum::<u64>() >= sent,
            "{kind}: every DATA reached a lane port: {per_lane:?}, {sent} sent"
        );
        if kind == TransportKind::UdpGso {
            // A super-datagram holds one lane's DATA: runs are shorter than
            // without lanes, but there are runs.
            for (_, stats) in &got {
                assert!(stats.tx_coalesced > 0, "GSO within a lane: {stats:?}");
            }
        }
    }
}

#[test]
fn a_loopback_switch_refuses_lanes_that_are_not_a_power_of_two() {
    let mut cfg = LoopbackConfig::new(1, 2, SECRET);
    cfg.seq_lanes = 3;
    let e = LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .err()
        .expect("3 lanes are refused");
    assert!(e.to_string().contains("seq_lanes 3"), "{e}");
}

#[test]
fn auto_picks_udp_gso_on_loopback() {
    let sw = stand_in(2, 0);
    for (kind, _) in run_workers(&sw, TransportKind::Auto, 2, 5_000, 1, |_| {}) {
        assert_eq!(kind, TransportKind::UdpGso);
    }
}

#[test]
fn udp_gso_survives_loss_and_a_switch_restart() {
    let sw = stand_in(2, 13);
    let restart = sw.restarter();
    let got = run_workers(&sw, TransportKind::UdpGso, 2, 20_000, 4, move |it| {
        if it == 2 {
            restart();
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    for (kind, stats) in got {
        assert_eq!(kind, TransportKind::UdpGso);
        assert!(stats.chunks_resent > 0 && stats.rejoins > 0, "{stats:?}");
    }
}

/// Forged control messages from the switch's own address and port: NACK 1
/// (what used to make a worker give up), NACK 6 and 7 (which used to make it
/// rejoin), each with a zero and with a made-up tag, and RESULTs of another
/// generation.
fn forgeries() -> Vec<Vec<u8>> {
    use proto::wire::{HeaderRepr, MsgType, NackPayload, NackReason, HEADER_LEN};
    let mut out = Vec::new();
    for reason in [
        NackReason::UnknownJob,
        NackReason::JobNotActive,
        NackReason::StaleGeneration,
    ] {
        for tag in [[0u8; 16], [0x3c; 16]] {
            let mut h = HeaderRepr::new(MsgType::Nack, 1);
            h.rank = 1;
            h.gen = 1;
            let mut b = vec![0u8; HEADER_LEN + proto::wire::NACK_PAYLOAD_LEN];
            h.emit_to(&mut b).unwrap();
            NackPayload {
                tag,
                ..NackPayload::new(reason)
            }
            .emit(&mut b[HEADER_LEN..])
            .unwrap();
            out.push(b);
        }
    }
    let mut h = HeaderRepr::new(MsgType::Result, 1);
    h.rank = 1;
    h.gen = 0x0bad_0bad;
    h.count = 1;
    let mut b = vec![0u8; HEADER_LEN + 4];
    h.emit_to(&mut b).unwrap();
    out.push(b);
    out
}

/// Issue 20, finding 2: forged NACKs and RESULTs of another generation sent
/// to rank 1 during its all-reduces, from the switch's own address, neither
/// end nor reset anything: every result is bit-exact, nobody rejoins, and
/// rank 1 counts what it ignored and found by probing that the switch did
/// not restart.
#[test]
fn forged_nacks_and_results_mid_all_reduce_are_ignored_and_counted() {
    let n = 3;
    let sw = stand_in(n, 0);
    let (len, iterations) = (200_000, 6);
    let forged = forgeries();
    let done = std::sync::atomic::AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel::<SocketAddrV4>();
    let stats: Vec<WorkerStats> = std::thread::scope(|s| {
        let sw = &sw;
        let done = &done;
        let forged = &forged;
        s.spawn(move || {
            let Ok(victim) = rx.recv() else { return };
            let mut sent = 0u64;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                for f in forged {
                    sw.forge(victim, f).unwrap();
                    sent += 1;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            assert!(sent > 0);
        });
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let addr = sw.addr();
                let tx = tx.clone();
                s.spawn(move || {
                    let mut cfg = WorkerConfig::new(addr, 1, rank, n, SECRET);
                    cfg.join_timeout = Duration::from_secs(20);
                    let mut w = Worker::join(cfg).expect("join");
                    if rank == 1 {
                        let std::net::SocketAddr::V4(a) = w.socket().local_addr().unwrap() else {
                            panic!("an IPv4 socket")
                        };
                        tx.send(a).unwrap();
                    }
                    let mut data = vec![0f32; len];
                    for it in 0..iterations {
                        fill_pattern(rank, it, &mut data);
                        w.all_reduce(&mut data)
                            .unwrap_or_else(|e| panic!("rank {rank} it {it}: {e}"));
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
        drop(tx);
        let stats = handles.into_iter().map(|h| h.join().unwrap()).collect();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        stats
    });
    for (rank, s) in stats.iter().enumerate() {
        assert_eq!(s.rejoins, 0, "rank {rank} rejoined: {s:?}");
    }
    let victim = &stats[1];
    assert!(victim.unauthenticated_dropped > 0, "{victim:?}");
    assert!(victim.probes_sent > 0, "{victim:?}");
    assert!(victim.spoofed_triggers > 0, "{victim:?}");
    assert!(
        victim.probes_sent <= victim.unauthenticated_dropped,
        "at most one probe per trigger: {victim:?}"
    );
}

/// A switch restart in the middle of all-reduces: the switch's NACK 7 has
/// no session to be tagged under, so each worker probes, learns the new
/// generation from the CHALLENGE, rejoins and resumes bit-exact.
#[test]
fn switch_restart_mid_collective_is_found_by_a_probe_and_rejoined() {
    let sw = stand_in(2, 0);
    let restart = sw.restarter();
    let stats = std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            restart();
        });
        run_workers(&sw, TransportKind::Auto, 2, 100_000, 30, |_| {})
    });
    for (_, s) in &stats {
        assert!(s.rejoins >= 1, "{s:?}");
        assert!(s.probes_sent >= 1, "{s:?}");
    }
}

#[test]
fn tagged_job_is_bit_exact_over_a_lossy_loopback() {
    // auth = "mac": the workers learn it from the JOIN_ACK, tag every DATA
    // and check every RESULT (resends after the stand-in's losses too).
    let mut cfg = LoopbackConfig::new(1, 3, SECRET);
    cfg.elems_per_chunk = 100;
    cfg.drop_every = 13;
    cfg.auth = AuthMode::Mac;
    let sw = LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..3u16)
            .map(|rank| {
                let addr = sw.addr();
                s.spawn(move || {
                    let mut cfg = WorkerConfig::new(addr, 1, rank, 3, SECRET);
                    cfg.join_timeout = Duration::from_secs(20);
                    let mut w = Worker::join(cfg).expect("join");
                    assert_eq!(w.auth(), AuthMode::Mac);
                    let mut data = vec![0f32; 5_000];
                    for it in 0..3 {
                        fill_pattern(rank, it, &mut data);
                        w.all_reduce(&mut data).expect("all_reduce");
                        for (i, v) in data.iter().enumerate() {
                            assert_eq!(v.to_bits(), expected_sum(3, it, i).to_bits());
                        }
                    }
                    let st = w.stats();
                    assert_eq!(st.bad_tag_results, 0, "{st:?}");
                    assert_eq!(st.bad_tag_join_acks, 0, "{st:?}");
                    assert!(st.chunks_resent > 0, "the losses were resent: {st:?}");
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn a_failed_tagged_collective_is_not_retried_under_the_same_key() {
    // A stalled all-reduce of a mac job has tagged its chunks under this
    // join's DATA key; tagging other data under the same (seq, collective)
    // would reuse a GMAC nonce, so the worker refuses until a new join.
    let mut cfg = LoopbackConfig::new(1, 2, SECRET);
    cfg.auth = AuthMode::Mac;
    let sw = LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = sw.addr();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        // Rank 1 joins and then never sends.
        s.spawn(move || {
            let w = Worker::join(WorkerConfig::new(addr, 1, 1, 2, SECRET)).expect("join");
            let _ = rx.recv();
            drop(w);
        });
        let mut cfg = WorkerConfig::new(addr, 1, 0, 2, SECRET);
        cfg.stall_timeout = Duration::from_millis(300);
        let mut w = Worker::join(cfg).expect("join");
        let mut data = vec![1f32; 1000];
        let e = w.all_reduce(&mut data).unwrap_err();
        assert!(matches!(e, worker::WorkerError::Stalled { .. }), "{e}");
        let e = w.all_reduce(&mut vec![2f32; 1000]).unwrap_err();
        assert!(
            matches!(e, worker::WorkerError::MacNeedsNewJoin { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("make a new Worker"), "{e}");
        tx.send(()).unwrap();
    });
}
