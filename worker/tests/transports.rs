//! The worker's transports (`mmsg`, `udp-gso`, `auto`) against the
//! loopback stand-in switch: each all-reduces bit-exactly, with loss and
//! across a switch restart, and reports which transport ran. Loopback keeps
//! checksum offload on, so `udp-gso` works there and `auto` must pick it.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use proto::reference::{expected_sum, fill_pattern};
use worker::loopback::{LoopbackConfig, LoopbackSwitch};
use worker::{TransportKind, Worker, WorkerConfig, WorkerStats};

const SECRET: [u8; 32] = [0x3c; 32];

fn stand_in(n: u16, drop_every: u64) -> LoopbackSwitch {
    let mut cfg = LoopbackConfig::new(1, n, SECRET);
    cfg.drop_every = drop_every;
    LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap()
}

/// `n` ranks all-reduce `iterations` tensors of `len` over `sw` with
/// transport `kind`, checking every element bit for bit; `mid(it)` runs on
/// rank 0 before iteration `it`. Returns each rank's transport and stats.
fn run(
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
fn mmsg_is_bit_exact_and_sends_no_super_datagrams() {
    let sw = stand_in(3, 0);
    for (kind, stats) in run(&sw, TransportKind::Mmsg, 3, 50_000, 2, |_| {}) {
        assert_eq!(kind, TransportKind::Mmsg);
        assert_eq!((stats.tx_coalesced, stats.rx_coalesced), (0, 0));
    }
}

#[test]
fn udp_gso_is_bit_exact_and_coalesces_its_data() {
    let sw = stand_in(3, 0);
    for (kind, stats) in run(&sw, TransportKind::UdpGso, 3, 50_000, 2, |_| {}) {
        assert_eq!(kind, TransportKind::UdpGso);
        assert!(
            stats.tx_coalesced > stats.chunks_sent / 2,
            "most DATA leaves in super-datagrams: {stats:?}"
        );
    }
}

#[test]
fn auto_picks_udp_gso_on_loopback() {
    let sw = stand_in(2, 0);
    for (kind, _) in run(&sw, TransportKind::Auto, 2, 5_000, 1, |_| {}) {
        assert_eq!(kind, TransportKind::UdpGso);
    }
}

#[test]
fn udp_gso_survives_loss_and_a_switch_restart() {
    let sw = stand_in(2, 13);
    let restart = sw.restarter();
    let got = run(&sw, TransportKind::UdpGso, 2, 20_000, 4, move |it| {
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
