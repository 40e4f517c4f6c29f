//! A two-level aggregation tree without declared jobs, over a simulated
//! network in virtual time (docs/PROTOCOL.md, "Tenants and self-provisioned
//! jobs", Trees): 2 leaves and 2 spines whose tables have tenant `vision`
//! and no job (the leaves' tenant with `[tenant.upstream]`), 2 workers per
//! leaf that provision their job by name. When a leaf's ranks have all
//! joined, it provisions the job on every spine (PROVISION ask and claim
//! from its uplink address, its own job id, `n_leaves` workers, f32), joins
//! each with the derived secret, and the workers get the tree-order sum
//! (ranks in order within a leaf, leaves in order at the spine) bit for
//! bit: on clean links; with loss, duplication and reordering on every
//! link; when a spine restarts mid-collective (a new table, a new
//! generation, the same tenant, no job: the leaves provision again and
//! resume). A spine whose tenant's quota refuses the job (its
//! `max_workers_per_job` below `n_leaves`) is a spine refusal naming the
//! quota, in the leaf's log and in the stalled workers' HEARTBEAT answers,
//! asked again every second until the operator fixes it.
//!
//! Workers provision, join and answer through `proto::member::Member`, as
//! the worker library does; every switch is fed through its one entry
//! point (`proto::switch::entry::Switch`), as switchd feeds it.

use std::time::{Duration, Instant};

use proto::member::{Event, Shape, Waiting};
use proto::provision::{JobName, TenantName};
use proto::provisioner::ProvisionSpec;
use proto::reference::{pattern, rank_order_sum};
use proto::session::SessionConfig;
use proto::switch::engine::ResultRef;
use proto::switch::entry::{encode_result, Handoff, Switch, Transmit};
use proto::switch::tenant::{TenantConfig, DEFAULT_LEASE};
use proto::switch::{
    Encoded, Endpoint, Event as SwitchEvent, Ipv4Prefix, JobOrigin, JobTable, Priority, Reply,
    Source, SpineAddr, TableConfig, Upstream,
};
use proto::tag::{AuthMode, Tag};
use proto::wire::{Dtype, Quota, SpineRefusal, SpineSessionState};

mod common;
use common::{join_params, Faults, Links, Worker, ALL_FAULTS, CLEAN};

const KEY: [u8; 32] = [0x6b; 32];
const SPINE_PORT: u16 = 48879;
const UPLINK_PORT: u16 = 40000;
const LEAVES: usize = 2;
const SPINES: usize = 2;
/// Workers per leaf.
const W: u16 = 2;
const JOB_NAME: &str = "tree-run-1";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// Tenant `vision`, the same name, key and job ids on every switch: its
/// workers (on a spine: the leaves' uplinks) in `sources`; on a leaf with
/// its place in the tree.
fn tenant(sources: Ipv4Prefix, upstream: Option<Upstream>, max_workers: u16) -> TenantConfig {
    TenantConfig {
        name: TenantName::new("vision").unwrap(),
        key: KEY,
        allowed_sources: vec![sources],
        max_jobs: 4,
        max_workers_per_job: max_workers,
        max_pool_bytes: 1 << 30,
        dtypes: Dtype::ALL.to_vec(),
        auth: vec![AuthMode::Port, AuthMode::Mac],
        max_priority: Priority::Normal,
        job_ids: (40000, 40999),
        lease: DEFAULT_LEASE,
        pool_slots: 16,
        upstream,
    }
}

/// The spines' tenant: the leaves' uplinks may provision, jobs of at most
/// `max_workers` workers.
fn spine_tenant(max_workers: u16) -> TenantConfig {
    let uplinks = Ipv4Prefix {
        addr: [198, 19, 0, 0],
        len: 16,
    };
    tenant(uplinks, None, max_workers)
}

/// Spine `k` of generation `gen`: tenant `vision`, no job.
fn spine(k: usize, gen: u32, max_workers: u16, now: Instant) -> Switch {
    let mut t = JobTable::new(TableConfig::new(gen, [0x40 + k as u8; 32]), now);
    t.add_tenant(spine_tenant(max_workers)).unwrap();
    Switch::new(t)
}

/// Leaf `i`: tenant `vision` with `[tenant.upstream]`, no job.
fn leaf(i: usize, now: Instant) -> Switch {
    let upstream = Upstream {
        leaf_index: i as u16,
        n_leaves: LEAVES as u16,
        spines: (0..SPINES)
            .map(|k| SpineAddr {
                ip: spine_ep(k).source.ip,
                port: SPINE_PORT,
            })
            .collect(),
        local_ip: uplink_ep(i).source.ip,
        local_port: UPLINK_PORT,
    };
    let workers = Ipv4Prefix {
        addr: [198, 18, i as u8, 0],
        len: 24,
    };
    let mut t = JobTable::new(TableConfig::new(1 + i as u32, [0x50 + i as u8; 32]), now);
    t.add_tenant(tenant(workers, Some(upstream), 8)).unwrap();
    Switch::new(t)
}

/// One switch's replies into the network (one dataplane thread): each
/// encoded whole, to the node its address names.
struct NodeShell<'a> {
    node: Node,
    net: &'a mut Links<Msg>,
    faults: Faults,
    now: Duration,
}

impl NodeShell<'_> {
    fn send(&mut self, r: &Reply, buf: &[u8]) {
        let ip = r.to.source.ip;
        let (to, from) = match (self.node, r.is_upstream()) {
            (Node::Leaf(i), true) => (Node::Spine(ip[3] as usize - 1), uplink_ep(i)),
            (Node::Leaf(i), false) => (
                Node::Worker {
                    leaf: i,
                    rank: u16::from(ip[3] - 10),
                },
                ep([198, 18, i as u8, 1], SPINE_PORT),
            ),
            (Node::Spine(k), _) => (Node::Leaf(ip[2] as usize), spine_ep(k)),
            (Node::Worker { .. }, _) => unreachable!("workers have no shell"),
        };
        self.net.send(self.faults, self.now, || Msg {
            to,
            from,
            bytes: buf.to_vec(),
        });
    }
}

impl Transmit for NodeShell<'_> {
    fn route(&mut self, _: &mut Reply) -> Option<usize> {
        Some(0)
    }

    fn send_result(
        &mut self,
        r: &Reply,
        hdr: &proto::wire::HeaderRepr,
        res: &ResultRef<'_>,
        token: &Tag,
    ) {
        let mut buf = vec![0u8; 4096];
        if let Some(e) = encode_result(hdr, res, token, &mut buf) {
            self.send(r, &buf[..e.len]);
        }
    }

    fn send_reply(&mut self, r: &Reply, encode: impl FnOnce(&mut [u8]) -> Option<Encoded>) {
        let mut buf = vec![0u8; 4096];
        if let Some(e) = encode(&mut buf) {
            self.send(r, &buf[..e.len]);
        }
    }

    fn hand_off(&mut self, t: usize, h: Handoff) {
        unreachable!("{h:?} to thread {t}: one thread per switch");
    }

    fn unsent(&mut self, _: &Reply) {}
}

/// The tree, its workers and the network between them.
struct Sim {
    leaves: Vec<Switch>,
    spines: Vec<Switch>,
    workers: Vec<Vec<Worker>>,
    net: Links<Msg>,
    faults: Faults,
    base: Instant,
    now: Duration,
    /// Every worker's Provisioned events: (job, created).
    provisioned: Vec<(u16, bool)>,
    /// Datagrams from spine `.1` to leaf `.0` but RESULTs are lost while
    /// set.
    cut: Option<(usize, usize)>,
    /// What each worker's first stall said it waits for, by (leaf, rank).
    stalls: Vec<((usize, u16), Option<Waiting>)>,
    len: usize,
}

impl Sim {
    /// Leaves and spines with tenant `vision` and no job (spine k's tenant
    /// allows `spine_workers[k]` workers per job); 2 workers per leaf,
    /// each provisioning job `tree-run-1` and joining it, with inputs of
    /// `len` elements; `stall` is their stall timeout.
    fn new(
        len: usize,
        faults: Faults,
        seed: u64,
        spine_workers: [u16; SPINES],
        stall: Duration,
    ) -> Sim {
        let base = Instant::now();
        let spec = ProvisionSpec {
            tenant: TenantName::new("vision").unwrap(),
            key: KEY,
            job_name: JobName::new(JOB_NAME).unwrap(),
            auth: AuthMode::Port,
            stats: false,
            priority: 1,
        };
        let workers = (0..LEAVES)
            .map(|i| {
                (0..W)
                    .map(|r| {
                        let from = worker_ep(i, r);
                        let mut params = join_params(0, W, Dtype::F32, [0; 32], r, &from);
                        params.provision = Some(spec.clone());
                        let scfg = SessionConfig {
                            join_timeout: Duration::from_secs(30),
                            stall_timeout: stall,
                        };
                        let key = [(i as u8) << 4 | r as u8; 32];
                        let mut m =
                            proto::member::Member::new(params, scfg, common::transport(), key);
                        m.start_join(0, 0, base);
                        let mut w = Worker::new(m, Dtype::F32);
                        let global = i as u16 * W + r;
                        w.input = (0..len).map(|x| pattern(global, 0, x)).collect();
                        w.output = vec![f32::NAN; len];
                        w
                    })
                    .collect()
            })
            .collect();
        Sim {
            leaves: (0..LEAVES).map(|i| leaf(i, base)).collect(),
            spines: (0..SPINES)
                .map(|k| spine(k, 100 + k as u32, spine_workers[k], base))
                .collect(),
            workers,
            net: Links::new(seed),
            faults,
            base,
            now: Duration::ZERO,
            provisioned: Vec::new(),
            cut: None,
            stalls: Vec::new(),
            len,
        }
    }

    /// The tree-order sum of the workers' inputs, as bits.
    fn want(&self) -> Vec<u32> {
        let partials: Vec<Vec<f32>> = self
            .workers
            .iter()
            .map(|ws| rank_order_sum(&ws.iter().map(|w| &w.input[..]).collect::<Vec<_>>()))
            .collect();
        let refs: Vec<&[f32]> = partials.iter().map(|p| &p[..]).collect();
        rank_order_sum(&refs).iter().map(|x| x.to_bits()).collect()
    }

    fn done(&self) -> bool {
        self.workers
            .iter()
            .flatten()
            .all(|w| w.coll().n_chunks() > 0 && w.coll().is_complete())
    }

    /// `bytes` from `from` reach switch `node` (None: its timers are due).
    fn deliver(&mut self, node: Node, bytes: Option<(&[u8], Endpoint)>) {
        let switch = match node {
            Node::Leaf(i) => &self.leaves[i],
            Node::Spine(k) => &self.spines[k],
            Node::Worker { .. } => unreachable!(),
        };
        let mut shell = NodeShell {
            node,
            net: &mut self.net,
            faults: self.faults,
            now: self.now,
        };
        let mut batch = switch.batch(0, self.base + self.now);
        match bytes {
            Some((b, from)) => {
                batch.on_datagram(b, from, false, &mut shell);
            }
            None => batch.on_timeout(&mut shell),
        }
    }

    /// A datagram reaches worker `rank` of leaf `leaf`.
    fn at_worker(&mut self, leaf: usize, rank: u16, bytes: &[u8]) {
        let at = self.base + self.now;
        let len = self.len;
        let w = &mut self.workers[leaf][rank as usize];
        match w.m.handle(bytes, at) {
            None | Some(Event::Rejoining(_)) => {}
            Some(Event::Provisioned { job, created, .. }) => self.provisioned.push((job, created)),
            Some(Event::Joined(j)) => {
                assert_eq!(j.collective, 0);
                if j.first {
                    w.begin(0, 0, Shape::all_reduce(len));
                }
                w.m.restart_from(j.seq);
            }
            Some(Event::Result {
                outcome, values, ..
            }) => w.take(&outcome, &bytes[values]),
            Some(e) => panic!("leaf {leaf} rank {rank} at {:?}: {e:?}", self.now),
        }
    }

    /// One step: the workers send what is due, virtual time moves to the
    /// next delivery or timer (at most 1 ms on: the switches' timers), and
    /// everything due arrives.
    fn step(&mut self) {
        let at = self.base + self.now;
        for (i, ws) in self.workers.iter_mut().enumerate() {
            for (r, w) in ws.iter_mut().enumerate() {
                match w.m.handle_timeout(at) {
                    None => {}
                    Some(Event::Stalled { waiting, .. }) => {
                        // Reported again while it lasts: the first says it.
                        let who = (i, r as u16);
                        if !self.stalls.iter().any(|(w, _)| *w == who) {
                            self.stalls.push((who, waiting));
                        }
                    }
                    Some(e) => panic!("leaf {i} rank {r} at {:?}: {e:?}", self.now),
                }
                let from = worker_ep(i, r as u16);
                let mut out = Vec::new();
                while let Some(t) = w.m.poll_control(at) {
                    out.push(t.bytes().to_vec());
                }
                while let Some((_, bytes)) = w.poll_data(at) {
                    out.push(bytes);
                }
                for bytes in out {
                    self.net.send(self.faults, self.now, || Msg {
                        to: Node::Leaf(i),
                        from,
                        bytes: bytes.clone(),
                    });
                }
            }
        }
        let timers = self
            .workers
            .iter()
            .flatten()
            .filter_map(|w| w.m.poll_timeout());
        let next = self
            .net
            .next_delivery()
            .into_iter()
            .chain(timers.map(|t| t - self.base))
            .fold(self.now + Duration::from_millis(1), Duration::min);
        self.now = next.max(self.now);
        for node in (0..LEAVES)
            .map(Node::Leaf)
            .chain((0..SPINES).map(Node::Spine))
        {
            self.deliver(node, None);
        }
        while let Some(m) = self.net.pop_due(self.now) {
            if let (Some((i, k)), Node::Leaf(to)) = (self.cut, m.to) {
                let result = proto::wire::Header::new_checked(&m.bytes[..])
                    .is_ok_and(|h| h.msg_type_raw() == proto::wire::MsgType::Result as u8);
                if to == i && m.from == spine_ep(k) && !result {
                    continue;
                }
            }
            match m.to {
                Node::Worker { leaf, rank } => self.at_worker(leaf, rank, &m.bytes),
                node => self.deliver(node, Some((&m.bytes[..], m.from))),
            }
        }
    }

    /// Steps until `until` holds; panics after `limit` of virtual time.
    fn run_until(&mut self, limit: Duration, mut until: impl FnMut(&Sim) -> bool) {
        let end = self.now + limit;
        while !until(self) {
            assert!(self.now < end, "hang at {:?}", self.now);
            self.step();
        }
    }

    /// Every worker has the tree-order sum, bit for bit.
    fn check_sums(&self) {
        let want = self.want();
        for (i, ws) in self.workers.iter().enumerate() {
            for (r, w) in ws.iter().enumerate() {
                let got: Vec<u32> = w.output.iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "leaf {i} rank {r}: not the tree-order sum");
            }
        }
    }

    /// The leaves' job id (the same on both: the name picks it).
    fn job_id(&self) -> u16 {
        let ids: Vec<u16> = self
            .leaves
            .iter()
            .map(|l| l.table().jobs().next().expect("the leaf's job").id())
            .collect();
        assert!(ids.iter().all(|&id| id == ids[0]), "{ids:?}");
        ids[0]
    }

    /// Steps for `d` of virtual time.
    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.step();
        }
    }

    /// Leaf `i`'s session with spine `k`: (joined generation, state,
    /// provisioning rounds, refusals).
    fn session(&self, i: usize, k: usize) -> (Option<u32>, SpineSessionState, u64, u64) {
        let t = self.leaves[i].table();
        let job = t.jobs().next().expect("the leaf's job");
        let s = &job.uplink().expect("a leaf job").spines[k];
        (
            s.joined_gen,
            s.state(),
            s.counters.provisions,
            s.counters.refusals,
        )
    }

    /// Each spine made the leaves' job under their id: `n_leaves` workers,
    /// tenant vision's job `tree-run-1`.
    fn check_spine_jobs(&self) {
        let id = self.job_id();
        for (k, s) in self.spines.iter().enumerate() {
            let t = s.table();
            assert_eq!(t.tenant_usage("vision").unwrap().0, 1, "spine {k}");
            let job = t
                .get(id)
                .unwrap_or_else(|| panic!("spine {k} has job {id}"));
            assert_eq!(job.n_workers(), LEAVES as u16);
            let JobOrigin::Provisioned { tenant, name } = job.origin() else {
                panic!("spine {k}: {:?}", job.origin());
            };
            assert_eq!((tenant.as_str(), name.as_str()), ("vision", JOB_NAME));
        }
    }
}

fn tree_provisions_and_sums(faults: Faults, seed: u64) {
    let mut sim = Sim::new(3000, faults, seed, [8; SPINES], Duration::from_secs(20));
    sim.run_until(Duration::from_secs(20), Sim::done);
    sim.check_sums();
    sim.check_spine_jobs();
    let id = sim.job_id();
    assert!((40000..=40999).contains(&id));
    // Every worker provisioned the leaf's job once; one per leaf made it.
    assert_eq!(
        sim.provisioned.len(),
        LEAVES * W as usize,
        "{:?}",
        sim.provisioned
    );
    assert!(sim.provisioned.iter().all(|p| p.0 == id));
    assert_eq!(sim.provisioned.iter().filter(|p| p.1).count(), LEAVES);
    for i in 0..LEAVES {
        for k in 0..SPINES {
            let (gen, state, provisions, refusals) = sim.session(i, k);
            assert_eq!(gen, Some(100 + k as u32), "leaf {i} spine {k}");
            assert_eq!(state, SpineSessionState::Joined);
            assert!(provisions >= 1, "leaf {i} spine {k}: {provisions}");
            assert_eq!(refusals, 0, "leaf {i} spine {k}");
        }
        // The leaf's job is the tenant's, made by its workers, and
        // provisions itself on the spines.
        let t = sim.leaves[i].table();
        assert_eq!(t.tenant_usage("vision").unwrap().0, 1);
        let job = t.get(id).unwrap();
        assert!(job.uplink().unwrap().is_provisioned_job());
        assert!(matches!(job.origin(), JobOrigin::Provisioned { .. }));
    }
}

#[test]
fn two_leaves_provision_their_job_on_two_spines_and_sum_in_tree_order() {
    tree_provisions_and_sums(CLEAN, 1);
}

#[test]
fn provisioning_a_tree_survives_loss_duplication_and_reordering() {
    for seed in [2, 3, 4] {
        tree_provisions_and_sums(ALL_FAULTS, seed);
    }
    let heavy = Faults {
        loss: 0.15,
        dup: 0.1,
        reorder: 0.4,
    };
    tree_provisions_and_sums(heavy, 5);
}

/// Spine 0 restarts in the middle of the collective: a new table of a new
/// generation, the same tenant, no job. The leaves' partials to it and
/// their HEARTBEATs go unanswered, so they probe it; its NACK 1 (or, once
/// the other leaf has made the job again, a CHALLENGE under the new
/// generation) makes them provision again, under the same id, and join
/// with their resume points: the sum is still the tree-order sum.
#[test]
fn a_spine_restart_mid_collective_makes_the_leaves_provision_again() {
    for (faults, seed) in [(CLEAN, 7), (ALL_FAULTS, 8)] {
        let mut sim = Sim::new(9000, faults, seed, [8; SPINES], Duration::from_secs(20));
        // Until some chunks completed, and not all.
        sim.run_until(Duration::from_secs(20), |s| {
            s.workers[0][0].coll().n_chunks() > 0
                && s.workers[0][0].coll().oldest_unacked_seq() >= 4
        });
        assert!(!sim.done(), "the restart comes mid-collective");
        let id = sim.job_id();
        sim.spines[0] = spine(0, 200, 8, sim.base + sim.now);
        sim.run_until(Duration::from_secs(30), Sim::done);
        sim.check_sums();
        sim.check_spine_jobs();
        assert_eq!(sim.job_id(), id);
        for i in 0..LEAVES {
            let (gen, state, provisions, _) = sim.session(i, 0);
            assert_eq!(gen, Some(200), "leaf {i} joined the restarted spine");
            assert_eq!(state, SpineSessionState::Joined);
            assert!(provisions >= 2, "leaf {i} provisioned again: {provisions}");
            // Spine 1 was not disturbed.
            let (gen, _, provisions, _) = sim.session(i, 1);
            assert_eq!((gen, provisions), (Some(101), 1), "leaf {i}");
        }
        let t = sim.spines[0].table();
        assert_eq!(
            t.table_counters().provisioned_jobs,
            1,
            "one leaf made it again"
        );
    }
}

/// Spine 1's tenant allows 1 worker per job, the tree needs 2 (its
/// leaves): each leaf logs the refusal once, naming the quota, asks again
/// about once a second, and a stalled worker's HEARTBEAT answer says why
/// (what its stall error prints). Fixed by the operator (the tenant
/// replaced), the leaves provision the job there and the collective
/// completes, the tree-order sum.
#[test]
fn a_spine_quota_refusal_is_named_and_asked_again_until_fixed() {
    let mut sim = Sim::new(2000, CLEAN, 9, [8, 1], Duration::from_secs(2));
    let why = SpineRefusal::ProvisionQuota(Quota::MaxWorkersPerJob);
    sim.run_until(Duration::from_secs(10), |s| {
        s.stalls.len() == LEAVES * W as usize
    });
    let start = sim.now;
    sim.run_until(Duration::from_secs(10), |s| {
        s.now >= start + Duration::from_millis(3500)
    });
    for i in 0..LEAVES {
        let (gen, state, provisions, refusals) = sim.session(i, 1);
        assert_eq!(gen, None, "leaf {i}");
        assert_eq!(state, SpineSessionState::Refused(why), "leaf {i}");
        assert!(
            (4..=9).contains(&refusals) && provisions.abs_diff(refusals) <= 1,
            "leaf {i}: about once a second in 3.5 s and more: {provisions} rounds, {refusals} refusals"
        );
        // Spine 0 took the job.
        assert_eq!(sim.session(i, 0).1, SpineSessionState::Joined, "leaf {i}");
        let refused: Vec<_> = std::iter::from_fn(|| sim.leaves[i].table().poll_event())
            .filter_map(|e| match e {
                SwitchEvent::SpineRefused { tree, why, .. } => Some((tree, why)),
                _ => None,
            })
            .collect();
        assert_eq!(refused, [(1, why)], "leaf {i}: logged once");
    }
    // What the stalled workers were told: spine 1 refuses, and why.
    let said: Vec<_> = sim
        .stalls
        .iter()
        .map(|(who, w)| match w {
            Some(Waiting::Spine(s)) => (s.tree, s.refused),
            other => panic!("worker {who:?} stalled without the spine's refusal: {other:?}"),
        })
        .collect();
    assert!(said.iter().all(|&s| s == (1, Some(why))), "{said:?}");
    let text = why.to_string();
    assert!(
        text.contains("max_workers_per_job") && text.contains("n_leaves"),
        "{text}"
    );
    // The spine made nothing and kept nothing.
    assert_eq!(sim.spines[1].table().tenant_usage("vision").unwrap().0, 0);
    assert!(sim.spines[1].table().table_counters().provision_refused >= 8);

    // Fixed: the leaves provision within their retry and the sum completes.
    {
        let mut t = sim.spines[1].table();
        t.remove_tenant("vision").unwrap();
        t.add_tenant(spine_tenant(8)).unwrap();
    }
    sim.run_until(Duration::from_secs(5), Sim::done);
    sim.check_sums();
    sim.check_spine_jobs();
    for i in 0..LEAVES {
        assert_eq!(sim.session(i, 1).1, SpineSessionState::Joined, "leaf {i}");
    }
}

/// The operator removes the job from spine 1 mid-collective (`switchctl
/// job rm`), the spine runs on under its generation. A leaf's partials get
/// NACK 1 (untagged: it probes), the probe's NACK 1 says the job is gone,
/// and it provisions it again at once (the spine had acknowledged its JOIN
/// since its last PROVISIONED). The other leaf, if the job is back by
/// then, gets NACK 6 from the new job (untagged), its probe is answered
/// under the same generation, and its HEARTBEATs are not (it is no member
/// of the new job): it provisions again too. Both resume; the sum is the
/// tree-order sum. (Clean links: a RESULT lost to one leaf just before the
/// removal would split the chunk, which no spine can sum again:
/// docs/PROTOCOL.md, "Aggregation trees", What a dead spine means.)
#[test]
fn a_spine_job_removed_mid_collective_is_provisioned_again() {
    let mut sim = Sim::new(9000, CLEAN, 11, [8; SPINES], Duration::from_secs(20));
    sim.run_until(Duration::from_secs(20), |s| {
        s.workers[1][1].coll().n_chunks() > 0 && s.workers[1][1].coll().oldest_unacked_seq() >= 5
    });
    assert!(!sim.done(), "the removal comes mid-collective");
    let id = sim.job_id();
    assert!(sim.spines[1].table().remove(id).is_some());
    sim.run_until(Duration::from_secs(20), Sim::done);
    sim.check_sums();
    sim.check_spine_jobs();
    for i in 0..LEAVES {
        let (gen, state, provisions, refusals) = sim.session(i, 1);
        assert_eq!((gen, state), (Some(101), SpineSessionState::Joined));
        assert!(provisions >= 2, "leaf {i} provisioned again: {provisions}");
        assert_eq!(refusals, 0, "leaf {i}: the spine had the job before");
    }
    assert_eq!(
        sim.spines[1].table().table_counters().provisioned_jobs,
        2,
        "made, removed, made again"
    );
}

/// A spine that forgets the job it has just provisioned (removed between
/// its PROVISIONED and the leaf's HELLO): the HELLO's NACK 1 is a refusal
/// (logged, "the spine has no such job"), not a reason to provision again
/// at once: a second later the leaf provisions again, joins, and the
/// collective completes.
#[test]
fn a_spine_that_forgets_a_job_it_just_made_is_asked_again_a_second_later() {
    let mut sim = Sim::new(2000, CLEAN, 12, [8; SPINES], Duration::from_secs(20));
    let provisioned_not_joined = |sim: &Sim| {
        (0..LEAVES).find(|&i| {
            let t = sim.leaves[i].table();
            let spine1 = t.jobs().next().and_then(|j| j.uplink()).map(|u| {
                let s = &u.spines[1];
                s.provisioned && s.joined_gen.is_none()
            });
            spine1 == Some(true)
        })
    };
    let mut found = None;
    while found.is_none() {
        assert!(
            sim.now < Duration::from_secs(5),
            "spine 1 never provisioned"
        );
        sim.step();
        found = provisioned_not_joined(&sim);
    }
    let leaf = found.unwrap();
    let id = sim.job_id();
    let forgot_at = sim.now;
    assert!(sim.spines[1].table().remove(id).is_some());
    sim.run_until(Duration::from_secs(10), Sim::done);
    assert!(
        sim.now >= forgot_at + Duration::from_secs(1),
        "not before the retry: {:?}",
        sim.now - forgot_at
    );
    sim.check_sums();
    sim.check_spine_jobs();
    let (_, state, provisions, refusals) = sim.session(leaf, 1);
    assert_eq!(state, SpineSessionState::Joined);
    assert_eq!((provisions, refusals), (2, 1), "leaf {leaf}");
    let why = SpineRefusal::Nack(proto::wire::NackReason::UnknownJob);
    assert!(
        std::iter::from_fn(|| sim.leaves[leaf].table().poll_event()).any(|e| matches!(
            e,
            SwitchEvent::SpineRefused { tree: 1, why: w, .. } if w == why
        )),
        "leaf {leaf} logged the refusal"
    );
}

/// The job is removed from spine 1 (the spine runs on, same generation)
/// and leaf 0 hears nothing from spine 1 meanwhile (the RESULTs in flight
/// arrive: no chunk is split), while leaf 1 finds out
/// and makes the job again there. Then leaf 0's partials get NACK 6 from
/// the new job, untagged (leaf 0 is no member of it), which only makes it
/// probe; the probe is answered under the same generation, so it is no
/// restart, but the spine answers none of leaf 0's HEARTBEATs before or
/// after: leaf 0 provisions again (the job is there: PROVISIONED, not
/// created), joins, and the collective completes, the tree-order sum.
#[test]
fn a_leaf_that_missed_its_spine_job_being_made_again_provisions_again() {
    let mut sim = Sim::new(9000, CLEAN, 13, [8; SPINES], Duration::from_secs(30));
    sim.run_until(Duration::from_secs(20), |s| {
        s.workers[0][0].coll().n_chunks() > 0 && s.workers[0][0].coll().oldest_unacked_seq() >= 5
    });
    assert!(!sim.done());
    let id = sim.job_id();
    // Spine 1 says nothing but the RESULTs in flight to leaf 0 meanwhile.
    sim.cut = Some((0, 1));
    assert!(sim.spines[1].table().remove(id).is_some());
    sim.run_until(Duration::from_secs(5), |s| {
        s.session(1, 1).2 >= 2 && s.spines[1].table().get(id).is_some()
    });
    sim.run_for(Duration::from_secs(1));
    assert_eq!(
        sim.session(0, 1).0,
        Some(101),
        "leaf 0 still thinks it is joined"
    );
    assert_eq!(sim.session(0, 1).2, 1);
    sim.cut = None;
    sim.run_until(Duration::from_secs(20), Sim::done);
    sim.check_sums();
    sim.check_spine_jobs();
    let t = sim.leaves[0].table();
    let s = &t.jobs().next().unwrap().uplink().unwrap().spines[1];
    assert_eq!(s.joined_gen, Some(101));
    assert_eq!(s.counters.provisions, 2, "{:?}", s.counters);
    assert!(s.counters.spoofed_triggers >= 1, "{:?}", s.counters);
    assert_eq!(s.counters.probed_restarts, 0, "{:?}", s.counters);
    drop(t);
    assert_eq!(sim.spines[1].table().table_counters().provisioned_jobs, 2);
}

/// NACKs forged with a spine's address (untagged: 1, 6, 7, 11, 12; a
/// quota's detail too) change nothing at a leaf of a provisioned job: it
/// probes, the probe is answered under its session's generation, and it
/// neither provisions again nor leaves the spine; the next collective runs
/// through the same sessions.
#[test]
fn forged_spine_nacks_do_not_make_a_leaf_provision_again() {
    use proto::wire::{HeaderRepr, MsgType, NackPayload, NackReason, NACK_PAYLOAD_LEN};
    let mut sim = Sim::new(3000, CLEAN, 14, [8; SPINES], Duration::from_secs(20));
    sim.run_until(Duration::from_secs(20), Sim::done);
    let id = sim.job_id();
    for reason in [
        NackReason::UnknownJob,
        NackReason::JobNotActive,
        NackReason::StaleGeneration,
        NackReason::QuotaExceeded,
        NackReason::UnknownTenant,
    ] {
        let mut h = HeaderRepr::new(MsgType::Nack, id);
        h.gen = 101;
        let mut p = [0u8; NACK_PAYLOAD_LEN];
        NackPayload {
            detail: Quota::MaxJobs as u16,
            ..NackPayload::new(reason)
        }
        .emit(&mut p)
        .unwrap();
        let bytes = common::frame(&h, &p);
        sim.net.send(CLEAN, sim.now, || Msg {
            to: Node::Leaf(0),
            from: spine_ep(1),
            bytes: bytes.clone(),
        });
    }
    sim.run_for(Duration::from_secs(2));
    let (gen, state, provisions, refusals) = sim.session(0, 1);
    assert_eq!((gen, state), (Some(101), SpineSessionState::Joined));
    assert_eq!((provisions, refusals), (1, 0));
    {
        let t = sim.leaves[0].table();
        let c = &t.jobs().next().unwrap().uplink().unwrap().spines[1].counters;
        assert_eq!(c.unauthenticated, 5, "{c:?}");
        assert_eq!(c.spoofed_triggers, 1, "{c:?}");
    }
    // A second collective, through the same sessions.
    for ws in &mut sim.workers {
        for w in ws.iter_mut() {
            let seq = w.coll().end_seq();
            w.output = vec![f32::NAN; sim.len];
            w.begin(1, seq, Shape::all_reduce(sim.len));
        }
    }
    sim.run_until(Duration::from_secs(10), Sim::done);
    sim.check_sums();
    assert_eq!(sim.session(0, 1).2, 1, "still the first round");
}
