//! A two-level aggregation tree over a simulated network, in virtual time:
//! L leaves of W workers each, K spines, loss, duplication and reordering on
//! every link (worker–leaf and leaf–spine, both ways). Every worker must get
//! the tree-order sum (ranks in order within a leaf, leaves in order at the
//! spine), bit for bit, without hanging; chunks must spread over the spines
//! as seq mod K. Workers join, build their DATA headers and accept RESULTs
//! through `proto::member::Member`, as the worker library does. Every
//! switch, leaf or spine, is fed through its one entry point
//! (`proto::switch::entry::Switch`), as switchd feeds it: a spine takes the
//! leaves' partials on the lock-free path.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proto::elements::round_f32;
use proto::member::{Event, Member, Shape};
use proto::reference::{pattern, rank_order_sum};
use proto::stats::{tree_chunk_stats, GradStats, STATS_LEN};
use proto::switch::engine::ResultRef;
use proto::switch::entry::{encode_result, Handoff, Switch, Transmit};
use proto::switch::{
    Encoded, Endpoint, Ipv4Prefix, JobConfig, JobTable, Reply, Source, SpineAddr, TableConfig,
    Upstream,
};
use proto::tag::Tag;
use proto::tag::TAG_LEN;
use proto::wire::{flags, write_f32s, Dtype, Header, HeaderRepr, MsgType, HEADER_LEN};

mod common;
use common::{frame, join_lossless, join_params, Faults, Links, Paths, Worker, CLEAN};

const JOB: u16 = 3;
const SECRET: [u8; 32] = [9; 32];
const SPINE_PORT: u16 = 48879;
const UPLINK_PORT: u16 = 40000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Node {
    Worker { leaf: usize, rank: u16 },
    Leaf(usize),
    Spine(usize),
}

/// A datagram on its way: to a node, from an address.
struct Msg {
    to: Node,
    from: Endpoint,
    bytes: Vec<u8>,
}

/// The links: worker–leaf ones with `edge` faults, leaf–spine ones with
/// `fabric` faults.
struct Net {
    links: Links<Msg>,
    edge: Faults,
    fabric: Faults,
}

impl Net {
    fn send(&mut self, now: Duration, msg: Msg) {
        let f = match msg.to {
            Node::Spine(_) => self.fabric,
            Node::Leaf(_) if msg.from.source.port == SPINE_PORT => self.fabric,
            _ => self.edge,
        };
        self.links.send(f, now, || Msg {
            to: msg.to,
            from: msg.from,
            bytes: msg.bytes.clone(),
        });
    }
}

fn ep(ip: [u8; 4], port: u16) -> Endpoint {
    Endpoint {
        source: Source {
            mac: [0; 6],
            ip,
            port,
        },
        ..Endpoint::default()
    }
}

fn worker_ep(leaf: usize, rank: u16) -> Endpoint {
    ep([198, 18, leaf as u8, 10 + rank as u8], 1000)
}
fn uplink_ep(leaf: usize) -> Endpoint {
    ep([198, 19, leaf as u8, 1], UPLINK_PORT)
}
fn spine_ep(k: usize) -> Endpoint {
    ep([198, 19, 255, k as u8 + 1], SPINE_PORT)
}

fn parse(b: &[u8]) -> HeaderRepr {
    HeaderRepr::parse(&Header::new_checked(b).unwrap()).unwrap()
}

/// The tree: the leaf switches and the spine switches.
struct Tree {
    leaves: Vec<Switch>,
    spines: Vec<Switch>,
    /// How the spines took the leaves' partials (DATA).
    spine_data: Paths,
}

/// One switch's replies into the network (one dataplane thread): each
/// encoded whole, to the node its address names.
struct NodeShell<'a> {
    node: Node,
    net: &'a mut Net,
    now: Duration,
}

impl NodeShell<'_> {
    /// Sends `r`, `len` bytes of `buf`, to the node its address names.
    fn send(&mut self, r: &Reply, mut buf: Vec<u8>, len: usize) {
        buf.truncate(len);
        let ip = r.to.source.ip;
        let (to, from) = match (self.node, r.is_upstream()) {
            (Node::Leaf(i), true) => (Node::Spine(ip[3] as usize - 1), uplink_ep(i)),
            (Node::Leaf(i), false) => (
                Node::Worker {
                    leaf: i,
                    rank: (ip[3] - 10) as u16,
                },
                ep([198, 18, i as u8, 1], SPINE_PORT + 1),
            ),
            (Node::Spine(k), _) => (Node::Leaf(ip[2] as usize), spine_ep(k)),
            (Node::Worker { .. }, _) => unreachable!(),
        };
        self.net.send(
            self.now,
            Msg {
                to,
                from,
                bytes: buf,
            },
        );
    }
}

impl Transmit for NodeShell<'_> {
    fn route(&mut self, _: &mut Reply) -> Option<usize> {
        Some(0)
    }

    fn send_result(&mut self, r: &Reply, hdr: &HeaderRepr, res: &ResultRef<'_>, token: &Tag) {
        let mut buf = vec![0u8; 4096];
        if let Some(e) = encode_result(hdr, res, token, &mut buf) {
            self.send(r, buf, e.len);
        }
    }

    fn send_reply(&mut self, r: &Reply, encode: impl FnOnce(&mut [u8]) -> Option<Encoded>) {
        let mut buf = vec![0u8; 4096];
        if let Some(e) = encode(&mut buf) {
            self.send(r, buf, e.len);
        }
    }

    fn hand_off(&mut self, t: usize, h: Handoff) {
        unreachable!("{h:?} to thread {t}: one thread per switch");
    }

    fn unsent(&mut self, _: &Reply) {}
}

impl Tree {
    /// Leaves of `dtype` jobs (their ranks send `dtype`), spines of float32
    /// jobs (the leaves' partials are float32).
    fn new(
        l: usize,
        w: u16,
        k: usize,
        slots: u16,
        elems: u16,
        dtype: Dtype,
        base: Instant,
    ) -> Tree {
        Tree::new_with_stats(l, w, k, slots, elems, dtype, base, false)
    }

    /// [`Tree::new`], every job (leaves and spines) declared with `stats`.
    #[allow(clippy::too_many_arguments)]
    fn new_with_stats(
        l: usize,
        w: u16,
        k: usize,
        slots: u16,
        elems: u16,
        dtype: Dtype,
        base: Instant,
        stats: bool,
    ) -> Tree {
        // The frames' float32 capacity: a chunk leaves room for the
        // RESULT's token (4 floats) and a stats job's for the trailer (6).
        let frame = elems + 4 + if stats { 6 } else { 0 };
        let spines = (0..k)
            .map(|s| {
                let mut t = JobTable::new(TableConfig::new(100 + s as u32, [s as u8; 32]), base);
                t.add(
                    JobConfig {
                        id: JOB,
                        n_workers: l as u16,
                        allowed_sources: vec![Ipv4Prefix {
                            addr: [198, 19, 0, 0],
                            len: 16,
                        }],
                        secret: SECRET,
                        pool_slots: slots,
                        elems_per_chunk: elems,
                        dtype: Default::default(),
                        window: slots,
                        priority: Default::default(),
                        auth: Default::default(),
                        upstream: None,
                        stats,
                    },
                    frame,
                )
                .unwrap();
                Switch::new(t)
            })
            .collect();
        let leaves = (0..l)
            .map(|i| {
                let mut t = JobTable::new(TableConfig::new(1 + i as u32, [50 + i as u8; 32]), base);
                t.add(
                    JobConfig {
                        id: JOB,
                        n_workers: w,
                        allowed_sources: vec![Ipv4Prefix {
                            addr: [198, 18, i as u8, 0],
                            len: 24,
                        }],
                        secret: SECRET,
                        pool_slots: slots,
                        elems_per_chunk: elems,
                        dtype,
                        window: slots,
                        priority: Default::default(),
                        auth: Default::default(),
                        upstream: Some(Upstream {
                            leaf_index: i as u16,
                            n_leaves: l as u16,
                            spines: (0..k)
                                .map(|s| SpineAddr {
                                    ip: spine_ep(s).source.ip,
                                    port: SPINE_PORT,
                                })
                                .collect(),
                            local_ip: uplink_ep(i).source.ip,
                            local_port: UPLINK_PORT,
                        }),
                        stats,
                    },
                    frame,
                )
                .unwrap();
                Switch::new(t)
            })
            .collect();
        Tree {
            leaves,
            spines,
            spine_data: Paths::default(),
        }
    }

    /// `bytes` from `from` reach `node` at `at` (None: its timers are
    /// due); its replies go into the network.
    fn deliver(
        &mut self,
        node: Node,
        bytes: Option<(&[u8], Endpoint)>,
        at: Instant,
        net: &mut Net,
        now: Duration,
    ) {
        let switch = match node {
            Node::Leaf(i) => &self.leaves[i],
            Node::Spine(k) => &self.spines[k],
            Node::Worker { .. } => return,
        };
        let mut shell = NodeShell { node, net, now };
        let mut batch = switch.batch(0, at);
        match bytes {
            Some((b, from)) => {
                let h = batch.on_datagram(b, from, false, &mut shell);
                if let Node::Spine(_) = node {
                    self.spine_data.count(b, h);
                }
            }
            None => batch.on_timeout(&mut shell),
        }
    }
}

/// Workers join their leaf through their sessions (lossless: the session's
/// own tests lose and forge); the leaves' HELLOs to the spines go into
/// `net`. Returns each leaf's sessions, joined.
fn join_workers(
    tree: &mut Tree,
    net: &mut Net,
    w: u16,
    dtype: Dtype,
    base: Instant,
) -> Vec<Vec<Member>> {
    let mut all = Vec::new();
    for (i, leaf) in tree.leaves.iter_mut().enumerate() {
        let mut sessions = Vec::new();
        for r in 0..w {
            let from = worker_ep(i, r);
            let params = join_params(JOB, w, dtype, SECRET, r, &from);
            let s = join_lossless(&mut leaf.table(), from, params, [r as u8 + 1; 32], 0, base);
            sessions.push(s);
        }
        all.push(sessions);
    }
    for (i, (t, sessions)) in tree.leaves.iter_mut().zip(&mut all).enumerate() {
        // The workers' JOIN_ACKs go to their sessions; the uplink HELLOs
        // into the network.
        let mut t = t.table();
        let mut kept = Vec::new();
        while let Some(r) = t.poll_reply() {
            if r.is_upstream() {
                kept.push(r);
                continue;
            }
            let mut b = [0u8; 128];
            let e = t.encode(&r, &mut b).unwrap();
            let ev = sessions[r.rank as usize].handle(&b[..e.len], base);
            assert!(matches!(ev, Some(Event::Joined(_))), "{ev:?}");
        }
        for r in kept {
            let mut buf = vec![0u8; 4096];
            let e = t.encode(&r, &mut buf).unwrap();
            buf.truncate(e.len);
            let s = r.to.source.ip[3] as usize - 1;
            net.send(
                Duration::ZERO,
                Msg {
                    to: Node::Spine(s),
                    from: uplink_ep(i),
                    bytes: buf,
                },
            );
        }
    }
    assert!(all.iter().flatten().all(|s| s.is_joined()));
    all
}

/// Runs `iterations` all-reduces of `len` elements over `l` leaves × `w`
/// workers and `k` spines. Returns the per-spine chunk counts.
#[allow(clippy::too_many_arguments)]
fn run(
    l: usize,
    w: u16,
    k: usize,
    len: usize,
    elems: u16,
    slots: u16,
    iterations: u32,
    edge: Faults,
    fabric: Faults,
    seed: u64,
) -> Vec<u64> {
    run_typed(
        l,
        w,
        k,
        len,
        elems,
        slots,
        iterations,
        edge,
        fabric,
        seed,
        Dtype::F32,
    )
}

/// [`run`] with `dtype` workers: inputs in `dtype`, the result the
/// float32 tree-order sum rounded once.
#[allow(clippy::too_many_arguments)]
fn run_typed(
    l: usize,
    w: u16,
    k: usize,
    len: usize,
    elems: u16,
    slots: u16,
    iterations: u32,
    edge: Faults,
    fabric: Faults,
    seed: u64,
    dtype: Dtype,
) -> Vec<u64> {
    run_tree(
        l, w, k, len, elems, slots, iterations, edge, fabric, seed, dtype, false,
    )
}

/// [`run_typed`] with every job declared `stats`: each worker's every
/// RESULT must also carry the trailer `proto::stats::tree_chunk_stats`
/// gives for its chunk, bit for bit, resends the same.
#[allow(clippy::too_many_arguments)]
fn run_tree(
    l: usize,
    w: u16,
    k: usize,
    len: usize,
    elems: u16,
    slots: u16,
    iterations: u32,
    edge: Faults,
    fabric: Faults,
    seed: u64,
    dtype: Dtype,
    stats: bool,
) -> Vec<u64> {
    let base = Instant::now();
    let mut tree = Tree::new_with_stats(l, w, k, slots, elems, dtype, base, stats);
    let mut net = Net {
        links: Links::new(seed),
        edge,
        fabric,
    };
    let mut now = Duration::ZERO;
    let sessions = join_workers(&mut tree, &mut net, w, dtype, base);
    let mut workers: Vec<Vec<Worker>> = sessions
        .into_iter()
        .map(|ss| ss.into_iter().map(|m| Worker::new(m, dtype)).collect())
        .collect();
    let mut seq = 0u32;
    let tick = Duration::from_micros(500);
    for it in 0..iterations {
        let mut partials = Vec::new();
        for (i, ws) in workers.iter_mut().enumerate() {
            for (r, wk) in ws.iter_mut().enumerate() {
                let global = (i * w as usize + r) as u16;
                wk.input = (0..len)
                    .map(|x| round_f32(dtype, pattern(global, it, x)))
                    .collect();
                wk.output = vec![f32::NAN; len];
                wk.begin(it, seq, Shape::all_reduce(len));
            }
            let inputs: Vec<&[f32]> = ws.iter().map(|x| &x.input[..]).collect();
            partials.push(rank_order_sum(&inputs));
        }
        let refs: Vec<&[f32]> = partials.iter().map(|p| &p[..]).collect();
        let tree_sum = rank_order_sum(&refs);
        let want: Vec<f32> = tree_sum.iter().map(|v| round_f32(dtype, *v)).collect();
        // Per worker, the trailer of each chunk's RESULT, by seq.
        let mut trailers: Vec<Vec<std::collections::HashMap<u32, GradStats>>> =
            vec![vec![Default::default(); w as usize]; l];
        let mut steps = 0u64;
        while !workers.iter().flatten().all(|x| x.coll().is_complete()) {
            steps += 1;
            if steps >= 3_000_000 {
                // What each node was waiting for, then fail.
                for (i, t) in tree.leaves.iter().enumerate() {
                    let t = t.table();
                    let j = t.get(JOB).unwrap();
                    let u = j.uplink().unwrap();
                    let sessions: Vec<_> = u
                        .spines
                        .iter()
                        .map(|s| {
                            (
                                s.joined_gen,
                                s.hs.challenged(),
                                s.join_due.map(|d| d - base),
                            )
                        })
                        .collect();
                    eprintln!("leaf {i}: floor {} state {:?} sessions {sessions:?} partials {:?} counters {:?}", j.floor(), j.state(), (0..64u32).filter_map(|q| j.with_partial(q, |p, _| p.seq)).collect::<Vec<_>>(), j.counters());
                }
                for (k, t) in tree.spines.iter().enumerate() {
                    let t = t.table();
                    let j = t.get(JOB).unwrap();
                    eprintln!(
                        "spine {k}: floor {} state {:?} counters {:?} drops {:?}",
                        j.floor(),
                        j.state(),
                        j.counters(),
                        j.drops()
                    );
                }
                for (i, ws) in workers.iter().enumerate() {
                    for (r, wk) in ws.iter().enumerate() {
                        eprintln!(
                            "worker {i}/{r}: oldest {} complete {}",
                            wk.coll().oldest_unacked_seq(),
                            wk.coll().is_complete()
                        );
                    }
                }
                panic!("hang: iteration {it} at {now:?}");
            }
            for (i, ws) in workers.iter_mut().enumerate() {
                for (r, wk) in ws.iter_mut().enumerate() {
                    while let Some((h, bytes)) = wk.poll_data(base + now) {
                        assert_eq!(h.gen, 1 + i as u32);
                        net.send(
                            now,
                            Msg {
                                to: Node::Leaf(i),
                                from: worker_ep(i, r as u16),
                                bytes,
                            },
                        );
                    }
                }
            }
            // Next event: a delivery, a worker timeout, or the leaves' tick.
            let next_delivery = net.links.next_delivery();
            let next_timer = workers
                .iter()
                .flatten()
                .filter_map(|x| x.coll().next_timeout())
                .min()
                .map(|t| t - base);
            let mut next = now + tick;
            for t in [next_delivery, next_timer].into_iter().flatten() {
                next = next.min(t.max(now));
            }
            now = next;
            for i in 0..l {
                tree.deliver(Node::Leaf(i), None, base + now, &mut net, now);
            }
            while let Some(m) = net.links.pop_due(now) {
                match m.to {
                    Node::Leaf(_) | Node::Spine(_) => {
                        let got = Some((&m.bytes[..], m.from));
                        tree.deliver(m.to, got, base + now, &mut net, now);
                    }
                    Node::Worker { leaf, rank } => {
                        let wk = &mut workers[leaf][rank as usize];
                        let h = parse(&m.bytes);
                        if stats && h.msg_type == MsgType::Result && h.gen == 1 + leaf as u32 {
                            let n = dtype.payload_len(h.count);
                            let body = &m.bytes[HEADER_LEN..];
                            // Values, trailer, the RESULT's token.
                            assert_eq!(
                                body.len(),
                                n + STATS_LEN + TAG_LEN,
                                "leaf {leaf} rank {rank}"
                            );
                            let s = GradStats::parse(&body[n..n + STATS_LEN]).unwrap();
                            let first = trailers[leaf][rank as usize].entry(h.seq).or_insert(s);
                            assert!(first.bits_eq(&s), "a resent RESULT, the same trailer");
                        }
                        let (outcome, v) = match wk.m.handle(&m.bytes, base + now) {
                            Some(Event::Result {
                                outcome, values, ..
                            }) => (outcome, values),
                            Some(e @ (Event::Rejoining(_) | Event::Failed(_))) => {
                                panic!("leaf {leaf} rank {rank}: {e:?}")
                            }
                            _ => continue,
                        };
                        wk.take(&outcome, &m.bytes[v]);
                    }
                }
            }
        }
        if stats {
            // The reference per chunk: each leaf's ranks in rank order, the
            // leaves in leaf order, the float32 tree-order sum.
            let chunks = len.div_ceil(elems as usize);
            for c in 0..chunks {
                let r = c * elems as usize..((c + 1) * elems as usize).min(len);
                let leaves: Vec<Vec<&[f32]>> = workers
                    .iter()
                    .map(|ws| ws.iter().map(|x| &x.input[r.clone()]).collect())
                    .collect();
                let want = tree_chunk_stats(&leaves, &tree_sum[r.clone()]);
                assert_eq!(want.ranks, l as u32 * u32::from(w));
                for (i, ts) in trailers.iter().enumerate() {
                    for (rk, t) in ts.iter().enumerate() {
                        let got = t
                            .get(&(seq + c as u32))
                            .unwrap_or_else(|| panic!("leaf {i} rank {rk} chunk {c}: no trailer"));
                        assert!(
                            got.bits_eq(&want),
                            "leaf {i} rank {rk} iteration {it} chunk {c}: {got:?}, want {want:?}"
                        );
                    }
                }
            }
        }
        let exp: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
        for (i, ws) in workers.iter().enumerate() {
            for (r, wk) in ws.iter().enumerate() {
                let got: Vec<u32> = wk.output.iter().map(|x| x.to_bits()).collect();
                assert_eq!(
                    got, exp,
                    "leaf {i} rank {r} iteration {it}: not the tree-order sum"
                );
            }
        }
        seq = workers[0][0].coll().end_seq();
    }
    // The spines take the leaves' partials on the lock-free path, as
    // switchd does (a stats spine reads their trailers under the table's
    // lock); nearly all of them: a partial before the spine's job is
    // active, or from a leaf not yet joined again, is the table's.
    let p = tree.spine_data;
    if stats {
        assert_eq!(p.lock_free, 0, "{p:?}");
    } else {
        assert!(p.lock_free > 0 && p.lock_free >= 9 * p.table, "{p:?}");
    }
    tree.spines
        .iter()
        .map(|t| t.table().get(JOB).unwrap().counters().chunks_completed)
        .collect()
}

#[test]
fn two_leaves_two_spines_clean_split_evenly() {
    for len in [1usize, 9, 8, 1000] {
        let per_spine = run(2, 2, 2, len, 8, 16, 2, CLEAN, CLEAN, 1);
        let chunks = 2 * len.div_ceil(8) as u64;
        assert_eq!(per_spine.iter().sum::<u64>(), chunks, "{per_spine:?}");
        assert!(
            per_spine.iter().all(|c| c.abs_diff(chunks / 2) <= 1),
            "seq mod K spreads chunks evenly: {per_spine:?}"
        );
    }
}

/// Found by the proptest below: a copy of the leaf's HELLO got a second
/// CHALLENGE; the leaf took it after its JOIN had gone out, and every
/// resend then carried an older nonce than the one accepted (a replay).
#[test]
fn a_second_challenge_does_not_switch_the_leafs_nonce() {
    let f = Faults {
        loss: 0.118,
        dup: 0.099,
        reorder: 0.226,
    };
    run(1, 3, 3, 29, 1, 4, 2, f, f, 17493320196885777294);
}

#[test]
fn one_spine_is_a_two_level_tree_too() {
    run(3, 2, 1, 500, 8, 8, 2, CLEAN, CLEAN, 2);
}

#[test]
fn loss_duplication_and_reordering_at_both_levels() {
    let f = Faults {
        loss: 0.05,
        dup: 0.02,
        reorder: 0.25,
    };
    run(2, 3, 2, 3000, 16, 16, 3, f, f, 42);
    run(3, 2, 3, 2000, 16, 32, 2, CLEAN, f, 43);
}

/// Gradient statistics over trees: every worker's every RESULT carries the
/// tree's reference trailer (each leaf's ranks' sum of squares in rank
/// order, the leaves' in leaf order, the square of the float32 tree-order
/// sum), for f32, bf16 and f16, clean and under loss, duplication and
/// reordering at both levels.
#[test]
fn statistics_over_trees_equal_the_tree_reference() {
    let f = Faults {
        loss: 0.05,
        dup: 0.05,
        reorder: 0.2,
    };
    for (seed, dtype) in [Dtype::F32, Dtype::Bf16, Dtype::F16]
        .into_iter()
        .enumerate()
    {
        run_tree(
            2,
            3,
            2,
            300,
            16,
            16,
            2,
            CLEAN,
            CLEAN,
            seed as u64,
            dtype,
            true,
        );
        run_tree(3, 2, 1, 200, 8, 8, 2, f, f, 10 + seed as u64, dtype, true);
    }
}

#[test]
fn half_precision_leaves_send_float32_partials_and_round_once() {
    let f = Faults {
        loss: 0.05,
        dup: 0.02,
        reorder: 0.25,
    };
    for (dtype, seed) in [(Dtype::Bf16, 44), (Dtype::F16, 45)] {
        run_typed(2, 3, 2, 3000, 16, 16, 2, f, f, seed, dtype);
        run_typed(3, 2, 1, 500, 8, 8, 2, CLEAN, CLEAN, seed, dtype);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
    #[test]
    fn any_tree_and_schedule_gives_the_tree_order_sum(
        seed in any::<u64>(),
        l in 1usize..4,
        w in 1u16..4,
        k in 1usize..4,
        len in 1usize..300,
        elems in 1u16..20,
        slots_log in 2u32..5,
        loss in 0.0f64..0.15,
        dup in 0.0f64..0.1,
        reorder in 0.0f64..0.4,
    ) {
        let f = Faults { loss, dup, reorder };
        run(l, w, k, len, elems, 1 << slots_log, 2, f, f, seed);
    }
}

/// A fabric stepped by hand, for failure cases: datagrams to a dead spine
/// vanish; what reaches a worker is kept for the test to read.
struct Fabric {
    tree: Tree,
    net: Net,
    base: Instant,
    now: Duration,
    dead: Vec<bool>,
    /// A spine RESULT to lose once: (leaf, spine seq).
    lose_result: Option<(usize, u32)>,
    to_workers: Vec<(Node, Vec<u8>)>,
    /// Each leaf's workers' sessions (their generation).
    sessions: Vec<Vec<Member>>,
}

impl Fabric {
    fn new(l: usize, w: u16, k: usize) -> Fabric {
        let base = Instant::now();
        let mut tree = Tree::new(l, w, k, 16, 8, Dtype::F32, base);
        let mut net = Net {
            links: Links::new(1),
            edge: CLEAN,
            fabric: CLEAN,
        };
        let sessions = join_workers(&mut tree, &mut net, w, Dtype::F32, base);
        Fabric {
            sessions,
            tree,
            net,
            base,
            now: Duration::ZERO,
            dead: vec![false; k],
            lose_result: None,
            to_workers: Vec::new(),
        }
    }

    /// Advances virtual time by `d`: deliveries, and the leaves' timers
    /// every millisecond.
    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.now += Duration::from_millis(1);
            let at = self.base + self.now;
            for i in 0..self.tree.leaves.len() {
                let leaf = Node::Leaf(i);
                self.tree.deliver(leaf, None, at, &mut self.net, self.now);
            }
            while let Some(m) = self.net.links.pop_due(self.now) {
                if let Node::Leaf(i) = m.to {
                    let h = parse(&m.bytes);
                    if h.msg_type == MsgType::Result
                        && m.from.source.port == SPINE_PORT
                        && self.lose_result == Some((i, h.seq))
                    {
                        self.lose_result = None;
                        continue;
                    }
                }
                match m.to {
                    Node::Spine(k) if self.dead[k] => continue,
                    Node::Worker { .. } => {
                        self.to_workers.push((m.to, m.bytes));
                        continue;
                    }
                    Node::Leaf(_) | Node::Spine(_) => {}
                };
                let got = Some((&m.bytes[..], m.from));
                self.tree.deliver(m.to, got, at, &mut self.net, self.now);
            }
        }
    }

    /// Worker `rank` under `leaf` sends `ty` about `seq` (DATA: 8 ones).
    fn worker_sends(&mut self, leaf: usize, rank: u16, ty: MsgType, seq: u32) {
        let mut h = HeaderRepr::new(ty, JOB);
        h.rank = rank;
        h.seq = seq;
        h.gen = self.sessions[leaf][rank as usize].session().gen();
        let payload = if ty == MsgType::Data {
            h.count = 8;
            let mut p = vec![0u8; 32];
            write_f32s(&[1.0; 8], &mut p);
            p
        } else {
            Vec::new()
        };
        self.net.send(
            self.now,
            Msg {
                to: Node::Leaf(leaf),
                from: worker_ep(leaf, rank),
                bytes: frame(&h, &payload),
            },
        );
    }

    /// `bytes` to `leaf` from spine `spine`'s address and port, now (what
    /// a forger sends as the spine).
    fn spine_sends(&mut self, spine: usize, leaf: usize, bytes: Vec<u8>) {
        self.net.send(
            self.now,
            Msg {
                to: Node::Leaf(leaf),
                from: spine_ep(spine),
                bytes,
            },
        );
    }

    /// The last HEARTBEAT answer worker `rank` under `leaf` got about `seq`.
    fn heartbeat_answer(&mut self, leaf: usize, rank: u16, seq: u32) -> (HeaderRepr, Vec<u8>) {
        self.to_workers.clear();
        self.worker_sends(leaf, rank, MsgType::Heartbeat, seq);
        self.run_for(Duration::from_millis(5));
        self.to_workers
            .iter()
            .rev()
            .find_map(|(to, b)| {
                let h = parse(b);
                (*to == Node::Worker { leaf, rank }
                    && h.msg_type == MsgType::Heartbeat
                    && h.seq == seq)
                    .then(|| (h, b[HEADER_LEN..].to_vec()))
            })
            .expect("the leaf answers a member's HEARTBEAT")
    }
}

/// A spine that dies mid-collective: the chunks of its tree stall, and the
/// leaf's HEARTBEAT answer names it and how long it has been silent (what
/// the worker library turns into its error); chunks waiting on a live
/// spine name the leaves it waits for instead. The leaf logs the silence
/// once.
#[test]
fn a_dead_spine_is_named_by_the_leaf() {
    use proto::switch::Event;
    use proto::wire::{UpstreamWaitPayload, UPSTREAM_WAIT_LEN};
    let mut f = Fabric::new(2, 1, 2);
    f.run_for(Duration::from_millis(50));
    // Chunks 0 and 1 (one per tree) complete while both spines live.
    for seq in [0, 1] {
        for leaf in [0, 1] {
            f.worker_sends(leaf, 0, MsgType::Data, seq);
        }
    }
    f.run_for(Duration::from_millis(50));
    let results = |f: &Fabric| {
        f.to_workers
            .iter()
            .filter(|(_, b)| parse(b).msg_type == MsgType::Result)
            .count()
    };
    assert_eq!(results(&f), 4, "both chunks reach both workers");

    // Spine 1 dies; chunk 3 goes through it, chunk 2 through spine 0.
    f.dead[1] = true;
    for seq in [2, 3] {
        for leaf in [0, 1] {
            f.worker_sends(leaf, 0, MsgType::Data, seq);
        }
    }
    f.run_for(Duration::from_secs(3));

    let (h, p) = f.heartbeat_answer(0, 0, 3);
    assert!(h.has_flag(flags::UPSTREAM), "chunk 3 waits upstream: {h:?}");
    let w = UpstreamWaitPayload::parse(&p).unwrap();
    assert_eq!(
        (w.spine_ip, w.spine_port, w.tree),
        ([198, 19, 255, 2], SPINE_PORT, 1)
    );
    assert!(
        (2900..=3100).contains(&w.silent_ms),
        "silent since chunk 3 went up, 3 s ago: {} ms",
        w.silent_ms
    );
    assert_eq!(h.count, 0, "a dead spine named no leaves");
    assert_eq!(p.len(), UPSTREAM_WAIT_LEN);

    // Chunk 2 completed through the live spine: an ordinary answer.
    let (h, p) = f.heartbeat_answer(0, 0, 2);
    assert!(!h.has_flag(flags::UPSTREAM));
    assert_eq!((h.count, p.len()), (0, 0));

    let silent: Vec<_> = std::iter::from_fn(|| f.tree.leaves[0].table().poll_event())
        .filter_map(|e| match e {
            Event::SpineSilent {
                tree,
                spine,
                silent,
                ..
            } => Some((tree, spine, silent)),
            _ => None,
        })
        .collect();
    assert_eq!(silent.len(), 1, "logged once: {silent:?}");
    assert_eq!(silent[0].0, 1);
    assert_eq!(silent[0].1.to_string(), "198.19.255.2:48879");

    // A live spine waiting for another leaf: chunk 4 (spine 0) from leaf 0
    // only. The spine answers the leaf's HEARTBEATs: leaf 1 is missing.
    f.worker_sends(0, 0, MsgType::Data, 4);
    f.run_for(Duration::from_millis(1500));
    let (h, p) = f.heartbeat_answer(0, 0, 4);
    assert!(h.has_flag(flags::UPSTREAM));
    let w = UpstreamWaitPayload::parse(&p).unwrap();
    assert_eq!(w.tree, 0);
    assert!(w.silent_ms < 1000, "spine 0 answers: {} ms", w.silent_ms);
    assert_eq!(
        &p[UPSTREAM_WAIT_LEN..],
        &1u16.to_be_bytes(),
        "it waits for leaf 1"
    );
}

/// A leaf that ran ahead of the other: its partials wait at the spine,
/// and their timers back off meanwhile (the spine holds them; every resend
/// is a duplicate). When the other leaf catches up and the spine's RESULT
/// for the oldest of them is lost, the later RESULTs make the leaf resend
/// that partial at once (fast retransmit), as a worker does: the chunk
/// completes within milliseconds, not after the backed-off timer (up to
/// the transport's `max_rto`), which stalled the whole tree.
#[test]
fn a_lost_spine_result_is_recovered_by_the_later_ones_not_the_backed_off_timer() {
    let mut f = Fabric::new(2, 1, 1);
    f.run_for(Duration::from_millis(50));
    for seq in 0..6 {
        f.worker_sends(0, 0, MsgType::Data, seq);
    }
    // Leaf 0's partials wait 2 s for leaf 1: resent, backed off.
    f.run_for(Duration::from_secs(2));
    let resent_waiting = f.tree.leaves[0]
        .table()
        .get(JOB)
        .unwrap()
        .counters()
        .partials_resent;
    assert!(resent_waiting > 0, "the waiting partials were resent");
    f.lose_result = Some((0, 0));
    for seq in 0..6 {
        f.worker_sends(1, 0, MsgType::Data, seq);
    }
    f.run_for(Duration::from_millis(20));
    assert_eq!(
        f.lose_result, None,
        "the RESULT of chunk 0 to leaf 0 was lost"
    );
    let mut answered: Vec<u32> = f
        .to_workers
        .iter()
        .filter(|(to, b)| {
            *to == Node::Worker { leaf: 0, rank: 0 } && parse(b).msg_type == MsgType::Result
        })
        .map(|(_, b)| parse(b).seq)
        .collect();
    answered.sort_unstable();
    answered.dedup();
    assert_eq!(
        answered,
        (0..6).collect::<Vec<u32>>(),
        "leaf 0's worker has every RESULT within 20 ms of the catch-up"
    );
}

/// A tree declared inconsistently: spine 1's job has another secret, then
/// another chunk size. The leaf logs each refusal once (not per retry),
/// asks again about once a second (no refusal loop), and a stalled worker's
/// HEARTBEAT answer says why the spine refuses; once the spine's job is
/// fixed, the leaf joins it and the chunk completes.
#[test]
fn a_spine_that_refuses_the_leaf_is_named_with_the_reason() {
    use proto::switch::Event;
    use proto::wire::{NackReason, SpineRefusal, SpineSessionState, UpstreamWaitPayload};
    let spine_job = |secret: [u8; 32], elems: u16| JobConfig {
        id: JOB,
        n_workers: 1,
        allowed_sources: vec![Ipv4Prefix {
            addr: [198, 19, 0, 0],
            len: 16,
        }],
        secret,
        pool_slots: 16,
        elems_per_chunk: elems,
        dtype: Default::default(),
        window: 16,
        priority: Default::default(),
        auth: Default::default(),
        upstream: None,
        stats: false,
    };
    let mut f = Fabric::new(1, 1, 2);
    f.tree.spines[1].table().remove(JOB);
    // 8 elements and the RESULT's token (4 floats' room).
    f.tree.spines[1]
        .table()
        .add(spine_job([7; 32], 8), 12)
        .unwrap();
    f.worker_sends(0, 0, MsgType::Data, 1);
    f.run_for(Duration::from_millis(3500));
    let refusals: Vec<_> = std::iter::from_fn(|| f.tree.leaves[0].table().poll_event())
        .filter_map(|e| match e {
            Event::SpineRefused { tree, why, .. } => Some((tree, why)),
            _ => None,
        })
        .collect();
    assert_eq!(
        refusals,
        [(1, SpineRefusal::Nack(NackReason::BadSecret))],
        "one event for one refusal"
    );
    let c = f.tree.leaves[0]
        .table()
        .get(JOB)
        .unwrap()
        .uplink()
        .unwrap()
        .spines[1]
        .counters
        .clone();
    assert!(
        (3..=5).contains(&c.refusals),
        "asked again about once a second in 3.5 s: {c:?}"
    );
    let (h, p) = f.heartbeat_answer(0, 0, 1);
    assert!(h.has_flag(flags::UPSTREAM));
    let w = UpstreamWaitPayload::parse(&p).unwrap();
    assert_eq!(
        (w.tree, w.session),
        (
            1,
            SpineSessionState::Refused(SpineRefusal::Nack(NackReason::BadSecret))
        )
    );

    // The right secret, the wrong chunk size: the JOIN_ACK gives it away.
    f.tree.spines[1].table().remove(JOB);
    f.tree.spines[1]
        .table()
        .add(spine_job(SECRET, 16), 20)
        .unwrap();
    f.run_for(Duration::from_millis(1500));
    let (_, p) = f.heartbeat_answer(0, 0, 1);
    assert_eq!(
        UpstreamWaitPayload::parse(&p).unwrap().session,
        SpineSessionState::Refused(SpineRefusal::ElemsDiffer { spine: 16 })
    );
    assert!(
        std::iter::from_fn(|| f.tree.leaves[0].table().poll_event()).any(|e| matches!(
            e,
            Event::SpineRefused {
                why: SpineRefusal::ElemsDiffer { spine: 16 },
                ..
            }
        ))
    );

    // The right chunk size, but the spine's job has gradient statistics
    // and the leaf's not: declared inconsistently, named as such.
    f.tree.spines[1].table().remove(JOB);
    let with_stats = JobConfig {
        stats: true,
        ..spine_job(SECRET, 8)
    };
    f.tree.spines[1].table().add(with_stats, 18).unwrap();
    f.run_for(Duration::from_millis(1500));
    let (_, p) = f.heartbeat_answer(0, 0, 1);
    let why = SpineRefusal::StatsDiffer { spine: 1 };
    assert_eq!(
        UpstreamWaitPayload::parse(&p).unwrap().session,
        SpineSessionState::Refused(why)
    );
    assert!(why.to_string().contains("stats = true"), "{why}");
    assert!(std::iter::from_fn(|| f.tree.leaves[0].table().poll_event())
        .any(|e| matches!(e, Event::SpineRefused { why: w, .. } if w == why)));

    // Fixed: the leaf joins within its retry, and chunk 1 completes.
    f.tree.spines[1].table().remove(JOB);
    f.tree.spines[1]
        .table()
        .add(spine_job(SECRET, 8), 12)
        .unwrap();
    f.to_workers.clear();
    f.run_for(Duration::from_millis(1500));
    assert!(
        f.to_workers
            .iter()
            .any(|(_, b)| { parse(b).msg_type == MsgType::Result && parse(b).seq == 1 }),
        "chunk 1 completes once the spine's job matches"
    );
}

/// Issue 20, finding 2, at a leaf: NACKs (1, 6, 7; zero and made-up tags)
/// and a RESULT of another generation forged with a spine's address reset
/// nothing: the leaf stays joined under the same generation, counts them,
/// probes the spine (which answers under the same generation: spoofed), and
/// the next chunk completes. A real restart of that spine (a new
/// generation) is found by the probe its untagged NACK 7 triggers, and the
/// leaf joins it again.
/// A RESULT with the spine's address and generation but without the spine's
/// token (docs/PROTOCOL.md, "RESULT tokens") is ignored by the leaf,
/// counted per spine (`bad_tokens`), and never reaches the tensor: the
/// chunk it names completes with the spine's own sum.
#[test]
fn a_leaf_takes_no_spine_result_without_its_token() {
    let mut f = Fabric::new(1, 1, 1);
    f.run_for(Duration::from_millis(50));
    let spine = |f: &Fabric| {
        let leaf = f.tree.leaves[0].table();
        let s = &leaf.get(JOB).unwrap().uplink().unwrap().spines[0];
        (s.joined_gen, s.counters.clone())
    };
    assert_eq!(spine(&f).0, Some(100), "joined spine 0");
    // The worker's DATA reaches the leaf, whose partial is then on its way
    // to the spine: chunk 0's RESULT, forged (1e9 everywhere, a zero token,
    // then one guessed at random), reaches the leaf before the spine's.
    f.worker_sends(0, 0, MsgType::Data, 0);
    f.run_for(Duration::from_millis(1));
    for token in [[0u8; TAG_LEN], [0x5a; TAG_LEN]] {
        let mut h = HeaderRepr::new(MsgType::Result, JOB);
        h.gen = 100;
        h.count = 8;
        h.window = 16;
        let mut p = vec![0u8; 32];
        write_f32s(&[1e9; 8], &mut p);
        p.extend_from_slice(&token);
        f.spine_sends(0, 0, frame(&h, &p));
    }
    f.run_for(Duration::from_millis(20));
    let (gen, c) = spine(&f);
    assert_eq!(gen, Some(100), "still joined");
    assert_eq!(c.bad_tokens, 2, "{c:?}");
    assert_eq!(c.unauthenticated, 0, "the generation was right: {c:?}");
    let result = f
        .to_workers
        .iter()
        .map(|(_, b)| b)
        .find(|b| {
            let h = parse(b);
            h.msg_type == MsgType::Result && h.seq == 0
        })
        .expect("chunk 0 completes");
    let values: Vec<f32> = result[HEADER_LEN..HEADER_LEN + 32]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(values, [1.0; 8], "the spine's sum, not the forgery's");
}

#[test]
fn a_leaf_ignores_forged_spine_nacks_and_results_but_finds_a_restart() {
    use proto::wire::{NackPayload, NackReason, NACK_PAYLOAD_LEN};
    let mut f = Fabric::new(1, 1, 1);
    f.run_for(Duration::from_millis(50));
    let session = |f: &Fabric| {
        let leaf = f.tree.leaves[0].table();
        let s = &leaf.get(JOB).unwrap().uplink().unwrap().spines[0];
        (s.joined_gen, s.counters.clone())
    };
    let (gen, _) = session(&f);
    assert_eq!(gen, Some(100), "joined spine 0");
    let forge = |f: &mut Fabric, bytes: Vec<u8>| f.spine_sends(0, 0, bytes);
    for reason in [
        NackReason::UnknownJob,
        NackReason::JobNotActive,
        NackReason::StaleGeneration,
    ] {
        for tag in [[0u8; 16], [0x3c; 16]] {
            let mut h = HeaderRepr::new(MsgType::Nack, JOB);
            h.gen = 100;
            let mut p = [0u8; NACK_PAYLOAD_LEN];
            NackPayload {
                tag,
                ..NackPayload::new(reason)
            }
            .emit(&mut p)
            .unwrap();
            forge(&mut f, frame(&h, &p));
        }
    }
    let mut h = HeaderRepr::new(MsgType::Result, JOB);
    h.gen = 0x0bad;
    h.count = 8;
    forge(&mut f, frame(&h, &[0u8; 32]));
    f.run_for(Duration::from_millis(20));
    let (gen, c) = session(&f);
    assert_eq!(gen, Some(100), "still joined under the same generation");
    assert_eq!(c.unauthenticated, 7, "{c:?}");
    assert_eq!(c.probes_sent, 1, "one probe for a burst: {c:?}");
    assert_eq!(c.spoofed_triggers, 1, "{c:?}");
    assert_eq!(c.probed_restarts, 0, "{c:?}");
    f.worker_sends(0, 0, MsgType::Data, 0);
    f.run_for(Duration::from_millis(20));
    let done = |f: &Fabric, seq: u32| {
        f.to_workers.iter().any(|(_, b)| {
            let h = parse(b);
            h.msg_type == MsgType::Result && h.seq == seq
        })
    };
    assert!(done(&f, 0), "chunk 0 completes through the same session");

    // The spine restarts (a new generation, no sessions): the leaf's
    // partial gets an untagged NACK 7, the probe's CHALLENGE shows the new
    // generation, and the leaf joins again; chunk 1 completes.
    let mut restarted = JobTable::new(TableConfig::new(200, [9; 32]), f.base);
    restarted
        .add(
            JobConfig {
                id: JOB,
                n_workers: 1,
                allowed_sources: vec![Ipv4Prefix {
                    addr: [198, 19, 0, 0],
                    len: 16,
                }],
                secret: SECRET,
                pool_slots: 16,
                elems_per_chunk: 8,
                dtype: Default::default(),
                window: 16,
                priority: Default::default(),
                upstream: None,
                stats: false,
                auth: Default::default(),
            },
            // 8 elements and the RESULT's token.
            12,
        )
        .unwrap();
    f.tree.spines[0] = Switch::new(restarted);
    f.worker_sends(0, 0, MsgType::Data, 1);
    f.run_for(Duration::from_secs(2));
    let (gen, c) = session(&f);
    assert_eq!(gen, Some(200), "rejoined the restarted spine: {c:?}");
    assert_eq!(c.probed_restarts, 1, "{c:?}");
    assert!(done(&f, 1), "chunk 1 completes after the rejoin");
}

/// A spine's authentic NACKs (tagged under the leaf's session) mean to the
/// leaf what they mean to a worker (`proto::session::nack_meaning`): a
/// stale nonce (an answer to an earlier JOIN) changes nothing, a refusal
/// marks the tree refused and is asked again later, job-not-active makes it
/// join again.
#[test]
fn a_leaf_sorts_authentic_spine_nacks_as_a_worker_does() {
    use proto::auth::nack_tag;
    use proto::wire::{NackPayload, NackReason, SpineRefusal, SpineSessionState, NACK_PAYLOAD_LEN};
    let spine = |f: &Fabric| {
        let leaf = f.tree.leaves[0].table();
        leaf.get(JOB).unwrap().uplink().unwrap().spines[0].clone()
    };
    let tagged = |f: &mut Fabric, reason: NackReason| {
        let key = spine(f).hs.session_key().expect("joined");
        let mut h = HeaderRepr::new(MsgType::Nack, JOB);
        h.gen = 100;
        let mut hb = [0u8; HEADER_LEN];
        h.emit_to(&mut hb).unwrap();
        let echo = [0u8; 16];
        let mut p = [0u8; NACK_PAYLOAD_LEN];
        NackPayload {
            echo,
            tag: nack_tag(&key, &hb, reason as u16, &echo),
            ..NackPayload::new(reason)
        }
        .emit(&mut p)
        .unwrap();
        f.spine_sends(0, 0, frame(&h, &p));
        f.run_for(Duration::from_millis(1));
    };
    let mut f = Fabric::new(1, 1, 1);
    f.run_for(Duration::from_millis(50));
    assert_eq!(spine(&f).joined_gen, Some(100));

    tagged(&mut f, NackReason::StaleNonce);
    let s = spine(&f);
    assert_eq!(s.joined_gen, Some(100), "a stale nonce changes nothing");
    assert_eq!(s.counters.unauthenticated, 0, "{:?}", s.counters);

    tagged(&mut f, NackReason::ParametersDiffer);
    let s = spine(&f);
    assert_eq!(
        s.state(),
        SpineSessionState::Refused(SpineRefusal::Nack(NackReason::ParametersDiffer))
    );
    assert_eq!(s.counters.refusals, 1);
    // Asked again later: the spine takes the leaf back.
    f.run_for(Duration::from_millis(1500));
    assert_eq!(spine(&f).joined_gen, Some(100), "rejoined after the retry");

    tagged(&mut f, NackReason::JobNotActive);
    assert_eq!(spine(&f).joined_gen, None, "job not active: join again");
    f.run_for(Duration::from_millis(50));
    assert_eq!(spine(&f).joined_gen, Some(100), "and joined");
}
