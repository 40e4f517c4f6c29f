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
//! The straggler hold runs on every share, as the worker's threads run it
//! (through different plumbing: the worker's `threads::Progress` words,
//! tested in worker/tests/threads.rs). A lane member's probe
//! (`Member::take_probe`) is sent by the joined member's session
//! (`Member::ask_about`); the answer reaches the joined member (it comes
//! from P), which gives it back for another share's seq
//! (`Event::ShareProbeAnswer`), and the member of that share takes it
//! (`Member::on_probe_answer`). One run makes a rank start each collective
//! late.
//!
//! What must hold:
//! * every rank's output is the rank-order sum, bit for bit, for T = 1, 2
//!   and 4;
//! * with a straggler, the other ranks' threads resend a tenth or less of
//!   what they resend without the hold, and no rank sends more HEARTBEATs
//!   than its shares' probes;
//! * each member sends only its own seqs and never gets a RESULT that is
//!   not its own;
//! * a RESULT comes from P + (s mod L), every other reply from P;
//! * each member writes only its own chunks.

use std::time::{Duration, Instant};

use proto::member::{Event, Member, MemberStats, ResultOutcome, Shape, TransportConfig};
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
/// share t of T; the straggler hold on or off (`hold`), the lane members'
/// probes relayed through share 0's.
fn join_all(switch: &Switch, n: u16, threads: u32, hold: bool, now: Instant) -> Vec<Vec<Member>> {
    let cfg = TransportConfig {
        straggler_hold: hold,
        ..transport()
    };
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
                cfg,
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
            let mut ms: Vec<Member> = (1..threads)
                .map(|t| {
                    let mut lane = m.lane(t, threads);
                    lane.relay_probes(true);
                    lane
                })
                .collect();
            assert!(ms.iter().all(Member::lane_replies));
            ms.insert(0, m);
            ms
        })
        .collect()
}

/// A rank that starts each collective late (a slow GPU): it sends nothing
/// of collective `it` before `late[it % 4]` after the collective began,
/// and its datagrams leave `gap` apart (paced, as one sender's are).
#[derive(Debug, Clone, Copy)]
struct Straggler {
    rank: u16,
    late: [Duration; 4],
    gap: Duration,
}

/// One run: `iterations` all-reduces of `len` elements over `n` ranks of
/// `threads` members each, chunks of `elems`, `slots` slots, links with
/// `faults` (schedule `seed`), a job of `auth`; `straggler` late each
/// collective; the members' straggler hold on or off (`hold`).
#[derive(Debug, Clone, Copy)]
struct Sim {
    n: u16,
    threads: u32,
    len: usize,
    elems: u16,
    slots: u16,
    iterations: u32,
    faults: Faults,
    seed: u64,
    auth: AuthMode,
    straggler: Option<Straggler>,
    hold: bool,
}

impl Sim {
    /// No straggler; the hold on.
    #[allow(clippy::too_many_arguments)]
    fn new(
        n: u16,
        threads: u32,
        len: usize,
        elems: u16,
        slots: u16,
        iterations: u32,
        faults: Faults,
        seed: u64,
        auth: AuthMode,
    ) -> Sim {
        Sim {
            n,
            threads,
            len,
            elems,
            slots,
            iterations,
            faults,
            seed,
            auth,
            straggler: None,
            hold: true,
        }
    }
}

/// What one run did: every rank's outputs of the last iteration, each
/// member's counters (`stats[rank][share]`), each rank's HEARTBEATs sent
/// (by share 0's session, for every share) and each collective's virtual
/// time.
struct Ran {
    outputs: Vec<Vec<u32>>,
    stats: Vec<Vec<MemberStats>>,
    heartbeats: Vec<u64>,
    times: Vec<Duration>,
}

impl Ran {
    /// Chunks every member of every rank resent.
    fn resent(&self) -> u64 {
        self.stats.iter().flatten().map(|s| s.chunks.resent).sum()
    }
}

/// Runs `sim`; returns what it did. Panics on a wrong bit, a misrouted or
/// foreign RESULT, or a hang.
fn simulate(sim: Sim) -> Ran {
    let Sim {
        n,
        threads,
        len,
        elems,
        slots,
        iterations,
        faults,
        seed,
        auth,
        straggler,
        hold,
    } = sim;
    let base = Instant::now();
    let switch = switch(GEN, n, elems, slots, auth, base);
    // ranks[r][t]: rank r's member of share t.
    let mut ranks: Vec<Vec<Worker>> = join_all(&switch, n, threads, hold, base)
        .into_iter()
        .map(|ms| ms.into_iter().map(|m| Worker::new(m, Dtype::F32)).collect())
        .collect();
    let mut net: Links<Msg> = Links::new(seed);
    let mut now = Duration::ZERO;
    let mut seq = 0u32;
    let mut last = Vec::new();
    let mut times = Vec::new();
    // When the straggler's link is free again.
    let mut link_free = Duration::ZERO;
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
        let began = now;
        // A late rank sends nothing before this.
        let starts = straggler.map(|s| (s.rank, began + s.late[it as usize % 4]));
        let mut steps = 0u64;
        while !ranks.iter().flatten().all(|w| w.coll().is_complete()) {
            steps += 1;
            assert!(steps < 5_000_000, "hang: iteration {it}");
            for (r, ws) in ranks.iter_mut().enumerate() {
                if starts.is_some_and(|(late, at)| usize::from(late) == r && now < at) {
                    continue;
                }
                let mut leave = || match straggler {
                    Some(s) if usize::from(s.rank) == r => {
                        let at = now.max(link_free);
                        link_free = at + s.gap;
                        at
                    }
                    _ => now,
                };
                for t in 0..ws.len() {
                    let w = &mut ws[t];
                    while let Some((h, bytes)) = w.poll_data(base + now) {
                        assert_eq!(
                            h.seq % threads,
                            t as u32,
                            "rank {r}: share {t} sent seq {}",
                            h.seq
                        );
                        net.send(faults, leave(), || Msg::ToSwitch {
                            rank: r as u16,
                            bytes: bytes.clone(),
                        });
                    }
                    // A lane member's probe goes out through share 0's
                    // session, as thread 0 sends a lane thread's.
                    if let Some(probe) = w.m.take_probe() {
                        assert_ne!(t, 0, "share 0's probes go out by itself");
                        assert_eq!(probe % threads, t as u32);
                        ws[0].m.ask_about(probe);
                    }
                }
                // The straggler hold's probes (HEARTBEATs), every share's.
                while let Some(c) = ws[0].m.poll_control(base + now) {
                    assert_eq!(c.msg_type, MsgType::Heartbeat);
                    let bytes = c.bytes().to_vec();
                    net.send(faults, leave(), || Msg::ToSwitch {
                        rank: r as u16,
                        bytes: bytes.clone(),
                    });
                }
            }
            let next_timer = ranks
                .iter()
                .flatten()
                .filter_map(|w| w.coll().next_timeout())
                .map(|t| t - base)
                .chain(starts.map(|(_, at)| at).filter(|&at| at > now))
                .min();
            now = now.max(common::next_event(net.next_delivery(), next_timer));
            while let Some(m) = net.pop_due(now) {
                match m {
                    Msg::ToSwitch { rank, bytes } => {
                        to_switch(&switch, &mut net, faults, now, base + now, rank, &bytes)
                    }
                    Msg::ToWorker { rank, port, bytes } => {
                        // The lane port's socket: its share's member.
                        let seq = u32::from_be_bytes(bytes[8..12].try_into().unwrap());
                        let ws = &mut ranks[rank as usize];
                        let w = &mut ws[share_of(&bytes, port, threads)];
                        let (outcome, v) = match w.m.handle(&bytes, base + now) {
                            Some(Event::Result {
                                outcome, values, ..
                            }) => (outcome, values),
                            // Share 0's own probe's answer, taken.
                            None if bytes[0] & 0x0f == MsgType::Heartbeat as u8 => continue,
                            // A lane's: to the member of its seq's share.
                            Some(Event::ShareProbeAnswer { seq, answer }) => {
                                let t = (seq % threads) as usize;
                                assert_ne!(t, 0);
                                ws[t].m.on_probe_answer(seq, answer, base + now);
                                continue;
                            }
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
        times.push(now - began);
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
            }
        }
        seq = ranks[0][0].coll().end_seq();
        assert!(ranks.iter().flatten().all(|w| w.coll().end_seq() == seq));
    }
    Ran {
        outputs: last,
        stats: ranks
            .iter()
            .map(|ws| ws.iter().map(|w| w.m.stats()).collect())
            .collect(),
        heartbeats: ranks
            .iter()
            .map(|ws| ws[0].m.session().stats().heartbeats_sent)
            .collect(),
        times,
    }
}

/// [`simulate`] with no straggler and the hold on: every rank's outputs of
/// the last iteration and how many chunks all members resent.
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
    let ran = simulate(Sim::new(
        n, threads, len, elems, slots, iterations, faults, seed, auth,
    ));
    let resent = ran.resent();
    (ran.outputs, resent)
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

/// Four collectives of 256 chunks of 256 elements over 4 ranks of
/// `threads` members each on clean links; rank 1 starts each 50–200 ms
/// late, its datagrams 50 µs apart (as in simulated_network's straggler);
/// the hold on or off.
fn straggle(threads: u32, hold: bool) -> Ran {
    let late = [50, 200, 120, 80].map(Duration::from_millis);
    let gap = Duration::from_micros(50);
    simulate(Sim {
        straggler: Some(Straggler { rank: 1, late, gap }),
        hold,
        ..Sim::new(4, threads, 256 * 256, 256, 64, 4, CLEAN, 7, AuthMode::Port)
    })
}

/// The other ranks' (all but rank 1's) counters, summed over `shares` of
/// each: (resent, probes, held timeouts).
fn others(ran: &Ran, shares: std::ops::Range<usize>) -> (u64, u64, u64) {
    let mut t = (0, 0, 0);
    for (r, ms) in ran.stats.iter().enumerate() {
        if r == 1 {
            continue;
        }
        for s in &ms[shares.clone()] {
            t.0 += s.chunks.resent;
            t.1 += s.chunks.probes;
            t.2 += s.chunks.held_timeouts;
        }
    }
    t
}

/// A straggler costs the other ranks' threads no resends: every share
/// holds, lane shares too. Each lane member's probe goes out through share
/// 0's session, the answer comes back to share 0's member and is handed to
/// the member of the seq's share. Without the lanes' hold (share 0's
/// only) the lanes resend at every timeout, and the bound fails.
/// Measured (ranks 0, 2 and 3, every share, 4 collectives): T = 2, 3 934
/// resends without the hold, 139 with it (1 205 with share 0's hold only);
/// T = 4, 6 084 and 272. Every sum bit-exact (`simulate` checks each
/// rank's output); no more HEARTBEATs than the shares' probes; no slower.
#[test]
fn a_straggler_costs_the_other_ranks_threads_no_resends() {
    for threads in [2u32, 4] {
        let t = threads as usize;
        let off = straggle(threads, false);
        let on = straggle(threads, true);
        let (before, after) = (others(&off, 0..t), others(&on, 0..t));
        let lanes = others(&on, 1..t);
        eprintln!(
            "T = {threads}: the others resent {before:?} without the hold, {after:?} with it, \
             {lanes:?} of it on lane shares (resent, probes, held)"
        );
        assert!(
            after.0 * 10 <= before.0,
            "T = {threads}: the others resent {} chunks with the hold, {} without",
            after.0,
            before.0
        );
        // The lane shares asked, and held.
        assert!(lanes.1 > 0 && lanes.2 > 0, "T = {threads}: {lanes:?}");
        assert_eq!(before.1 + before.2, 0, "no probes without the hold");
        // Share 0's session sent a HEARTBEAT per probe of any share, no
        // more (nothing else asks here: no stall watch runs).
        for (r, ms) in on.stats.iter().enumerate() {
            let probes: u64 = ms.iter().map(|s| s.chunks.probes).sum();
            assert!(
                on.heartbeats[r] <= probes,
                "rank {r}: {} HEARTBEATs for {probes} probes",
                on.heartbeats[r]
            );
        }
        assert!(off.heartbeats.iter().all(|&h| h == 0));
        // No slower: the straggler sets the pace.
        let (t_off, t_on): (Duration, Duration) = (off.times.iter().sum(), on.times.iter().sum());
        assert!(
            t_on <= t_off + t_off / 10,
            "T = {threads}: {t_on:?} with the hold, {t_off:?} without"
        );
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
    let mut ranks: Vec<Vec<Worker>> = join_all(&sw, n, threads, true, base)
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
            for t in 0..ws.len() {
                let w = &mut ws[t];
                assert!(
                    t == 0 || w.m.poll_control(at).is_none(),
                    "a lane member sent control"
                );
                while let Some((_, bytes)) = w.poll_data(at) {
                    net.send(faults, now, || Msg::ToSwitch {
                        rank: r as u16,
                        bytes: bytes.clone(),
                    });
                }
                // Sent by share 0's session at the next step.
                if let Some(probe) = w.m.take_probe() {
                    ws[0].m.ask_about(probe);
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
                        Some(Event::ShareProbeAnswer { seq, answer }) => ws
                            [(seq % threads) as usize]
                            .m
                            .on_probe_answer(seq, answer, base + now),
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
