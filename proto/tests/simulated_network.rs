//! Workers and a switch exchanging messages over a simulated network that
//! loses, duplicates and reorders, in virtual time: every schedule must give
//! every worker the rank-order sum, bit for bit, without hanging. Float32
//! jobs and bf16/f16 jobs (inputs in the dtype, the sum rounded once), with
//! and without per-packet tags (`auth = "mac"`: every DATA tagged, every
//! RESULT's tag checked). Each worker joins, builds its DATA headers and
//! accepts RESULTs through `proto::member::Member`, as the worker library does;
//! one run sends the joins over the faulty links too and restarts the
//! switch, so that finding the restart and rejoining are simulated as well.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proto::elements::round_f32;
use proto::member::{Event, Member, Shape};
use proto::reference::rank_order_sum;
use proto::session::SessionConfig;
use proto::switch::entry::Switch;
use proto::switch::{Endpoint, JobTable};
use proto::tag::AuthMode;
use proto::wire::{Dtype, HEADER_LEN};

mod common;
use common::{join_lossless_as, join_params, Faults, Links, Paths, Worker, ALL_FAULTS, CLEAN};

const GEN: u32 = 99;

enum Msg {
    /// What `rank` sent to the switch: an encoded DATA.
    ToSwitch { rank: u16, bytes: Vec<u8> },
    /// What the switch sent to `rank`: an encoded message.
    ToWorker { rank: u16, bytes: Vec<u8> },
}

/// Rank `rank` starts joining through its session (on a lossless path:
/// loss during joining is the session's tests'); its JOIN_ACK comes when
/// every rank has joined.
fn join(
    table: &mut JobTable,
    rank: u16,
    n: u16,
    start_seq: u32,
    (dtype, hold): (Dtype, bool),
    now: Instant,
) -> Member {
    let from = endpoint(rank);
    let params = join_params(1, n, dtype, [3; 32], rank, &from);
    let cfg = proto::member::TransportConfig {
        straggler_hold: hold,
        ..common::transport()
    };
    join_lossless_as(
        table,
        from,
        params,
        [rank as u8; 32],
        start_seq,
        now,
        cfg,
        |_| {},
    )
}

fn endpoint(rank: u16) -> Endpoint {
    common::endpoint(rank, 1000)
}

/// A job table of generation `gen` with job 1 (f32, port auth).
fn job_table(gen: u32, n: u16, elems: u16, slots: u16, now: Instant) -> JobTable {
    common::job_table(gen, n, elems, slots, (Dtype::F32, AuthMode::Port), now)
}

/// `bytes` from `rank` reach the switch (on the thread that owns the
/// rank's socket) at virtual time `now` after `base`; its replies go back
/// over `net`; how a DATA was taken is counted in `paths`.
fn at_switch(
    (switch, paths): (&Switch, &mut Paths),
    net: &mut Links<Msg>,
    faults: Faults,
    rank: u16,
    bytes: &[u8],
    (base, now): (Instant, Duration),
) {
    at_switch_slowed((switch, paths), net, faults, None, rank, bytes, (base, now))
}

/// Rank `rank`'s RESULTs take `extra` longer from collective `from` on: a
/// queue that builds behind a bottleneck on its way after the RTO settled
/// at its floor.
#[derive(Debug, Clone, Copy)]
struct SlowPath {
    rank: u16,
    from: u32,
    extra: Duration,
}

/// As [`at_switch`], the replies to `slow`'s rank (if any) delayed.
fn at_switch_slowed(
    (switch, paths): (&Switch, &mut Paths),
    net: &mut Links<Msg>,
    faults: Faults,
    slow: Option<(u16, Duration)>,
    rank: u16,
    bytes: &[u8],
    (base, now): (Instant, Duration),
) {
    let thread = common::thread_of(rank);
    let h = common::at_switch(
        switch,
        thread,
        bytes,
        endpoint(rank),
        base + now,
        |rank, b| {
            let extra = match slow {
                Some((r, extra)) if r == rank => extra,
                _ => Duration::ZERO,
            };
            net.send(faults, now + extra, || Msg::ToWorker {
                rank,
                bytes: b.to_vec(),
            })
        },
    );
    paths.count(bytes, h);
}

/// Runs `iterations` collectives of `len` elements over `n` workers; returns
/// the virtual time taken. Panics on a wrong bit or a hang.
fn run(
    n: u16,
    len: usize,
    elems: u16,
    slots: u16,
    iterations: u32,
    faults: Faults,
    seed: u64,
) -> Duration {
    simulate(Sim::new(n, len, elems, slots, iterations, faults, seed)).time
}

/// A rank whose DATA comes late to the switch, so that every other rank's
/// chunks wait for it with their own DATA already in the slots: `rank`
/// starts collective `it` `late[it mod 4]` after the others (a slow GPU;
/// it sends nothing before), and its datagrams to the switch pass a link
/// that carries one per `gap` (a slow link: its DATA trickles in, a slot
/// at a time).
#[derive(Debug, Clone, Copy)]
struct Straggler {
    rank: u16,
    late: [Duration; 4],
    gap: Duration,
}

/// One simulated run: `iterations` collectives of `len` elements over `n`
/// workers joined at `start_seq`, `slots` slots of `elems` per chunk, links
/// with `faults` (schedule `seed`), a job of `dtype` and `auth`; `slow`'s
/// RESULTs delayed; `straggler`'s DATA late; the members' straggler hold
/// on or off (`hold`); `drop_data`: the first copy of each DATA of (rank,
/// seq) listed is lost.
#[derive(Debug, Clone, Copy)]
struct Sim {
    start_seq: u32,
    n: u16,
    len: usize,
    elems: u16,
    slots: u16,
    iterations: u32,
    faults: Faults,
    seed: u64,
    dtype: Dtype,
    auth: AuthMode,
    slow: Option<SlowPath>,
    straggler: Option<Straggler>,
    hold: bool,
    drop_data: &'static [(u16, u32)],
}

impl Sim {
    /// A float32 job without tags, joined at seq 0, nothing delayed.
    fn new(
        n: u16,
        len: usize,
        elems: u16,
        slots: u16,
        iterations: u32,
        faults: Faults,
        seed: u64,
    ) -> Sim {
        Sim {
            start_seq: 0,
            n,
            len,
            elems,
            slots,
            iterations,
            faults,
            seed,
            dtype: Dtype::F32,
            auth: AuthMode::Port,
            slow: None,
            straggler: None,
            hold: true,
            drop_data: &[],
        }
    }
}

/// What one run did: its virtual time, how the switch took the DATA, each
/// rank's resends per collective, each rank's counters at the end, and
/// each collective's virtual time.
struct Run {
    time: Duration,
    paths: Paths,
    resent: Vec<Vec<u64>>,
    stats: Vec<proto::member::MemberStats>,
    times: Vec<Duration>,
}

/// Runs `sim`; panics on a wrong bit or a hang.
fn simulate(sim: Sim) -> Run {
    let Sim {
        start_seq,
        n,
        len,
        elems,
        slots,
        iterations,
        faults,
        seed,
        dtype,
        auth,
        slow,
        straggler,
        hold,
        drop_data,
    } = sim;
    let mut times = Vec::new();
    // Copies of (rank, seq) DATA already dropped (`drop_data`).
    let mut dropped: Vec<(u16, u32)> = Vec::new();
    // When a trickling rank's link is free again.
    let mut link_free = Duration::ZERO;
    let mut resent = vec![Vec::new(); n as usize];
    let base = Instant::now();
    let switch = Switch::new(common::job_table(GEN, n, elems, slots, (dtype, auth), base));
    let mut paths = Paths::default();
    let mut sessions: Vec<Member> = (0..n)
        .map(|r| join(&mut switch.table(), r, n, start_seq, (dtype, hold), base))
        .collect();
    // Every rank's JOIN_ACK, its tag checked by the session.
    let mut table = switch.table();
    while let Some(r) = table.poll_reply() {
        let mut b = [0u8; 128];
        let e = table.encode(&r, &mut b).unwrap();
        match sessions[r.rank as usize].handle(&b[..e.len], base) {
            Some(Event::Joined(j)) => {
                assert_eq!((j.auth, j.gen, j.seq), (auth, GEN, start_seq));
                assert_eq!(j.data_key.is_some(), auth == AuthMode::Mac);
            }
            other => panic!("rank {}: no JOIN_ACK: {other:?}", r.rank),
        }
    }
    drop(table);
    assert!(sessions.iter().all(|s| s.is_joined()));
    let mut net: Links<Msg> = Links::new(seed);
    let mut now = Duration::ZERO;
    let mut seq = start_seq;
    let mut workers: Vec<Worker> = sessions
        .into_iter()
        .map(|m| Worker::new(m, dtype))
        .collect();
    for it in 0..iterations {
        for (r, w) in workers.iter_mut().enumerate() {
            w.input = (0..len)
                .map(|i| proto::reference::pattern_dtype(dtype, r as u16, it, i))
                .collect();
            w.output = vec![f32::NAN; len];
            w.begin(it, seq, Shape::all_reduce(len));
        }
        let inputs: Vec<&[f32]> = workers.iter().map(|w| &w.input[..]).collect();
        // Half-precision inputs widen exactly; the switch rounds the float32
        // rank-order sum once.
        let want: Vec<f32> = rank_order_sum(&inputs)
            .into_iter()
            .map(|v| round_f32(dtype, v))
            .collect();
        let slowed = slow.filter(|s| it >= s.from).map(|s| (s.rank, s.extra));
        let began = now;
        // A late rank sends nothing before this.
        let starts = straggler.map(|s| (s.rank, began + s.late[it as usize % 4]));
        let mut steps = 0u64;
        while !workers.iter().all(|w| w.coll().is_complete()) {
            steps += 1;
            assert!(steps < 5_000_000, "hang: iteration {it}");
            for (r, w) in workers.iter_mut().enumerate() {
                let r = r as u16;
                if starts.is_some_and(|(late, at)| late == r && now < at) {
                    continue;
                }
                let mut out = Vec::new();
                while let Some((h, bytes)) = w.poll_data(base + now) {
                    if drop_data.contains(&(r, h.seq)) && !dropped.contains(&(r, h.seq)) {
                        dropped.push((r, h.seq));
                        continue;
                    }
                    out.push(bytes);
                }
                // The straggler hold's probes (HEARTBEATs).
                while let Some(t) = w.m.poll_control(base + now) {
                    out.push(t.bytes().to_vec());
                }
                for bytes in out {
                    let at = match straggler {
                        Some(s) if s.rank == r => {
                            let at = now.max(link_free);
                            link_free = at + s.gap;
                            at
                        }
                        _ => now,
                    };
                    net.send(faults, at, || Msg::ToSwitch {
                        rank: r,
                        bytes: bytes.clone(),
                    });
                }
            }
            // Next event: a delivery, a worker timeout or a late start.
            let next_timer = workers
                .iter()
                .filter_map(|w| w.coll().next_timeout())
                .map(|t| t - base)
                .chain(starts.map(|(_, at)| at).filter(|&at| at > now))
                .min();
            now = now.max(common::next_event(net.next_delivery(), next_timer));
            while let Some(m) = net.pop_due(now) {
                match m {
                    Msg::ToSwitch { rank, bytes } => at_switch_slowed(
                        (&switch, &mut paths),
                        &mut net,
                        faults,
                        slowed,
                        rank,
                        &bytes,
                        (base, now),
                    ),
                    Msg::ToWorker { rank, bytes } => {
                        let w = &mut workers[rank as usize];
                        let heartbeat =
                            proto::wire::Header::new_checked(&bytes[..]).is_ok_and(|h| {
                                h.msg_type_raw() == proto::wire::MsgType::Heartbeat as u8
                            });
                        // Only RESULTs and HEARTBEAT answers in this run,
                        // each of them authentic.
                        let (outcome, v) = match w.m.handle(&bytes, base + now) {
                            Some(Event::Result {
                                outcome, values, ..
                            }) => (outcome, values),
                            None if heartbeat => continue,
                            other => panic!(
                                "rank {rank}: the member did not take header {:?}: {other:?} {:?}",
                                &bytes[..HEADER_LEN.min(bytes.len())],
                                w.m.session().stats()
                            ),
                        };
                        w.take(&outcome, &bytes[v]);
                    }
                }
            }
        }
        for (r, w) in workers.iter().enumerate() {
            let got: Vec<u32> = w.output.iter().map(|x| x.to_bits()).collect();
            let exp: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
            assert_eq!(
                got, exp,
                "rank {r} iteration {it}: result differs from the rank-order sum"
            );
        }
        for (r, w) in workers.iter().enumerate() {
            resent[r].push(w.coll().stats.resent);
        }
        seq = workers[0].coll().end_seq();
        times.push(now - began);
    }
    Run {
        time: now,
        paths,
        resent,
        stats: workers.iter().map(|w| w.m.stats()).collect(),
        times,
    }
}

/// The simulations run the path real DATA takes: with loss, duplication
/// and reordering, on two threads, nearly every DATA is taken by the
/// lock-free data path (the table sees only what comes before the job is
/// active, or what the data path hands back), and the sums stay bit-exact
/// (`simulate` checks every rank's output). A simulation that only
/// reached the table fails here.
#[test]
fn simulated_data_takes_the_lock_free_path() {
    for (dtype, seed) in [(Dtype::F32, 42), (Dtype::Bf16, 43)] {
        let paths = simulate(Sim {
            dtype,
            ..Sim::new(4, 2000, 16, 16, 3, ALL_FAULTS, seed)
        })
        .paths;
        let all = paths.lock_free + paths.table;
        assert!(all > 4 * 3 * 2000 / 16, "{dtype:?}: {paths:?}");
        assert!(paths.lock_free * 100 >= all * 99, "{dtype:?}: {paths:?}");
    }
    // An `auth = "mac"` job's DATA needs the table (its tags): all of it.
    let paths = simulate(Sim {
        auth: AuthMode::Mac,
        ..Sim::new(2, 200, 16, 16, 1, ALL_FAULTS, 9)
    })
    .paths;
    assert!(paths.lock_free == 0 && paths.table > 0, "{paths:?}");
}

#[test]
fn clean_network_small_and_partial_chunks() {
    for len in [1usize, 7, 8, 9, 100] {
        run(4, len, 8, 4, 3, CLEAN, 1);
    }
}

#[test]
fn all_faults_at_once() {
    run(4, 2000, 16, 16, 3, ALL_FAULTS, 42);
}

#[test]
fn half_precision_jobs_under_all_faults() {
    for (dtype, seed) in [(Dtype::Bf16, 7), (Dtype::F16, 8)] {
        simulate(Sim {
            dtype,
            ..Sim::new(4, 2000, 32, 16, 3, ALL_FAULTS, seed)
        });
    }
}

#[test]
fn tagged_jobs_under_all_faults() {
    // auth = "mac": every DATA tagged, every RESULT (resends included,
    // with RETX and each member's rank) verified under the one RESULT key.
    for (dtype, seed) in [(Dtype::F32, 11), (Dtype::Bf16, 12)] {
        simulate(Sim {
            dtype,
            auth: AuthMode::Mac,
            ..Sim::new(4, 2000, 16, 16, 3, ALL_FAULTS, seed)
        });
    }
}

#[test]
fn seq_numbers_wrap() {
    // Workers join at a resume point just below 2^32: chunks cross the wrap.
    let faults = Faults {
        loss: 0.1,
        dup: 0.05,
        reorder: 0.3,
    };
    simulate(Sim {
        start_seq: u32::MAX - 50,
        ..Sim::new(3, 40, 1, 4, 3, faults, 7)
    });
}

#[test]
fn loss_costs_time_in_proportion_not_a_fixed_worst_case() {
    // Over a few schedules: one seed's lost RESULT may wait out a whole
    // timeout, which says little about the proportion.
    let (mut clean, mut lossy) = (Duration::ZERO, Duration::ZERO);
    for seed in 1..=24 {
        clean += run(4, 4000, 16, 32, 1, CLEAN, seed);
        lossy += run(
            4,
            4000,
            16,
            32,
            1,
            Faults {
                loss: 0.05,
                dup: 0.0,
                reorder: 0.0,
            },
            seed,
        );
        eprintln!("seed {seed}: clean {clean:?}, 5 % loss {lossy:?} (sums)");
    }
    assert!(lossy < clean * 5, "lossy {lossy:?} vs clean {clean:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
    #[test]
    fn any_schedule_yields_the_reference_sums(
        seed in any::<u64>(),
        n in 1u16..6,
        len in 1usize..300,
        elems in 1u16..20,
        slots_log in 0u32..5,
        loss in 0.0f64..0.2,
        dup in 0.0f64..0.1,
        reorder in 0.0f64..0.5,
        dtype in 0u8..3,
    ) {
        let dtype = Dtype::from_u8(dtype).unwrap();
        let faults = Faults { loss, dup, reorder };
        simulate(Sim {
            dtype,
            ..Sim::new(n, len, elems, 1 << slots_log, 2, faults, seed)
        });
    }
}

/// When the switch restarts in [`run_with_restart`].
#[derive(Debug, Clone, Copy)]
enum RestartAt {
    Never,
    /// At this virtual time (joins may still be under way).
    Time(Duration),
    /// Once rank 0 has this many chunks answered.
    Chunks(u32),
}

/// One all-reduce in which everything goes over the faulty network, the
/// join included, and the switch restarts (a new generation, no sessions)
/// at `restart`: every worker must notice through its session (the new
/// switch's untagged NACK makes it probe; the CHALLENGE shows the new
/// generation), join again over the lossy links from its oldest unanswered
/// chunk, and still get the rank-order sum bit for bit. Returns each
/// worker's session counters.
fn run_with_restart(
    n: u16,
    len: usize,
    elems: u16,
    slots: u16,
    faults: Faults,
    seed: u64,
    restart: RestartAt,
) -> (Vec<proto::session::SessionStats>, Paths) {
    let base = Instant::now();
    let mut switch = Switch::new(job_table(1, n, elems, slots, base));
    let mut paths = Paths::default();
    let cfg = common::transport();
    let scfg = SessionConfig {
        join_timeout: Duration::from_secs(20),
        stall_timeout: Duration::from_secs(20),
    };
    let mut net: Links<Msg> = Links::new(seed);
    let mut workers: Vec<Worker> = (0..n)
        .map(|rank| {
            let from = endpoint(rank);
            let params = join_params(1, n, Dtype::F32, [3; 32], rank, &from);
            let mut m = Member::new(params, scfg, cfg, [rank as u8 + 40; 32]);
            m.start_join(0, 0, base);
            let mut w = Worker::new(m, Dtype::F32);
            w.input = (0..len)
                .map(|i| proto::reference::pattern_dtype(Dtype::F32, rank, 0, i))
                .collect();
            w.output = vec![f32::NAN; len];
            w
        })
        .collect();
    let inputs: Vec<&[f32]> = workers.iter().map(|w| &w.input[..]).collect();
    let want: Vec<u32> = rank_order_sum(&inputs)
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let mut now = Duration::ZERO;
    let mut restarted = false;
    let mut steps = 0u64;
    // The collective begins at the first JOIN_ACK (which tells E): until
    // then the member's is the empty one.
    let done = |w: &Worker| w.coll().n_chunks() > 0 && w.coll().is_complete();
    while !workers.iter().all(done) {
        steps += 1;
        assert!(steps < 5_000_000, "hang at {now:?}");
        let at = base + now;
        for (r, w) in workers.iter_mut().enumerate() {
            match w.m.handle_timeout(at) {
                None => {}
                Some(e) => panic!("rank {r} at {now:?}: {e:?} {:?}", w.m.session().stats()),
            }
            while let Some(t) = w.m.poll_control(at) {
                let bytes = t.bytes().to_vec();
                net.send(faults, now, || Msg::ToSwitch {
                    rank: r as u16,
                    bytes: bytes.clone(),
                });
            }
            while let Some((_, bytes)) = w.poll_data(at) {
                net.send(faults, now, || Msg::ToSwitch {
                    rank: r as u16,
                    bytes: bytes.clone(),
                });
            }
        }
        // Next event: a delivery, a worker's timer, a session's, the restart.
        let timers = workers.iter().map(|w| w.m.poll_timeout());
        let next = net
            .next_delivery()
            .into_iter()
            .chain(timers.flatten().map(|t| t - base))
            .chain(match restart {
                RestartAt::Time(t) if !restarted => Some(t),
                _ => None,
            })
            .min()
            .expect("something in flight or due");
        now = now.max(next);
        let due = match restart {
            RestartAt::Never => false,
            RestartAt::Time(t) => now >= t,
            RestartAt::Chunks(k) => workers[0].coll().oldest_unacked_seq() >= k,
        };
        if !restarted && due {
            restarted = true;
            assert!(
                workers.iter().all(|w| !done(w)),
                "restart_at is too late: a worker already finished"
            );
            switch = Switch::new(job_table(2, n, elems, slots, base + now));
        }
        while let Some(m) = net.pop_due(now) {
            match m {
                Msg::ToSwitch { rank, bytes } => at_switch(
                    (&switch, &mut paths),
                    &mut net,
                    faults,
                    rank,
                    &bytes,
                    (base, now),
                ),
                Msg::ToWorker { rank, bytes } => {
                    let w = &mut workers[rank as usize];
                    match w.m.handle(&bytes, base + now) {
                        // The member started the rejoin itself.
                        None | Some(Event::Rejoining(_)) => {}
                        Some(Event::Joined(j)) => {
                            assert_eq!(j.collective, 0);
                            if j.first {
                                w.begin(0, 0, Shape::all_reduce(len));
                            }
                            // The job's resume point: every rank resends
                            // from there (results come again, identical).
                            w.m.restart_from(j.seq);
                        }
                        Some(Event::Result {
                            outcome, values, ..
                        }) => w.take(&outcome, &bytes[values]),
                        Some(e) => panic!("rank {rank}: {e:?}"),
                    }
                }
            }
        }
    }
    for (r, w) in workers.iter().enumerate() {
        let got: Vec<u32> = w.output.iter().map(|x| x.to_bits()).collect();
        assert_eq!(got, want, "rank {r}: not the rank-order sum");
        assert_eq!(w.m.session().gen(), if restarted { 2 } else { 1 });
    }
    let stats = workers.iter().map(|w| w.m.session().stats()).collect();
    (stats, paths)
}

#[test]
fn a_switch_restart_mid_collective_is_found_and_rejoined_over_lossy_links() {
    // Joins over lossy links too (HELLO, JOIN and JOIN_ACK resent).
    let (calm, _) = run_with_restart(4, 3000, 16, 16, ALL_FAULTS, 5, RestartAt::Never);
    assert!(calm.iter().all(|s| s.rejoins == 0), "{calm:?}");
    // A restart at 1 ms, while ranks are joining (a lost HELLO waits
    // 200 ms) or just joined: every one ends on generation 2.
    run_with_restart(
        4,
        3000,
        16,
        16,
        ALL_FAULTS,
        5,
        RestartAt::Time(Duration::from_millis(1)),
    );
    // A third of the way through the collective.
    for seed in [5, 6, 7] {
        let (stats, paths) =
            run_with_restart(4, 3000, 16, 16, ALL_FAULTS, seed, RestartAt::Chunks(60));
        // Both generations' DATA mostly on the lock-free path.
        assert!(paths.lock_free > 4 * paths.table, "{paths:?}");
        for (r, s) in stats.iter().enumerate() {
            assert!(s.rejoins >= 1, "rank {r} never rejoined: {s:?}");
            assert!(s.probes_sent >= 1, "rank {r}: found without a probe? {s:?}");
            assert_eq!(s.bad_length_results + s.bad_tag_results, 0, "{s:?}");
        }
    }
}

/// What [`run_windowed`] saw.
struct WindowRun {
    /// DATA the switch dropped as beyond its window in the first collective
    /// (in the second, the first round still goes under the old window).
    beyond_window: u64,
    /// The most chunks any member had in flight in the first collective.
    max_in_flight: u32,
    /// After the switch's RESULTs advertised the smaller window: the
    /// largest window a member then sent under.
    window_after: u16,
}

/// Two all-reduces of 4 ranks, 400 chunks each, on a clean network, against
/// a job with a pool of 16 slots whose declared window is `window`; before
/// the second the switch's window drops to `later`, which its RESULTs
/// advertise. `window_override` makes the members ignore what the switch
/// advertises (the testing knob).
fn run_windowed(window: u16, later: u16, window_override: Option<u16>) -> WindowRun {
    let (n, elems, slots, len) = (4u16, 8u16, 16u16, 400 * 8usize);
    let base = Instant::now();
    let mut table = JobTable::new(proto::switch::TableConfig::new(GEN, [5; 32]), base);
    let mut job = common::job_config(n, elems, slots, (Dtype::F32, AuthMode::Port));
    job.window = window;
    table.add(job, elems + 8).unwrap();
    let switch = Switch::new(table);
    let mut paths = Paths::default();
    let mut table = switch.table();
    let cfg = proto::member::TransportConfig {
        window_override,
        ..common::transport()
    };
    let mut workers: Vec<Worker> = (0..n)
        .map(|r| {
            let from = endpoint(r);
            let params = join_params(1, n, Dtype::F32, [3; 32], r, &from);
            let mut m = Member::new(params, SessionConfig::default(), cfg, [r as u8; 32]);
            m.start_join(0, 0, base);
            let hello = m.poll_control(base).expect("a HELLO");
            table.handle(hello.bytes(), from, false, base);
            let mut b = [0u8; 128];
            let r = table.poll_reply().expect("a CHALLENGE");
            let e = table.encode(&r, &mut b).unwrap();
            assert!(m.handle(&b[..e.len], base).is_none());
            let join = m.poll_control(base).expect("a JOIN");
            table.handle(join.bytes(), from, false, base);
            Worker::new(m, Dtype::F32)
        })
        .collect();
    while let Some(r) = table.poll_reply() {
        let mut b = [0u8; 128];
        let e = table.encode(&r, &mut b).unwrap();
        let w = &mut workers[r.rank as usize].m;
        assert!(matches!(
            w.handle(&b[..e.len], base),
            Some(Event::Joined(_))
        ));
        assert_eq!(w.advertised_window(), window, "the JOIN_ACK's window");
    }
    drop(table);
    let mut net: Links<Msg> = Links::new(5);
    let mut now = Duration::ZERO;
    let mut seq = 0;
    let mut run = WindowRun {
        beyond_window: 0,
        max_in_flight: 0,
        window_after: 0,
    };
    for it in 0..2u32 {
        if it == 1 {
            let mut table = switch.table();
            run.beyond_window = table
                .get(1)
                .unwrap()
                .drops()
                .count(proto::switch::DropReason::BeyondWindow);
            table.get_mut(1).unwrap().set_window(later);
        }
        for (r, w) in workers.iter_mut().enumerate() {
            w.input = (0..len)
                .map(|i| proto::reference::pattern_dtype(Dtype::F32, r as u16, it, i))
                .collect();
            w.output = vec![f32::NAN; len];
            w.begin(it, seq, Shape::all_reduce(len));
        }
        let mut done = vec![false; n as usize];
        while !workers.iter().all(|w| w.coll().is_complete()) {
            for (r, w) in workers.iter_mut().enumerate() {
                while let Some((_, bytes)) = w.poll_data(base + now) {
                    net.send(CLEAN, now, || Msg::ToSwitch {
                        rank: r as u16,
                        bytes: bytes.clone(),
                    });
                }
                if it == 0 {
                    run.max_in_flight = run.max_in_flight.max(w.coll().in_flight());
                }
            }
            let next_timer = workers
                .iter()
                .filter_map(|w| w.coll().next_timeout())
                .min()
                .map(|t| t - base);
            now = now.max(common::next_event(net.next_delivery(), next_timer));
            while let Some(m) = net.pop_due(now) {
                match m {
                    Msg::ToSwitch { rank, bytes } => at_switch(
                        (&switch, &mut paths),
                        &mut net,
                        CLEAN,
                        rank,
                        &bytes,
                        (base, now),
                    ),
                    Msg::ToWorker { rank, bytes } => {
                        let w = &mut workers[rank as usize];
                        let Some(Event::Result {
                            header,
                            outcome,
                            values,
                            completed,
                            ..
                        }) = w.m.handle(&bytes, base + now)
                        else {
                            panic!("rank {rank}: not a RESULT");
                        };
                        w.take(&outcome, &bytes[values]);
                        // Once per collective, with its last RESULT.
                        assert_eq!(completed, w.coll().is_complete() && !done[rank as usize]);
                        done[rank as usize] |= completed;
                        if it == 1 && header.window == later {
                            run.window_after = run.window_after.max(w.m.window());
                        }
                    }
                }
            }
        }
        assert!(
            done.iter().all(|&d| d),
            "every member was told it completed"
        );
        seq = workers[0].coll().end_seq();
    }
    run
}

/// The switch's advertised window is the members' ceiling: a declared
/// window below the pool (the JOIN_ACK's) keeps every member's chunks in
/// flight within it, so the switch drops nothing as beyond its window, and
/// a smaller window its RESULTs advertise later (a yielding job's) is the
/// one the members send under from then on. Members that ignore the
/// advertised window overrun it and are dropped.
#[test]
fn members_keep_to_the_window_the_switch_advertises() {
    let obeyed = run_windowed(3, 2, None);
    assert_eq!(obeyed.beyond_window, 0, "DATA beyond the advertised window");
    assert!(
        (1..=3).contains(&obeyed.max_in_flight),
        "in flight {}",
        obeyed.max_in_flight
    );
    assert!(
        (1..=2).contains(&obeyed.window_after),
        "window {} after the switch advertised 2",
        obeyed.window_after
    );
    // The check can fail: members sending 16 at once are dropped.
    let ignored = run_windowed(3, 2, Some(16));
    assert!(ignored.beyond_window > 0);
    assert!(ignored.max_in_flight > 3);
}

/// A rank whose RESULTs start to queue for 20 ms (behind a bottleneck),
/// four times the RTO its RTT settled it at: its chunks time out while
/// their RESULTs wait in the queue, and the switch answers the resends
/// from the summed slots. The second RESULT of a chunk sent twice answers
/// the resend and is the RTT sample that lifts the RTO above the queue, so
/// the rank stops resending within a collective. Without that sample
/// (Karn's rule alone) every chunk times out, none gives a sample, and the
/// rank resends chunk after chunk for as long as the queue lasts.
#[test]
fn a_rank_whose_results_queue_past_its_rto_stops_resending() {
    let (n, elems, chunks) = (4u16, 256u16, 256usize);
    let slow = SlowPath {
        rank: 2,
        from: 2,
        extra: Duration::from_millis(20),
    };
    let run = simulate(Sim {
        slow: Some(slow),
        ..Sim::new(n, chunks * elems as usize, elems, 64, 6, CLEAN, 7)
    });
    let slowed = &run.resent[slow.rank as usize];
    // The links' jitter reorders RESULTs, and fast retransmit resends some
    // chunks in every collective: the baseline is the rank's own before
    // the queue.
    let baseline = slowed[..2].iter().copied().max().unwrap_or(0);
    // The collective the queue began in costs resends, learning it; the
    // next ones (all under the same queue) no more than the baseline.
    for (c, &k) in slowed.iter().enumerate().skip(3) {
        assert!(
            k <= baseline + baseline / 2,
            "rank {} resent {k} of {chunks} chunks in collective {c} (before its RESULTs \
             were 20 ms late: {baseline}): its RTO never learnt the queue; every rank's \
             resends per collective: {:?}",
            slow.rank,
            run.resent
        );
    }
}

/// The other ranks' resends, probes and held timeouts in `run` (every
/// rank but `straggler`'s).
fn others(run: &Run, straggler: u16) -> (u64, u64, u64) {
    let mut t = (0, 0, 0);
    for (r, s) in run.stats.iter().enumerate() {
        if r as u16 != straggler {
            t.0 += s.chunks.resent;
            t.1 += s.chunks.probes;
            t.2 += s.chunks.held_timeouts;
        }
    }
    t
}

/// Four collectives of 256 chunks over 4 ranks on clean links, rank 1 a
/// straggler ([`Straggler`]: `late` each collective, its datagrams `gap`
/// apart); the members' straggler hold on or off (`hold`); the first copy
/// of each DATA in `drop` lost.
fn straggle(late: [Duration; 4], gap: Duration, hold: bool, drop: &'static [(u16, u32)]) -> Run {
    let (n, elems, chunks) = (4u16, 256u16, 256usize);
    simulate(Sim {
        straggler: Some(Straggler { rank: 1, late, gap }),
        hold,
        drop_data: drop,
        ..Sim::new(n, chunks * elems as usize, elems, 64, 4, CLEAN, 7)
    })
}

const LATE: [Duration; 4] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(120),
    Duration::from_millis(80),
];

/// A straggler's lateness costs the other ranks no resends: their DATA is
/// in the switch's slots, their probes say so, and their timeouts resend
/// nothing while the answer is fresh. Rank 1 starts each collective 50–200
/// ms late (a slow GPU; its DATA paced 50 µs apart), or its DATA trickles
/// through a link of one datagram per 400 µs (a slow link: the slots
/// complete one at a time). Measured (4 collectives, ranks 0, 2 and 3
/// together): late, 2 439 resends without the hold, 129 with it; the
/// trickle, 4 135 without, 213 with. Every sum bit-exact (`simulate`
/// checks each rank's output).
#[test]
fn a_straggler_costs_the_other_ranks_no_resends() {
    let trickle = Duration::from_micros(400);
    for (what, late, gap) in [
        ("late", LATE, Duration::from_micros(50)),
        ("trickling", [Duration::ZERO; 4], trickle),
    ] {
        let off = straggle(late, gap, false, &[]);
        let on = straggle(late, gap, true, &[]);
        let (before, after) = (others(&off, 1), others(&on, 1));
        eprintln!("{what}: the others resent {before:?} without the hold, {after:?} with it (resent, probes, held)");
        assert!(
            after.0 * 10 <= before.0,
            "a {what} straggler: the others resent {} chunks with the hold, {} without",
            after.0,
            before.0
        );
        // They asked, and held.
        assert!(after.1 > 0 && after.2 > 0, "{after:?}");
        assert_eq!(before.1 + before.2, 0, "no probes without the hold");
        // No slower: the straggler sets the pace.
        let (t_off, t_on): (Duration, Duration) = (off.times.iter().sum(), on.times.iter().sum());
        assert!(
            t_on <= t_off + t_off / 10,
            "{what}: {t_on:?} with the hold, {t_off:?} without"
        );
    }
}

/// A real loss while held: rank 2's DATA of a chunk beyond the oldest (the
/// 11th, and the collective's last) is lost while every rank's oldest
/// waits for the late rank 1. Fast retransmit finds the 11th once later
/// slots complete; the last one times out as the oldest, and the answer to
/// its probe names rank 2, which resends at once. The collective ends at
/// most about an RTO later than without the loss.
#[test]
fn a_loss_while_held_is_resent_within_about_an_rto() {
    let gap = Duration::from_micros(50);
    let clean = straggle(LATE, gap, true, &[]);
    const DROPS: [&[(u16, u32)]; 3] = [&[(2, 10)], &[(2, 255)], &[(2, 10), (2, 255)]];
    for drop in DROPS {
        let lossy = straggle(LATE, gap, true, drop);
        // The members' RTO here is at most the transport's first one.
        let rto = common::transport().initial_rto;
        let extra = lossy.times[0].saturating_sub(clean.times[0]);
        eprintln!(
            "lost {drop:?}: {:?} against {:?}",
            lossy.times[0], clean.times[0]
        );
        assert!(
            extra <= rto + rto / 2,
            "lost {drop:?}: the collective took {extra:?} longer (RTO at most {rto:?})"
        );
    }
}
