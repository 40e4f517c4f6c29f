//! One collective carried by T threads of each rank (docs/design/
//! worker-threads.md), simulated with no I/O. Each rank joins once. Its
//! joined member carries share 0 of T, and `Member::lane` makes the
//! members of shares 1..T, each with its own window, RTT and DCTCP. Every
//! member of a rank sends from the rank's one bound source, as sockets
//! sharing one port do. Every rank asks lane replies
//! (`Member::ask_lane_replies`), so the switch sends the RESULT of seq s
//! from its port P + (s mod L); each reply reaches the member of share
//! (source port − P) mod T, as the kernel delivers a lane port's replies to
//! the socket connected to it. So the switch's own choice of port is what
//! routes every RESULT here. The links lose, duplicate and reorder.
//!
//! Another run restarts the switch mid-collective. The rank's joined
//! member gets every message that is not a RESULT (they all come from P,
//! whose socket is share 0's) and rejoins, asking again, from the oldest
//! unanswered seq of all its shares; the lane members go idle, then follow
//! the rejoined session and resend from the JOIN_ACK's resume point.
//!
//! What must hold:
//! * every rank's output is the rank-order sum, bit for bit, for T = 1, 2
//!   and 4;
//! * each member sends only its own seqs and never gets a RESULT that is
//!   not its own;
//! * a RESULT comes from P + (s mod L), every other reply from P;
//! * each member writes only its own chunks.

use std::time::{Duration, Instant};

use proto::member::{Event, Member, ResultOutcome, Shape};
use proto::reference::{pattern_dtype, rank_order_sum};
use proto::seq::serial_offset;
use proto::switch::entry::Switch;
use proto::switch::{Endpoint, JobTable, TableConfig};
use proto::tag::AuthMode;
use proto::wire::MsgType;
use proto::wire::{Dtype, HEADER_LEN};

mod common;
use common::{join_lossless_as, join_params, transport, Faults, Links, Worker, ALL_FAULTS, CLEAN};

const GEN: u32 = 77;
/// The switch's seq lanes: every T tested divides it.
const LANES: u16 = 4;
/// The switch's aggregation port P: the members join on it.
const AGG: u16 = 48879;

enum Msg {
    ToSwitch {
        rank: u16,
        bytes: Vec<u8>,
    },
    /// A reply from the switch's port `port`.
    ToWorker {
        rank: u16,
        port: u16,
        bytes: Vec<u8>,
    },
}

fn endpoint(rank: u16) -> Endpoint {
    Endpoint {
        local_port: AGG,
        ..common::endpoint(rank, 2000)
    }
}

/// The share whose socket a reply from switch port `port` reaches (the
/// socket connected to it is lane `port − P`'s, owned by share lane mod
/// T), after checking the port: P + (seq mod L) for a RESULT, P for
/// anything else.
fn share_of(bytes: &[u8], port: u16, threads: u32) -> usize {
    let lane = port.wrapping_sub(AGG);
    if bytes[0] & 0x0f == MsgType::Result as u8 {
        let seq = u32::from_be_bytes(bytes[8..12].try_into().unwrap());
        assert_eq!(
            u32::from(lane),
            seq % u32::from(LANES),
            "seq {seq}'s RESULT"
        );
    } else {
        assert_eq!(lane, 0, "a reply other than a RESULT from a lane port");
    }
    (u32::from(lane) % threads) as usize
}

/// Delivers `bytes` to the switch; its replies go into `net` with the
/// port each leaves from.
fn to_switch(
    sw: &Switch,
    net: &mut Links<Msg>,
    faults: Faults,
    now: Duration,
    at: Instant,
    rank: u16,
    bytes: &[u8],
) {
    // One bound source per rank, whichever thread sent.
    common::at_switch_replies(
        sw,
        common::thread_of(rank),
        bytes,
        endpoint(rank),
        at,
        |r, b| {
            net.send(faults, now, || Msg::ToWorker {
                rank: r.rank,
                port: r.to.local_port,
                bytes: b.to_vec(),
            })
        },
    );
}

/// A switch of generation `gen` whose job 1 (f32, `auth`) has `slots`
/// slots of `elems` elements, on [`LANES`] seq lanes.
fn switch(gen: u32, n: u16, elems: u16, slots: u16, auth: AuthMode, now: Instant) -> Switch {
    let mut cfg = TableConfig::new(gen, [5; 32]);
    cfg.seq_lanes = LANES;
    let mut table = JobTable::new(cfg, now);
    table
        .add(
            common::job_config(n, elems, slots, (Dtype::F32, auth)),
            elems + 8,
        )
        .unwrap();
    Switch::new(table)
}

/// Every rank joined (lossless): per rank its T members, member t carrying
/// share t of T.
fn join_all(switch: &Switch, n: u16, threads: u32, now: Instant) -> Vec<Vec<Member>> {
    let mut joined: Vec<Member> = (0..n)
        .map(|r| {
            let from = endpoint(r);
            let params = join_params(1, n, Dtype::F32, [3; 32], r, &from);
            let ask = |m: &mut Member| m.ask_lane_replies(true);
            join_lossless_as(
                &mut switch.table(),
                from,
                params,
                [r as u8; 32],
                0,
                now,
                transport(),
                ask,
            )
        })
        .collect();
    let mut table = switch.table();
    while let Some(r) = table.poll_reply() {
        let mut b = [0u8; 128];
        let e = table.encode(&r, &mut b).unwrap();
        match joined[r.rank as usize].handle(&b[..e.len], now) {
            Some(Event::Joined(j)) => assert!(j.first),
            other => panic!("rank {}: no JOIN_ACK: {other:?}", r.rank),
        }
    }
    drop(table);
    joined
        .into_iter()
        .map(|mut m| {
            assert!(m.is_joined());
            assert!(m.lane_replies(), "a switch with lanes grants what we asked");
            assert_eq!(u32::from(m.seq_lanes()) % threads, 0);
            m.set_share(0, threads);
            let mut ms: Vec<Member> = (1..threads).map(|t| m.lane(t, threads)).collect();
            assert!(ms.iter().all(Member::lane_replies));
            ms.insert(0, m);
            ms
        })
        .collect()
}

/// Runs `iterations` all-reduces of `len` elements over `n` ranks of
/// `threads` members each; returns every rank's outputs of the last
/// iteration and how many chunks all members resent. Panics on a wrong bit, a misrouted or foreign RESULT, or a
/// hang.
#[allow(clippy::too_many_arguments)]
fn run(
    n: u16,
    threads: u32,
    len: usize,
    elems: u16,
    slots: u16,
    iterations: u32,
    faults: Faults,
    seed: u64,
    auth: AuthMode,
) -> (Vec<Vec<u32>>, u64) {
    let base = Instant::now();
    let switch = switch(GEN, n, elems, slots, auth, base);
    // ranks[r][t]: rank r's member of share t.
    let mut ranks: Vec<Vec<Worker>> = join_all(&switch, n, threads, base)
        .into_iter()
        .map(|ms| ms.into_iter().map(|m| Worker::new(m, Dtype::F32)).collect())
        .collect();
    let mut net: Links<Msg> = Links::new(seed);
    let mut now = Duration::ZERO;
    let mut seq = 0u32;
    let mut last = Vec::new();
    let mut resent = 0;
    for it in 0..iterations {
        for (r, threads_of_rank) in ranks.iter_mut().enumerate() {
            let input: Vec<f32> = (0..len)
                .map(|i| pattern_dtype(Dtype::F32, r as u16, it, i))
                .collect();
            for w in threads_of_rank.iter_mut() {
                w.input = input.clone();
                w.output = vec![f32::NAN; len];
                w.begin(it, seq, Shape::all_reduce(len));
            }
        }
        let inputs: Vec<&[f32]> = ranks.iter().map(|ws| &ws[0].input[..]).collect();
        let want: Vec<u32> = rank_order_sum(&inputs)
            .into_iter()
            .map(f32::to_bits)
            .collect();
        let mut steps = 0u64;
        while !ranks.iter().flatten().all(|w| w.coll().is_complete()) {
            steps += 1;
            assert!(steps < 5_000_000, "hang: iteration {it}");
            for (r, ws) in ranks.iter_mut().enumerate() {
                for (t, w) in ws.iter_mut().enumerate() {
                    while let Some((h, bytes)) = w.poll_data(base + now) {
                        assert_eq!(
                            h.seq % threads,
                            t as u32,
                            "rank {r}: share {t} sent seq {}",
                            h.seq
                        );
                        net.send(faults, now, || Msg::ToSwitch {
                            rank: r as u16,
                            bytes: bytes.clone(),
                        });
                    }
                }
            }
            let next_timer = ranks
                .iter()
                .flatten()
                .filter_map(|w| w.coll().next_timeout())
                .min()
                .map(|t| t - base);
            now = now.max(common::next_event(net.next_delivery(), next_timer));
            while let Some(m) = net.pop_due(now) {
                match m {
                    Msg::ToSwitch { rank, bytes } => {
                        to_switch(&switch, &mut net, faults, now, base + now, rank, &bytes)
                    }
                    Msg::ToWorker { rank, port, bytes } => {
                        // The lane port's socket: its share's member.
                        let seq = u32::from_be_bytes(bytes[8..12].try_into().unwrap());
                        let w = &mut ranks[rank as usize][share_of(&bytes, port, threads)];
                        let (outcome, v) = match w.m.handle(&bytes, base + now) {
                            Some(Event::Result {
                                outcome, values, ..
                            }) => (outcome, values),
                            other => panic!(
                                "rank {rank}: not a RESULT {:?}: {other:?}",
                                &bytes[..HEADER_LEN.min(bytes.len())]
                            ),
                        };
                        // Foreign only as a late copy of an earlier
                        // collective's RESULT, never one of this collective.
                        let c = w.coll();
                        let ours = seq.wrapping_sub(c.first_seq()) < c.n_chunks();
                        assert!(
                            !(ours && matches!(outcome, ResultOutcome::Foreign)),
                            "rank {rank}: seq {seq} foreign to its share"
                        );
                        w.take(&outcome, &bytes[v]);
                    }
                }
            }
        }
        last.clear();
        for (r, ws) in ranks.iter().enumerate() {
            // The rank's output: each chunk from the member of its share;
            // the other members never wrote there.
            let mut out = vec![0u32; len];
            for (i, o) in out.iter_mut().enumerate() {
                let owner = (seq + (i / usize::from(elems)) as u32) % threads;
                for (t, w) in ws.iter().enumerate() {
                    if t as u32 == owner {
                        *o = w.output[i].to_bits();
                    } else {
                        assert!(
                            w.output[i].is_nan(),
                            "rank {r}: share {t} wrote element {i}"
                        );
                    }
                }
            }
            assert_eq!(
                out, want,
                "rank {r} iteration {it}, T = {threads}: not the rank-order sum"
            );
            last.push(out);
        }
        for ws in &ranks {
            for w in ws {
                // One fresh RESULT per chunk of the share, none of another's.
                let c = w.coll();
                assert_eq!(
                    u64::from(c.owned_chunks()),
                    c.stats.results,
                    "{:?}",
                    c.share()
                );
                resent += c.stats.resent;
            }
        }
        seq = ranks[0][0].coll().end_seq();
        assert!(ranks.iter().flatten().all(|w| w.coll().end_seq() == seq));
    }
    (last, resent)
}

#[test]
fn clean_network_one_two_and_four_threads_agree() {
    let (one, _) = run(3, 1, 1000, 16, 16, 2, CLEAN, 1, AuthMode::Port);
    for threads in [2, 4] {
        assert_eq!(
            run(3, threads, 1000, 16, 16, 2, CLEAN, 1, AuthMode::Port).0,
            one,
            "T = {threads}"
        );
    }
}

#[test]
fn two_threads_under_loss_duplication_and_reordering() {
    for seed in [3, 5, 8] {
        let (_, resent) = run(4, 2, 2000, 16, 16, 3, ALL_FAULTS, seed, AuthMode::Port);
        assert!(resent > 0, "seed {seed}: the faults made no resend");
    }
}

#[test]
fn four_threads_under_all_faults_with_tagged_data() {
    // auth = "mac": every lane member tags its DATA and checks its
    // RESULTs' tags under the one session's keys.
    let (_, resent) = run(3, 4, 1500, 16, 16, 2, ALL_FAULTS, 21, AuthMode::Mac);
    assert!(resent > 0);
}

#[test]
fn partial_last_chunks_and_fewer_chunks_than_threads() {
    for len in [1usize, 17, 33, 100] {
        run(2, 4, len, 16, 8, 2, ALL_FAULTS, 13, AuthMode::Port);
    }
}

/// One all-reduce over `n` ranks of `threads` members each, over lossy
/// links, with the switch restarted (generation 2, no sessions) once rank
/// 0's share 0 has `restart_after` chunks answered. Rejoins go over the
/// lossy links. Panics on a wrong bit or a hang; returns the rejoins.
fn run_with_restart(
    n: u16,
    threads: u32,
    len: usize,
    elems: u16,
    faults: Faults,
    seed: u64,
    restart_after: u32,
) -> u64 {
    let base = Instant::now();
    let mut sw = switch(1, n, elems, 16, AuthMode::Port, base);
    let mut ranks: Vec<Vec<Worker>> = join_all(&sw, n, threads, base)
        .into_iter()
        .map(|ms| ms.into_iter().map(|m| Worker::new(m, Dtype::F32)).collect())
        .collect();
    for (r, ws) in ranks.iter_mut().enumerate() {
        let input: Vec<f32> = (0..len)
            .map(|i| pattern_dtype(Dtype::F32, r as u16, 0, i))
            .collect();
        for w in ws.iter_mut() {
            w.input = input.clone();
            w.output = vec![f32::NAN; len];
            w.begin(0, 0, Shape::all_reduce(len));
        }
    }
    let inputs: Vec<&[f32]> = ranks.iter().map(|ws| &ws[0].input[..]).collect();
    let want: Vec<u32> = rank_order_sum(&inputs)
        .into_iter()
        .map(f32::to_bits)
        .collect();
    let mut net: Links<Msg> = Links::new(seed);
    let mut now = Duration::ZERO;
    let mut restarted = false;
    let mut steps = 0u64;
    while !ranks.iter().flatten().all(|w| w.coll().is_complete()) {
        steps += 1;
        assert!(steps < 5_000_000, "hang at {now:?}");
        let at = base + now;
        for (r, ws) in ranks.iter_mut().enumerate() {
            if let Some(e) = ws[0].m.handle_timeout(at) {
                panic!("rank {r} at {now:?}: {e:?}");
            }
            while let Some(t) = ws[0].m.poll_control(at) {
                let bytes = t.bytes().to_vec();
                net.send(faults, now, || Msg::ToSwitch {
                    rank: r as u16,
                    bytes: bytes.clone(),
                });
            }
            for w in ws.iter_mut() {
                assert!(w.m.poll_control(at).is_none(), "a lane member sent control");
                while let Some((_, bytes)) = w.poll_data(at) {
                    net.send(faults, now, || Msg::ToSwitch {
                        rank: r as u16,
                        bytes: bytes.clone(),
                    });
                }
            }
        }
        let timers = ranks.iter().flatten().map(|w| w.m.poll_timeout());
        let next = net
            .next_delivery()
            .into_iter()
            .chain(timers.flatten().map(|t| t - base))
            .min()
            .expect("something in flight or due");
        now = now.max(next);
        if !restarted && ranks[0][0].coll().oldest_unacked_seq() >= restart_after {
            restarted = true;
            assert!(!ranks.iter().flatten().any(|w| w.coll().is_complete()));
            sw = switch(2, n, elems, 16, AuthMode::Port, base + now);
        }
        while let Some(m) = net.pop_due(now) {
            match m {
                Msg::ToSwitch { rank, bytes } => {
                    to_switch(&sw, &mut net, faults, now, base + now, rank, &bytes)
                }
                Msg::ToWorker { rank, port, bytes } => {
                    let ws = &mut ranks[rank as usize];
                    // By source port: RESULTs by lane, the rest (from P) to
                    // the joined member.
                    let t = share_of(&bytes, port, threads);
                    match ws[t].m.handle(&bytes, base + now) {
                        None => {}
                        Some(Event::Rejoining(_)) => {
                            // Rejoin from the oldest unanswered seq of all
                            // shares; the lane members stop.
                            let oldest = ws
                                .iter()
                                .map(|w| w.coll().oldest_unacked_seq())
                                .min_by_key(|&s| serial_offset(0, s))
                                .unwrap();
                            ws[0].m.start_join(0, oldest, base + now);
                            for w in &mut ws[1..] {
                                w.m.start_join(0, oldest, base + now);
                                assert!(!w.m.is_joined(), "a lane member idles");
                            }
                        }
                        Some(Event::Joined(j)) => {
                            assert!(!j.first);
                            assert!(j.lane_replies, "the rejoin asked again");
                            let (control, lanes) = ws.split_first_mut().unwrap();
                            control.m.restart_from(j.seq);
                            for w in lanes {
                                w.m.follow(&control.m);
                                assert!(w.m.lane_replies());
                                w.m.restart_from(j.seq);
                            }
                        }
                        Some(Event::Result {
                            outcome, values, ..
                        }) => ws[t].take(&outcome, &bytes[values]),
                        Some(e) => panic!("rank {rank}: {e:?}"),
                    }
                }
            }
        }
    }
    let mut rejoins = 0;
    for (r, ws) in ranks.iter().enumerate() {
        let out: Vec<u32> = (0..len)
            .map(|i| ws[((i / usize::from(elems)) as u32 % threads) as usize].output[i].to_bits())
            .collect();
        assert_eq!(out, want, "rank {r}, T = {threads}: not the rank-order sum");
        for w in ws {
            assert_eq!(w.m.session().gen(), 2, "rank {r}: on the new switch");
        }
        rejoins += ws[0].m.session().stats().rejoins;
    }
    rejoins
}

#[test]
fn a_switch_restart_mid_collective_is_rejoined_by_every_thread() {
    for (threads, seed) in [(2, 5), (2, 6), (4, 7)] {
        let rejoins = run_with_restart(3, threads, 3000, 16, ALL_FAULTS, seed, 40);
        assert!(
            rejoins >= 3,
            "T = {threads}: every rank rejoined once: {rejoins}"
        );
    }
}
