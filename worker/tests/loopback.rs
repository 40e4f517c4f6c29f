//! The worker library against a userspace stand-in for the switch on
//! loopback: the same `proto` job table behind a plain UDP socket, with
//! optional loss. Tests the worker's I/O shell (join, windows, resends,
//! re-join after a switch restart) without XDP or root.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proto::reference::{expected_sum, fill_pattern};
use proto::switch::{
    DataOutcome, Endpoint, Ipv4Prefix, JobConfig, JobTable, JoinOutcome, Source, Verdict,
};
use proto::wire::{emit_nack, write_f32s, Header, HeaderRepr, NackReason, HEADER_LEN};
use worker::{Worker, WorkerConfig};

const SECRET: [u8; 32] = [0x5a; 32];

struct StandIn {
    addr: SocketAddrV4,
    stop: Arc<AtomicBool>,
    /// Bump to simulate a switch restart (new generation, state lost).
    restart: Arc<AtomicU32>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn new_table(gen: u32, n: u16) -> JobTable {
    let mut t = JobTable::new(gen);
    t.add(
        JobConfig {
            id: 1,
            n_workers: n,
            allowed_sources: vec![Ipv4Prefix {
                addr: [127, 0, 0, 0],
                len: 8,
            }],
            secret: SECRET,
            pool_slots: 64,
            elems_per_chunk: 100,
            window: 64,
        },
        100,
    )
    .unwrap();
    t
}

fn stand_in(n: u16, loss_every: u64) -> StandIn {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let addr = match sock.local_addr().unwrap() {
        SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let restart = Arc::new(AtomicU32::new(0));
    let (st, rs) = (stop.clone(), restart.clone());
    let handle = std::thread::spawn(move || {
        let mut gen_bump = 0;
        let mut table = new_table(1000, n);
        let mut buf = [0u8; 2048];
        let mut out = [0u8; 2048];
        let mut seen = 0u64;
        while !st.load(Ordering::SeqCst) {
            if rs.load(Ordering::SeqCst) != gen_bump {
                gen_bump = rs.load(Ordering::SeqCst);
                table = new_table(1000 + gen_bump, n);
            }
            let Ok((len, SocketAddr::V4(from))) = sock.recv_from(&mut buf) else {
                continue;
            };
            seen += 1;
            if loss_every > 0 && seen.is_multiple_of(loss_every) {
                continue;
            }
            let Ok(h) = Header::new_checked(&buf[..len]) else {
                continue;
            };
            let Ok(r) = HeaderRepr::parse(&h) else {
                continue;
            };
            let ep = Endpoint {
                source: Source {
                    mac: [0; 6],
                    ip: from.ip().octets(),
                    port: from.port(),
                },
                ..Endpoint::default()
            };
            let gen = table.gen();
            let verdict = table.handle(&r, h.payload(), ep, false);
            let job = table.get(1).unwrap();
            let send_result =
                |seq: u32, rank: u16, to: SocketAddrV4, retx: bool, out: &mut [u8]| {
                    let hdr = job.result_header(seq, rank, retx, gen).unwrap();
                    hdr.emit_to(out).unwrap();
                    let n = write_f32s(job.result(seq).unwrap().values, &mut out[HEADER_LEN..]);
                    let _ = sock.send_to(&out[..HEADER_LEN + n], to);
                };
            let addr_of =
                |e: &Endpoint| SocketAddrV4::new(Ipv4Addr::from(e.source.ip), e.source.port);
            match verdict {
                Verdict::Join(JoinOutcome::Activated) => {
                    for (rank, e) in job.members() {
                        let a = job.join_ack_header(rank, gen);
                        a.emit_to(&mut out).unwrap();
                        job.join_ack_payload().emit(&mut out[HEADER_LEN..]).unwrap();
                        let _ = sock.send_to(&out[..HEADER_LEN + 6], addr_of(e));
                    }
                }
                Verdict::Join(JoinOutcome::AckAgain) => {
                    let a = job.join_ack_header(r.rank, gen);
                    a.emit_to(&mut out).unwrap();
                    job.join_ack_payload().emit(&mut out[HEADER_LEN..]).unwrap();
                    let _ = sock.send_to(&out[..HEADER_LEN + 6], from);
                }
                Verdict::Data(DataOutcome::Completed { seq }) => {
                    for (rank, e) in job.members() {
                        send_result(seq, rank, addr_of(e), false, &mut out);
                    }
                }
                Verdict::Data(DataOutcome::Retransmit { seq }) => {
                    send_result(seq, r.rank, from, true, &mut out);
                }
                Verdict::Join(JoinOutcome::Nack(reason))
                | Verdict::Data(DataOutcome::Nack(reason)) => {
                    nack(&sock, &mut out, r.rank, reason, from);
                }
                Verdict::NackUnknownJob => {
                    nack(&sock, &mut out, r.rank, NackReason::UnknownJob, from)
                }
                _ => {}
            }
        }
    });
    StandIn {
        addr,
        stop,
        restart,
        handle: Some(handle),
    }
}

fn nack(sock: &UdpSocket, out: &mut [u8], rank: u16, reason: NackReason, to: SocketAddrV4) {
    let mut h = HeaderRepr::new(proto::wire::MsgType::Nack, 1);
    h.rank = rank;
    h.emit_to(out).unwrap();
    emit_nack(reason, &mut out[HEADER_LEN..]).unwrap();
    let _ = sock.send_to(&out[..HEADER_LEN + 2], to);
}

fn run_workers(sw: &StandIn, n: u16, len: usize, iterations: u32, mid: impl Fn(u32) + Sync) {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let addr = sw.addr;
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
    let restart = sw.restart.clone();
    run_workers(&sw, 2, 3_000, 4, move |it| {
        if it == 2 {
            restart.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

#[test]
fn wrong_secret_is_refused_with_its_reason() {
    let sw = stand_in(2, 0);
    let cfg = WorkerConfig::new(sw.addr, 1, 0, 2, [1; 32]);
    let err = Worker::join(cfg).err().expect("must be refused");
    assert!(err.to_string().contains("bad secret"), "{err}");
}
