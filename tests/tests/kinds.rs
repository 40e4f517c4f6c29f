//! Reduce-scatter and all-gather through switchd (docs/PROTOCOL.md,
//! "Collective kinds"), on its AF_XDP data path: four ranks, each a UDP
//! endpoint in its namespace (tests/kinds_agent.py) whose every message this
//! test builds and checks with `proto`. Every rank's RESULTs are checked bit
//! for bit (the owner's shard sum; the owners' bytes, a signalling NaN
//! included), every RESULT's 16-byte token (docs/PROTOCOL.md, "RESULT
//! tokens") is checked, NOVAL RESULTs are a header and a token, resends get
//! each rank's own RESULT again, and a DATA naming another owner is counted
//! `kind_mismatch`; switchd runs two dataplane threads. Worker-side logic
//! (windows, timers) is not under test here: each rank sends all its
//! chunks, then resends those without a RESULT.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use agg_e2e::*;
use proto::handshake::{Handshake, JoinParams};
use proto::reference::rank_order_sum;
use proto::tag::{PacketKey, TAG_LEN};
use proto::wire::{flags, Header, HeaderRepr, Kind, MsgType, HEADER_LEN};

const N: u16 = 4;
/// Elements per chunk at a 1500-byte MTU (switchd's default): (1500 − 50)
/// / 4 floats less the RESULT's 16-byte token.
const E: usize = 358;
/// Elements per shard: two chunks, the second of 42.
const M: usize = 400;

/// One rank's UDP endpoint in its namespace.
struct Agent {
    /// The rank's address (its worker's, from the testbed).
    ip: std::net::Ipv4Addr,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Agent {
    fn start(tb: &Testbed, rank: u16) -> Agent {
        let ip = tb.worker_addr(rank);
        let mut child = tb
            .cmd_in(&tb.worker_ns(rank), "python3")
            .arg(repo_root().join("tests/kinds_agent.py"))
            .args([ip.to_string(), port(rank).to_string()])
            .arg(tb.switch_addr().to_string())
            .arg(AGG_PORT.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting tests/kinds_agent.py");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Agent {
            ip,
            child,
            stdin,
            stdout,
        }
    }

    fn send(&mut self, datagram: &[u8]) {
        let hex: String = datagram.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(self.stdin, "send {hex}").unwrap();
    }

    /// The datagrams that arrive until `quiet_ms` pass without one.
    fn recv(&mut self, quiet_ms: u32) -> Vec<Vec<u8>> {
        writeln!(self.stdin, "recv {quiet_ms}").unwrap();
        self.stdin.flush().unwrap();
        let mut out = Vec::new();
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "agent exited"
            );
            let line = line.trim();
            if line == "end" {
                return out;
            }
            let hex = line.strip_prefix("got ").expect("a 'got' line");
            out.push(
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                    .collect(),
            );
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        if self.child.wait().is_err() {
            let _ = self.child.kill();
        }
    }
}

fn port(rank: u16) -> u16 {
    41000 + rank
}

fn secret() -> [u8; 32] {
    let mut s = [0u8; 32];
    for (i, b) in s.iter_mut().enumerate() {
        *b = u8::from_str_radix(&SECRET[2 * i..2 * i + 2], 16).unwrap();
    }
    s
}

fn parse(d: &[u8]) -> HeaderRepr {
    HeaderRepr::parse(&Header::new_checked(d).unwrap()).unwrap()
}

/// Joins every rank (HELLO, CHALLENGE, JOIN, JOIN_ACK); returns the
/// switch's generation and the key its RESULTs' tokens are checked under
/// (the same for every rank).
fn join_all(agents: &mut [Agent]) -> (u32, PacketKey) {
    let mut hss: Vec<Handshake> = (0..N)
        .map(|r| {
            let params = JoinParams {
                job: 1,
                rank: r,
                n_workers: N,
                dtype: 0,
                op: 0,
                secret: secret(),
                ip: agents[usize::from(r)].ip.octets(),
                port: port(r),
                provision: None,
            };
            Handshake::new(params, [r as u8 + 1; 16])
        })
        .collect();
    let mut b = [0u8; 256];
    for (r, (a, hs)) in agents.iter_mut().zip(&mut hss).enumerate() {
        let mut challenged = false;
        for _ in 0..20 {
            let n = hs.emit_hello(&mut b).unwrap();
            a.send(&b[..n]);
            for d in a.recv(300) {
                let h = parse(&d);
                if h.msg_type == MsgType::Challenge {
                    hs.on_challenge(&h, &d[HEADER_LEN..]).unwrap();
                    challenged = true;
                }
            }
            if challenged {
                break;
            }
        }
        assert!(challenged, "rank {r}: no CHALLENGE");
        let n = hs.emit_join(0, 0, &mut b).unwrap();
        a.send(&b[..n]);
    }
    let mut joined = None;
    for (r, (a, hs)) in agents.iter_mut().zip(&hss).enumerate() {
        let acks: Vec<_> = a
            .recv(500)
            .into_iter()
            .filter(|d| parse(d).msg_type == MsgType::JoinAck)
            .collect();
        assert_eq!(acks.len(), 1, "rank {r}: one JOIN_ACK");
        let h = parse(&acks[0]);
        let ack = hs.on_join_ack(&h, &acks[0][HEADER_LEN..]).unwrap();
        let key = ack.result_key.expect("a JOIN_ACK names the RESULT key");
        joined = Some((h.gen, key));
    }
    joined.expect("no rank joined")
}

/// A chunk: its seq, owner, and `count` elements from `offset` of the
/// owner's shard.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    seq: u32,
    owner: u16,
    offset: usize,
    count: u16,
}

fn chunks(first: u32) -> Vec<Chunk> {
    let mut out = Vec::new();
    for owner in 0..N {
        let mut at = 0;
        while at < M {
            let count = E.min(M - at);
            out.push(Chunk {
                seq: first + out.len() as u32,
                owner,
                offset: at,
                count: count as u16,
            });
            at += count;
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn data(
    gen: u32,
    rank: u16,
    c: &Chunk,
    collective: u32,
    kind: Kind,
    owner: u16,
    values: Option<&[u8]>,
    last: bool,
) -> Vec<u8> {
    let mut h = HeaderRepr::new(MsgType::Data, 1);
    h.rank = rank;
    h.seq = c.seq;
    h.collective = collective;
    h.count = c.count;
    h.gen = gen;
    h.window = owner;
    h.flags = kind.flag_bits()
        | if values.is_none() { flags::NOVAL } else { 0 }
        | if last { flags::LAST } else { 0 };
    let p = values.unwrap_or(&[]);
    let mut b = vec![0u8; HEADER_LEN + p.len()];
    h.emit_to(&mut b).unwrap();
    b[HEADER_LEN..].copy_from_slice(p);
    b
}

/// Runs one collective: every rank sends every chunk (`payload(rank,
/// chunk)`: None for NOVAL), then resends those it has no RESULT for, until
/// all have one. Checks each RESULT's header and token and returns per
/// rank, per chunk, its values (None: a NOVAL RESULT).
fn run(
    agents: &mut [Agent],
    gen: u32,
    key: &PacketKey,
    kind: Kind,
    collective: u32,
    chunks: &[Chunk],
    payload: &dyn Fn(u16, &Chunk) -> Option<Vec<u8>>,
) -> Vec<Vec<Option<Vec<u8>>>> {
    let mut got: Vec<Vec<Option<Option<Vec<u8>>>>> = vec![vec![None; chunks.len()]; N as usize];
    for round in 0..10 {
        for (r, a) in agents.iter_mut().enumerate() {
            for (i, c) in chunks.iter().enumerate() {
                if got[r][i].is_none() {
                    let p = payload(r as u16, c);
                    let last = i + 1 == chunks.len();
                    a.send(&data(
                        gen,
                        r as u16,
                        c,
                        collective,
                        kind,
                        c.owner,
                        p.as_deref(),
                        last,
                    ));
                }
            }
        }
        for (r, a) in agents.iter_mut().enumerate() {
            for d in a.recv(300) {
                let h = parse(&d);
                assert_eq!(h.msg_type, MsgType::Result, "{h:?}");
                let i = h.seq.wrapping_sub(chunks[0].seq) as usize;
                let c = &chunks[i];
                let noval = !kind.receives_values(r as u16, c.owner);
                assert_eq!((h.kind(), h.count, h.no_values()), (kind, c.count, noval));
                // The values (none: NOVAL), then the 16-byte token.
                let body = &d[HEADER_LEN..];
                let values = if noval { 0 } else { c.count as usize * 4 };
                assert_eq!(body.len(), values + TAG_LEN, "{h:?}");
                let (values, token) = body.split_at(values);
                assert!(key.verify_token(&h, token), "rank {r}: a bad token: {h:?}");
                got[r][i] = Some((!noval).then(|| values.to_vec()));
            }
        }
        if got.iter().flatten().all(Option::is_some) {
            eprintln!(
                "{kind}: every rank has every RESULT after {} rounds",
                round + 1
            );
            break;
        }
    }
    got.into_iter()
        .enumerate()
        .map(|(r, g)| {
            g.into_iter()
                .enumerate()
                .map(|(i, x)| x.unwrap_or_else(|| panic!("rank {r} chunk {i}: no RESULT")))
                .collect()
        })
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
#[ignore = "needs root"]
fn reduce_scatter_and_all_gather_through_switchd_are_bit_exact() {
    if !can_run("kinds") {
        return;
    }
    let tb = Testbed::up("fs1", N, 0);
    // Two dataplane threads (sw-w0 and sw-w1 on one, sw-w2 and sw-w3 on the
    // other): a completion fans out per rank partly through the other
    // thread's outbox, and NOVAL RESULTs take that path too.
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, N)], "dataplane_threads = 2\n");
    let mut agents: Vec<Agent> = (0..N).map(|r| Agent::start(&tb, r)).collect();
    let (gen, key) = join_all(&mut agents);

    // Reduce-scatter of 4 shards of 400: magnitudes far apart, so that
    // another order of summation gives other bits.
    let input = |r: u16, i: usize| -> f32 {
        let x = (i as f32 * 0.731 + f32::from(r) * 1.37).sin();
        x * [1e7f32, 1.0, 1e-3, 3.0][r as usize]
    };
    let inputs: Vec<Vec<f32>> = (0..N)
        .map(|r| (0..N as usize * M).map(|i| input(r, i)).collect())
        .collect();
    let rs = chunks(0);
    assert_eq!(rs.len(), 8);
    let send = |r: u16, c: &Chunk| {
        let at = c.owner as usize * M + c.offset;
        Some(bytes(&inputs[r as usize][at..at + c.count as usize]))
    };
    let got = run(&mut agents, gen, &key, Kind::ReduceScatter, 0, &rs, &send);
    for r in 0..N {
        let mut shard = Vec::new();
        for (i, c) in rs.iter().enumerate() {
            match &got[r as usize][i] {
                Some(v) => {
                    assert_eq!(c.owner, r, "values only to the owner");
                    shard.extend(f32s(v));
                }
                None => assert_ne!(c.owner, r),
            }
        }
        let lo = r as usize * M;
        let refs: Vec<&[f32]> = inputs.iter().map(|v| &v[lo..lo + M]).collect();
        let want = rank_order_sum(&refs);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&shard), bits(&want), "rank {r}'s shard");
    }

    // All-gather of each rank's 400 elements: arbitrary bits, a
    // signalling NaN and a subnormal first.
    let shard_of = |r: u16| -> Vec<u8> {
        let mut v: Vec<u32> = (0..M as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ (u32::from(r) << 28))
            .collect();
        v[0] = 0x7f80_0001;
        v[1] = 0x0000_0001;
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    };
    let ag = chunks(rs.len() as u32);
    let send = |r: u16, c: &Chunk| {
        (c.owner == r)
            .then(|| shard_of(r)[c.offset * 4..(c.offset + c.count as usize) * 4].to_vec())
    };
    let got = run(&mut agents, gen, &key, Kind::AllGather, 1, &ag, &send);
    let whole: Vec<u8> = (0..N).flat_map(shard_of).collect();
    for r in 0..N {
        let mut out = Vec::new();
        for (i, c) in ag.iter().enumerate() {
            match &got[r as usize][i] {
                Some(v) => {
                    assert_ne!(c.owner, r);
                    out.extend_from_slice(v);
                }
                None => {
                    assert_eq!(c.owner, r, "NOVAL only to the owner");
                    out.extend_from_slice(&send(r, c).unwrap());
                }
            }
        }
        assert!(
            out == whole,
            "rank {r}'s all-gather differs from the owners' bytes"
        );
    }

    // A rank that lost its RESULT resends: it gets its own answer again
    // from the shadow, flagged RETX (the owner: NOVAL, the others: the
    // owner's bytes).
    let c = &ag[0];
    for (r, a) in agents.iter_mut().enumerate() {
        let r = r as u16;
        a.send(&data(
            gen,
            r,
            c,
            1,
            Kind::AllGather,
            c.owner,
            send(r, c).as_deref(),
            false,
        ));
        let again = a.recv(300);
        assert_eq!(again.len(), 1, "rank {r}: one resend answered");
        let h = parse(&again[0]);
        assert!(h.has_flag(flags::RETX) && h.kind() == Kind::AllGather);
        assert_eq!(h.no_values(), r == c.owner, "rank {r}");
        let (values, token) =
            again[0][HEADER_LEN..].split_at(again[0].len() - HEADER_LEN - TAG_LEN);
        assert!(
            key.verify_token(&h, token),
            "rank {r}: a resend's bad token"
        );
        if r != c.owner {
            assert!(values == &send(c.owner, c).unwrap()[..]);
        } else {
            assert!(values.is_empty(), "rank {r}: a NOVAL resend with values");
        }
    }
    // A resend naming another owner for a completed seq: dropped, counted,
    // unanswered.
    agents[1].send(&data(gen, 1, c, 1, Kind::AllGather, 2, None, false));
    assert!(
        agents[1].recv(300).is_empty(),
        "a kind_mismatch gets nothing"
    );
    drop(agents);
    sw.wait_stats(10, "kind_mismatch counted", |s| {
        job(s, 1)["drops"]["kind_mismatch"].as_u64() == Some(1)
    });
    let stats = stop_clean(&tb, &mut sw);
    let j = job(&stats, 1);
    assert_eq!(j["chunks_completed"].as_u64(), Some(16), "{j}");
}
