//! Lane replies over real UDP sockets (docs/PROTOCOL.md, "Seq lanes"):
//! `worker::loopback` with four seq lanes sends a RESULT of seq s to a
//! member that asked for lane replies from its port P + (s mod 4), and
//! every other reply from P; a member that did not ask gets everything
//! from P, as before. Each rank here is a `proto::member::Member` over one
//! unconnected UDP socket, so the test sees every datagram's source port.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use proto::handshake::JoinParams;
use proto::member::{Event, Member, ResultOutcome, Shape};
use proto::reference::{expected_sum, fill_pattern};
use proto::wire::{seq_lane_port, Dtype, MsgType, OP_SUM};
use worker::loopback::{LoopbackConfig, LoopbackSwitch};

const SECRET: [u8; 32] = [0x3c; 32];
const LANES: u16 = 4;
const N: u16 = 2;
/// Elements of the all-reduce: 24 chunks of the stand-in's 362, so every
/// lane has several.
const LEN: usize = 362 * 24;

/// One datagram a rank received: its source port, type and seq.
#[derive(Debug, Clone, Copy)]
struct Got {
    port: u16,
    msg_type: u8,
    seq: u32,
}

/// What one rank saw: whether its JOIN_ACK granted lane replies, and every
/// datagram it received.
struct Seen {
    granted: bool,
    got: Vec<Got>,
}

/// Rank `rank` joins `sw` (asking lane replies when `ask`), all-reduces
/// the pattern of iteration 0 and checks it bit for bit.
fn rank_runs(sw: SocketAddrV4, rank: u16, ask: bool) -> Seen {
    let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(1)))
        .unwrap();
    let port = sock.local_addr().unwrap().port();
    let params = JoinParams {
        job: 1,
        rank,
        n_workers: N,
        dtype: Dtype::F32 as u8,
        op: OP_SUM,
        secret: SECRET,
        ip: [127, 0, 0, 1],
        port,
        provision: None,
    };
    let mut m = Member::new(
        params,
        Default::default(),
        Default::default(),
        [rank as u8 + 1; 32],
    );
    m.ask_lane_replies(ask);
    assert!(!m.lane_replies(), "nothing granted before a join");
    let mut input = vec![0f32; LEN];
    fill_pattern(rank, 0, &mut input);
    let wire: Vec<u8> = input.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut output = vec![f32::NAN; LEN];
    let mut seen = Seen {
        granted: false,
        got: Vec::new(),
    };
    let mut buf = vec![0u8; 9216];
    let mut rx = vec![0u8; 9216];
    let deadline = Instant::now() + Duration::from_secs(30);
    m.start_join(0, 0, Instant::now());
    let mut begun = false;
    while !(begun && m.is_complete()) {
        let now = Instant::now();
        assert!(now < deadline, "rank {rank}: no progress");
        if let Some(e) = m.handle_timeout(now) {
            panic!("rank {rank}: {e:?}");
        }
        while let Some(t) = m.poll_control(now) {
            sock.send_to(t.bytes(), sw).unwrap();
        }
        while let Some(f) = m.poll_data(now, &wire, &mut buf) {
            let to = SocketAddrV4::new(*sw.ip(), seq_lane_port(sw.port(), f.seq, m.seq_lanes()));
            sock.send_to(&buf[..f.len], to).unwrap();
        }
        let Ok((len, SocketAddr::V4(from))) = sock.recv_from(&mut rx) else {
            continue;
        };
        let d = &rx[..len];
        assert!(len >= 12, "rank {rank}: a short datagram");
        seen.got.push(Got {
            port: from.port(),
            msg_type: d[0] & 0x0f,
            seq: u32::from_be_bytes(d[8..12].try_into().unwrap()),
        });
        match m.handle(d, Instant::now()) {
            Some(Event::Joined(j)) => {
                assert!(!begun, "rank {rank}: joined twice");
                assert_eq!(j.seq_lanes, LANES);
                seen.granted = j.lane_replies;
                assert_eq!(m.lane_replies(), j.lane_replies);
                m.begin(0, j.seq, Shape::all_reduce(LEN));
                begun = true;
            }
            Some(Event::Result {
                outcome:
                    ResultOutcome::Fresh {
                        into: Some(at),
                        count,
                        ..
                    },
                values,
                ..
            }) => {
                let out = &mut output[at..at + usize::from(count)];
                for (o, b) in out.iter_mut().zip(d[values].chunks_exact(4)) {
                    *o = f32::from_le_bytes(b.try_into().unwrap());
                }
            }
            Some(Event::Result { .. }) | None => {}
            Some(e) => panic!("rank {rank}: {e:?}"),
        }
    }
    for (i, v) in output.iter().enumerate() {
        assert_eq!(
            v.to_bits(),
            expected_sum(N, 0, i).to_bits(),
            "rank {rank} element {i}"
        );
    }
    seen
}

/// Runs both ranks against a stand-in with [`LANES`] seq lanes; rank r
/// asks lane replies when `asks[r]`. Returns the stand-in's port and what
/// each rank saw.
fn run(asks: [bool; 2]) -> (u16, Vec<Seen>) {
    let mut cfg = LoopbackConfig::new(1, N, SECRET);
    cfg.seq_lanes = LANES;
    let sw = LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = sw.addr();
    let seen = std::thread::scope(|s| {
        let hs: Vec<_> = (0..N)
            .map(|r| s.spawn(move || rank_runs(addr, r, asks[usize::from(r)])))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // DATA came to every lane's port.
    assert!(sw.datagrams_per_lane().iter().all(|&n| n > 0));
    (addr.port(), seen)
}

#[test]
fn a_rank_that_asks_gets_each_result_from_its_seq_lane_port() {
    let (p, seen) = run([true, false]);
    let result = MsgType::Result as u8;
    // Rank 0 asked: granted; its RESULTs from P + (seq mod 4), from every
    // lane's port; everything else (CHALLENGE, JOIN_ACK) from P.
    assert!(seen[0].granted);
    let mut ports = [0u32; LANES as usize];
    for g in &seen[0].got {
        if g.msg_type == result {
            assert_eq!(g.port, p + (g.seq % u32::from(LANES)) as u16, "{g:?}");
            ports[usize::from(g.port - p)] += 1;
        } else {
            assert_eq!(g.port, p, "{g:?}");
        }
    }
    assert!(
        ports.iter().all(|&n| n > 0),
        "RESULTs per lane port: {ports:?}"
    );
    // Rank 1 did not ask: today's replies, all from P.
    assert!(!seen[1].granted);
    assert!(seen[1].got.iter().any(|g| g.msg_type == result));
    for g in &seen[1].got {
        assert_eq!(g.port, p, "{g:?}");
    }
}

#[test]
fn both_ranks_asking_both_get_lane_replies() {
    let (p, seen) = run([true, true]);
    for (r, s) in seen.iter().enumerate() {
        assert!(s.granted, "rank {r}");
        for g in s.got.iter().filter(|g| g.msg_type == MsgType::Result as u8) {
            assert_eq!(
                g.port,
                p + (g.seq % u32::from(LANES)) as u16,
                "rank {r}: {g:?}"
            );
        }
    }
}
