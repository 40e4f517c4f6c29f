//! Workers of a self-provisioned job and the real switch (its entry point
//! and job table with a tenant) over a simulated network that loses,
//! duplicates and reorders, in virtual time: every rank provisions the job
//! by tenant and name (one creates it, all reach it), joins it with the
//! derived secret and gets the rank-order sum bit for bit; a switch restart
//! (a new table of a new generation, the same tenant, no jobs) in the
//! middle of a collective makes every rank provision again and resume; a
//! quota refusal reaches the member as a typed error naming the quota
//! (docs/PROTOCOL.md, "Tenants and self-provisioned jobs").

use std::time::{Duration, Instant};

use proto::member::{Event, Member, Shape};
use proto::provision::{JobName, TenantName};
use proto::provisioner::ProvisionSpec;
use proto::reference::rank_order_sum;
use proto::session::{SessionConfig, SessionError};
use proto::switch::entry::Switch;
use proto::switch::tenant::{TenantConfig, DEFAULT_LEASE};
use proto::switch::{Endpoint, Ipv4Prefix, JobTable, Priority, TableConfig};
use proto::tag::AuthMode;
use proto::wire::{Dtype, Quota};

mod common;
use common::{join_params, Faults, Links, Paths, Worker, ALL_FAULTS, CLEAN};

const KEY: [u8; 32] = [0x6b; 32];

enum Msg {
    ToSwitch { rank: u16, bytes: Vec<u8> },
    ToWorker { rank: u16, bytes: Vec<u8> },
}

fn endpoint(rank: u16) -> Endpoint {
    common::endpoint(rank, 3000)
}

fn tenant(max_jobs: u16) -> TenantConfig {
    TenantConfig {
        name: TenantName::new("vision").unwrap(),
        key: KEY,
        allowed_sources: vec![Ipv4Prefix {
            addr: [198, 18, 0, 0],
            len: 24,
        }],
        max_jobs,
        max_workers_per_job: 8,
        max_pool_bytes: 1 << 30,
        dtypes: Dtype::ALL.to_vec(),
        auth: vec![AuthMode::Port, AuthMode::Mac],
        max_priority: Priority::Normal,
        job_ids: (40000, 40999),
        lease: DEFAULT_LEASE,
        pool_slots: 16,
        upstream: None,
    }
}

/// A switch of generation `gen` with tenant `vision` and no jobs.
fn switch(gen: u32, max_jobs: u16, now: Instant) -> Switch {
    let mut t = JobTable::new(TableConfig::new(gen, [gen as u8; 32]), now);
    t.add_tenant(tenant(max_jobs)).unwrap();
    Switch::new(t)
}

fn spec(job: &str) -> ProvisionSpec {
    ProvisionSpec {
        tenant: TenantName::new("vision").unwrap(),
        key: KEY,
        job_name: JobName::new(job).unwrap(),
        auth: AuthMode::Port,
        stats: false,
        priority: 1,
    }
}

fn member(rank: u16, n: u16, job: &str, now: Instant) -> Member {
    let from = endpoint(rank);
    let mut params = join_params(0, n, Dtype::F32, [0; 32], rank, &from);
    params.provision = Some(spec(job));
    let scfg = SessionConfig {
        join_timeout: Duration::from_secs(20),
        stall_timeout: Duration::from_secs(20),
    };
    let mut m = Member::new(params, scfg, common::transport(), [rank as u8 + 90; 32]);
    m.start_join(0, 0, now);
    m
}

fn at_switch(
    (switch, paths): (&Switch, &mut Paths),
    net: &mut Links<Msg>,
    faults: Faults,
    rank: u16,
    bytes: &[u8],
    (base, now): (Instant, Duration),
) {
    let h = common::at_switch(
        switch,
        common::thread_of(rank),
        bytes,
        endpoint(rank),
        base + now,
        |rank, b| {
            net.send(faults, now, || Msg::ToWorker {
                rank,
                bytes: b.to_vec(),
            })
        },
    );
    paths.count(bytes, h);
}

/// What [`run`] saw.
struct Run {
    /// Provisioned events (job id, created) per rank, in order.
    provisioned: Vec<Vec<(u16, bool)>>,
    rejoins: Vec<u64>,
    gens: Vec<u32>,
}

/// One all-reduce of `len` elements by `n` ranks of tenant `vision`'s job
/// `run-1`, everything over the faulty network; the switch restarts once
/// rank 0 has `restart_at` chunks answered (never: `None`). Panics on a
/// wrong bit, a failure or a hang.
fn run(n: u16, len: usize, faults: Faults, seed: u64, restart_at: Option<u32>) -> Run {
    let base = Instant::now();
    let mut sw = switch(1, 4, base);
    let mut paths = Paths::default();
    let mut net: Links<Msg> = Links::new(seed);
    let mut workers: Vec<Worker> = (0..n)
        .map(|rank| {
            let mut w = Worker::new(member(rank, n, "run-1", base), Dtype::F32);
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
    let mut provisioned = vec![Vec::new(); n as usize];
    let mut now = Duration::ZERO;
    let mut restarted = false;
    let mut steps = 0u64;
    let done = |w: &Worker| w.coll().n_chunks() > 0 && w.coll().is_complete();
    while !workers.iter().all(done) {
        steps += 1;
        assert!(steps < 5_000_000, "hang at {now:?}");
        let at = base + now;
        for (r, w) in workers.iter_mut().enumerate() {
            if let Some(e) = w.m.handle_timeout(at) {
                panic!("rank {r} at {now:?}: {e:?} {:?}", w.m.session().stats());
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
        let timers = workers.iter().map(|w| w.m.poll_timeout());
        let next = net
            .next_delivery()
            .into_iter()
            .chain(timers.flatten().map(|t| t - base))
            .min()
            .expect("something in flight or due");
        now = now.max(next);
        if let Some(k) = restart_at {
            if !restarted && workers[0].coll().oldest_unacked_seq() >= k {
                restarted = true;
                assert!(workers.iter().all(|w| !done(w)), "restart_at is too late");
                sw = switch(2, 4, base + now);
            }
        }
        while let Some(m) = net.pop_due(now) {
            match m {
                Msg::ToSwitch { rank, bytes } => at_switch(
                    (&sw, &mut paths),
                    &mut net,
                    faults,
                    rank,
                    &bytes,
                    (base, now),
                ),
                Msg::ToWorker { rank, bytes } => {
                    let w = &mut workers[rank as usize];
                    match w.m.handle(&bytes, base + now) {
                        None | Some(Event::Rejoining(_)) => {}
                        Some(Event::Provisioned { job, created, .. }) => {
                            provisioned[rank as usize].push((job, created))
                        }
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
                        Some(e) => panic!("rank {rank}: {e:?}"),
                    }
                }
            }
        }
    }
    for (r, w) in workers.iter().enumerate() {
        let got: Vec<u32> = w.output.iter().map(|x| x.to_bits()).collect();
        assert_eq!(got, want, "rank {r}: not the rank-order sum");
    }
    // The tenant has the one job, on the switch now running.
    assert_eq!(sw.table().tenant_usage("vision").unwrap().0, 1);
    Run {
        provisioned,
        rejoins: workers
            .iter()
            .map(|w| w.m.session().stats().rejoins)
            .collect(),
        gens: workers.iter().map(|w| w.m.session().gen()).collect(),
    }
}

#[test]
fn four_ranks_provision_one_job_and_all_reduce_bit_exact() {
    for (faults, seed) in [(CLEAN, 1), (ALL_FAULTS, 2), (ALL_FAULTS, 3)] {
        let r = run(4, 3000, faults, seed, None);
        // Every rank provisioned exactly once, the same job; one made it.
        let firsts: Vec<(u16, bool)> = r.provisioned.iter().map(|p| p[0]).collect();
        assert!(
            r.provisioned.iter().all(|p| p.len() == 1),
            "{:?}",
            r.provisioned
        );
        assert!(firsts
            .iter()
            .all(|p| p.0 == firsts[0].0 && (40000..=40999).contains(&p.0)));
        assert_eq!(firsts.iter().filter(|p| p.1).count(), 1, "{firsts:?}");
        assert!(r.gens.iter().all(|&g| g == 1));
    }
}

#[test]
fn a_switch_restart_mid_collective_makes_every_rank_provision_again_and_resume() {
    for seed in [5, 6] {
        let r = run(4, 6000, ALL_FAULTS, seed, Some(3));
        // Members learn of the restart by a NACK 1 (they provision again)
        // or, once another rank re-made the job under the same id, by the
        // new generation of its CHALLENGE (they rejoin with the same
        // derived secret); all end on the same job.
        for p in &r.provisioned {
            assert_eq!(p.last().unwrap().0, r.provisioned[0].last().unwrap().0);
        }
        assert!(
            r.provisioned.iter().any(|p| p.len() >= 2),
            "{:?}",
            r.provisioned
        );
        assert!(r.rejoins[0] >= 1, "rank 0 never rejoined: {:?}", r.rejoins);
        // One rank created the job on each switch.
        let created = r.provisioned.iter().flatten().filter(|p| p.1).count();
        assert_eq!(created, 2, "{:?}", r.provisioned);
        assert!(r.gens.iter().all(|&g| g == 2), "{:?}", r.gens);
    }
}

#[test]
fn a_quota_refusal_reaches_the_member_as_an_error_naming_the_quota() {
    let base = Instant::now();
    let sw = switch(1, 1, base);
    let mut paths = Paths::default();
    let mut net: Links<Msg> = Links::new(9);
    // Job "a" takes the tenant's one job; "b" is over max_jobs.
    let mut a = member(0, 1, "a", base);
    let mut b = member(1, 1, "b", base);
    let mut failed = None;
    let mut now = Duration::ZERO;
    for _ in 0..1000 {
        let at = base + now;
        for (rank, m) in [(0u16, &mut a), (1, &mut b)] {
            while let Some(t) = m.poll_control(at) {
                let bytes = t.bytes().to_vec();
                net.send(CLEAN, now, || Msg::ToSwitch {
                    rank,
                    bytes: bytes.clone(),
                });
            }
        }
        while let Some(msg) = net.pop_due(now) {
            match msg {
                Msg::ToSwitch { rank, bytes } => at_switch(
                    (&sw, &mut paths),
                    &mut net,
                    CLEAN,
                    rank,
                    &bytes,
                    (base, now),
                ),
                Msg::ToWorker { rank, bytes } => {
                    let m = if rank == 0 { &mut a } else { &mut b };
                    if let Some(Event::Failed(e)) = m.handle(&bytes, at) {
                        assert_eq!(rank, 1, "{e}");
                        failed = Some(e);
                    }
                }
            }
        }
        if failed.is_some() && a.session().is_joined() {
            break;
        }
        now += Duration::from_millis(1);
    }
    let e = failed.expect("job b refused");
    let SessionError::Provision(p) = e else {
        panic!("{e:?}")
    };
    assert_eq!(p.quota(), Some(Quota::MaxJobs));
    let msg = e.to_string();
    assert!(
        msg.contains("max_jobs") && msg.contains(Quota::MaxJobs.advice()),
        "{msg}"
    );
    assert!(a.session().is_joined());
    assert_eq!(sw.table().tenant_usage("vision").unwrap().0, 1);
}

/// A provisioned job's life across pauses and removals: `n` ranks of job
/// `life` on a switch whose tenant leases jobs for `lease`, everything
/// over the faulty network, the switch's timers (its lease) run at every
/// step; ranks in `stopped` are not driven (a dead process), and datagrams
/// to ranks in `deaf` are lost.
struct Life {
    sw: Switch,
    paths: Paths,
    net: Links<Msg>,
    faults: Faults,
    workers: Vec<Worker>,
    base: Instant,
    now: Duration,
    len: usize,
    /// The collective each rank runs now (its inputs' pattern).
    collective: u32,
    stopped: Vec<bool>,
    deaf: Vec<bool>,
    /// Every Rejoining event: (rank, why).
    rejoins: Vec<(u16, proto::session::Lost)>,
    /// Every Provisioned event: (rank, job, created).
    provisioned: Vec<(u16, u16, bool)>,
}

impl Life {
    fn new(n: u16, len: usize, lease: Duration, faults: Faults, seed: u64) -> Life {
        let base = Instant::now();
        let mut t = JobTable::new(TableConfig::new(1, [1; 32]), base);
        t.add_tenant(TenantConfig { lease, ..tenant(4) }).unwrap();
        let workers = (0..n)
            .map(|rank| Worker::new(member(rank, n, "life", base), Dtype::F32))
            .collect();
        let mut l = Life {
            sw: Switch::new(t),
            paths: Paths::default(),
            net: Links::new(seed),
            faults,
            workers,
            base,
            now: Duration::ZERO,
            len,
            collective: 0,
            stopped: vec![false; n as usize],
            deaf: vec![false; n as usize],
            rejoins: Vec::new(),
            provisioned: Vec::new(),
        };
        l.set_inputs(0);
        l
    }

    /// Collective `c`'s inputs and a fresh output on every rank.
    fn set_inputs(&mut self, c: u32) {
        self.collective = c;
        for (rank, w) in self.workers.iter_mut().enumerate() {
            w.input = (0..self.len)
                .map(|i| proto::reference::pattern_dtype(Dtype::F32, rank as u16, c, i))
                .collect();
            w.output = vec![f32::NAN; self.len];
        }
    }

    /// Every rank begins collective `c` where the last one ended.
    fn begin(&mut self, c: u32) {
        self.set_inputs(c);
        let len = self.len;
        for w in &mut self.workers {
            let seq = w.coll().end_seq();
            w.begin(c, seq, Shape::all_reduce(len));
        }
    }

    fn done(&self) -> bool {
        self.workers
            .iter()
            .all(|w| w.coll().n_chunks() > 0 && w.coll().is_complete())
    }

    /// The job the switch has now (its id), if any.
    fn job(&self) -> Option<u16> {
        self.sw.table().jobs().next().map(|j| j.id())
    }

    fn step(&mut self) {
        let at = self.base + self.now;
        for (r, w) in self.workers.iter_mut().enumerate() {
            if self.stopped[r] {
                continue;
            }
            match w.m.handle_timeout(at) {
                None => {}
                Some(Event::Rejoining(why)) => self.rejoins.push((r as u16, why)),
                Some(e) => panic!("rank {r} at {:?}: {e:?}", self.now),
            }
            while let Some(t) = w.m.poll_control(at) {
                let bytes = t.bytes().to_vec();
                self.net.send(self.faults, self.now, || Msg::ToSwitch {
                    rank: r as u16,
                    bytes: bytes.clone(),
                });
            }
            while let Some((_, bytes)) = w.poll_data(at) {
                self.net.send(self.faults, self.now, || Msg::ToSwitch {
                    rank: r as u16,
                    bytes: bytes.clone(),
                });
            }
        }
        let timers = self
            .workers
            .iter()
            .zip(&self.stopped)
            .filter(|(_, s)| !**s)
            .filter_map(|(w, _)| w.m.poll_timeout());
        // The switch's lease timer: at least every 100 ms.
        let next = self
            .net
            .next_delivery()
            .into_iter()
            .chain(timers.map(|t| t - self.base))
            .fold(self.now + Duration::from_millis(100), Duration::min);
        self.now = self.now.max(next);
        self.sw.table().handle_timeout(self.base + self.now);
        while let Some(m) = self.net.pop_due(self.now) {
            match m {
                Msg::ToSwitch { rank, bytes } => at_switch(
                    (&self.sw, &mut self.paths),
                    &mut self.net,
                    self.faults,
                    rank,
                    &bytes,
                    (self.base, self.now),
                ),
                Msg::ToWorker { rank, bytes } => {
                    if self.stopped[rank as usize] || self.deaf[rank as usize] {
                        continue;
                    }
                    let (len, c) = (self.len, self.collective);
                    let w = &mut self.workers[rank as usize];
                    match w.m.handle(&bytes, self.base + self.now) {
                        None => {}
                        Some(Event::Rejoining(why)) => self.rejoins.push((rank, why)),
                        Some(Event::Provisioned { job, created, .. }) => {
                            self.provisioned.push((rank, job, created))
                        }
                        Some(Event::Joined(j)) => {
                            if j.first {
                                w.begin(0, 0, Shape::all_reduce(len));
                            }
                            assert_eq!(j.collective, c, "rank {rank}: resumes this collective");
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

    fn run_until(&mut self, limit: Duration, mut until: impl FnMut(&Life) -> bool) {
        let end = self.now + limit;
        while !until(self) {
            assert!(self.now < end, "hang at {:?}", self.now);
            self.step();
        }
    }

    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.step();
        }
    }

    /// Every rank has the rank-order sum of this collective, bit for bit.
    fn check_sums(&self) {
        let inputs: Vec<&[f32]> = self.workers.iter().map(|w| &w.input[..]).collect();
        let want: Vec<u32> = rank_order_sum(&inputs)
            .iter()
            .map(|x| x.to_bits())
            .collect();
        for (r, w) in self.workers.iter().enumerate() {
            let got: Vec<u32> = w.output.iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want, "rank {r}: not the rank-order sum");
        }
    }
}

/// A training run that pauses between collectives (evaluation,
/// checkpointing) three times as long as its job's lease: the idle ranks'
/// keepalive HEARTBEATs (a third of the lease apart) keep the job, the
/// next collective runs on it, bit-exact, without a rejoin.
#[test]
fn an_idle_pause_of_three_leases_keeps_the_job() {
    for (faults, seed) in [(CLEAN, 21), (ALL_FAULTS, 22)] {
        let lease = Duration::from_secs(3);
        let mut l = Life::new(4, 2000, lease, faults, seed);
        l.run_until(Duration::from_secs(20), Life::done);
        l.check_sums();
        let id = l.job().expect("the job");
        let beats: Vec<u64> = l
            .workers
            .iter()
            .map(|w| w.m.session().stats().heartbeats_sent)
            .collect();
        assert!(l
            .workers
            .iter()
            .all(|w| w.m.session().keepalive() == Some(proto::session::keepalive_interval(3))));
        l.run_for(lease * 3);
        assert_eq!(l.job(), Some(id), "the job outlived its idle lease");
        for (r, w) in l.workers.iter().enumerate() {
            let sent = w.m.session().stats().heartbeats_sent - beats[r];
            // One a second for 9 s.
            assert!((8..=10).contains(&sent), "rank {r}: {sent} keepalives");
        }
        l.begin(1);
        l.run_until(Duration::from_secs(20), Life::done);
        l.check_sums();
        assert_eq!(l.job(), Some(id));
        assert!(l.rejoins.is_empty(), "{:?}", l.rejoins);
        let c = l.sw.table().table_counters();
        assert_eq!((c.provisioned_jobs, c.jobs_ended_lease), (1, 0));
    }
}

/// The same pause with every process gone (no keepalive): the job ends by
/// its lease and its pool goes back.
#[test]
fn a_job_whose_members_stopped_ends_by_lease() {
    let lease = Duration::from_secs(3);
    let mut l = Life::new(4, 2000, lease, CLEAN, 23);
    l.run_until(Duration::from_secs(20), Life::done);
    l.stopped = vec![true; 4];
    l.run_for(lease - Duration::from_millis(500));
    assert!(l.job().is_some(), "not before the lease");
    l.run_for(Duration::from_secs(1));
    assert_eq!(l.job(), None);
    let c = l.sw.table().table_counters();
    assert_eq!(c.jobs_ended_lease, 1);
    assert_eq!(l.sw.table().tenant_usage("vision").unwrap(), (0, 0));
}

/// The operator removes the job mid-collective (`JobTable::remove`;
/// a lease would do the same) while every rank lives, and rank 3 hears
/// nothing from the switch meanwhile. The others find the job gone (NACK
/// 1 to their DATA, then to their probe) and make it again, under the
/// same generation and id. Rank 3's HEARTBEATs then go unanswered (it is
/// no member of the new job); its probe is answered under its session's
/// generation, so it is no restart, and the HEARTBEAT after it goes
/// unanswered too: rank 3 provisions again (PROVISIONED, not created) and
/// joins; every rank resumes from the resume point and the sum is
/// bit-exact.
#[test]
fn a_job_removed_mid_run_is_made_again_and_every_rank_finishes() {
    for (faults, seed) in [(CLEAN, 24), (ALL_FAULTS, 25)] {
        let mut l = Life::new(4, 9000, DEFAULT_LEASE, faults, seed);
        l.run_until(Duration::from_secs(20), |l| {
            l.workers[0].coll().n_chunks() > 0 && l.workers[0].coll().oldest_unacked_seq() >= 5
        });
        assert!(!l.done(), "the removal comes mid-collective");
        let id = l.job().expect("the job");
        l.deaf[3] = true;
        assert!(l.sw.table().remove(id).is_some());
        l.run_until(Duration::from_secs(10), |l| {
            l.provisioned.iter().filter(|p| p.0 != 3).count() >= 6
        });
        assert_eq!(l.job(), Some(id), "made again under the same id");
        l.deaf[3] = false;
        l.run_until(Duration::from_secs(20), Life::done);
        l.check_sums();
        assert!(
            l.rejoins
                .iter()
                .any(|&(r, why)| r == 3 && why == proto::session::Lost::JobRemade),
            "{:?}",
            l.rejoins
        );
        let rank3: Vec<_> = l.provisioned.iter().filter(|p| p.0 == 3).collect();
        assert_eq!(rank3.len(), 2, "{rank3:?}");
        assert!(!rank3[1].2, "the job was there: PROVISIONED, not created");
        assert_eq!(l.sw.table().table_counters().provisioned_jobs, 2);
    }
}

/// NACKs forged with the switch's address (untagged: 1, 6, 7) to an idle
/// rank change nothing: it probes, the probe is answered under its
/// session's generation and its keepalives are answered, so it neither
/// provisions again nor rejoins; the next collective runs through the same
/// sessions.
#[test]
fn forged_nacks_do_not_make_a_rank_provision_again() {
    use proto::wire::{HeaderRepr, MsgType, NackPayload, NackReason, NACK_PAYLOAD_LEN};
    let mut l = Life::new(2, 2000, Duration::from_secs(3), CLEAN, 26);
    l.run_until(Duration::from_secs(20), Life::done);
    let id = l.job().unwrap();
    for round in 0..3 {
        for reason in [
            NackReason::UnknownJob,
            NackReason::JobNotActive,
            NackReason::StaleGeneration,
        ] {
            let mut h = HeaderRepr::new(MsgType::Nack, id);
            h.gen = 1;
            let mut p = [0u8; NACK_PAYLOAD_LEN];
            NackPayload::new(reason).emit(&mut p).unwrap();
            let bytes = common::frame(&h, &p);
            l.net.send(CLEAN, l.now, || Msg::ToWorker {
                rank: 0,
                bytes: bytes.clone(),
            });
        }
        // Forged again between keepalives, and right after one.
        l.run_for(Duration::from_millis(700 + 300 * round));
    }
    l.run_for(Duration::from_secs(3));
    let s = l.workers[0].m.session().stats();
    assert!(s.spoofed_triggers >= 1, "{s:?}");
    assert_eq!(s.rejoins, 0, "{s:?}");
    assert_eq!(l.provisioned.len(), 2, "{:?}", l.provisioned);
    l.begin(1);
    l.run_until(Duration::from_secs(20), Life::done);
    l.check_sums();
    assert!(l.rejoins.is_empty());
    assert_eq!(l.job(), Some(id));
}
