//! A session of a self-provisioned job in virtual time: PROVISION goes to a
//! hand-built switch side (`crate::provisioner::fake_switch`), everything
//! else to the real job table, which holds the job the fake side made
//! (same id, the derived secret), as a switch with tenants would.

use super::*;
use crate::provision::{JobName, TenantName};
use crate::provisioner::fake_switch::FakeSwitch;
use crate::provisioner::ProvisionSpec;
use crate::switch::{Endpoint, Ipv4Prefix, JobConfig, JobTable, Source, TableConfig};
use crate::wire::{Quota, OP_SUM};

const KEY: [u8; 32] = [0x42; 32];
const ID: u16 = 32768;

fn endpoint(rank: u16) -> Endpoint {
    Endpoint {
        source: Source {
            mac: [2, 0, 0, 0, 0, rank as u8],
            ip: [198, 18, 0, 10],
            port: 1000 + rank,
        },
        ..Endpoint::default()
    }
}

fn spec() -> ProvisionSpec {
    ProvisionSpec {
        tenant: TenantName::new("vision").unwrap(),
        key: KEY,
        job_name: JobName::new("run-0123456789abcdef").unwrap(),
        auth: AuthMode::Port,
        stats: false,
        priority: 1,
    }
}

/// A switch: tenants (the fake side) and jobs (the table).
struct Switch {
    prov: FakeSwitch,
    table: JobTable,
}

impl Switch {
    fn new(gen: u32, now: Instant) -> Switch {
        Switch {
            prov: FakeSwitch::new(gen, "vision", KEY, now),
            table: JobTable::new(TableConfig::new(gen, [5; 32]), now),
        }
    }

    /// The table learns the jobs the fake side made.
    fn sync(&mut self, n: u16) {
        for &(id, _) in self.prov.jobs.values() {
            if self.table.get(id).is_none() {
                self.table
                    .add(
                        JobConfig {
                            id,
                            n_workers: n,
                            allowed_sources: vec![Ipv4Prefix {
                                addr: [198, 18, 0, 0],
                                len: 24,
                            }],
                            secret: spec().job_secret(),
                            pool_slots: 4,
                            elems_per_chunk: 2,
                            dtype: Dtype::F32,
                            window: 4,
                            priority: Default::default(),
                            auth: AuthMode::Port,
                            upstream: None,
                            stats: false,
                        },
                        64,
                    )
                    .unwrap();
            }
        }
    }

    /// Delivers `x` from `rank`; returns the answers.
    fn deliver(&mut self, x: &Transmit, rank: u16, n: u16, now: Instant) -> Vec<Vec<u8>> {
        let e = endpoint(rank);
        if x.msg_type == MsgType::Provision {
            let a = self.prov.answer(x.bytes(), e.source.ip, e.source.port, now);
            self.sync(n);
            return vec![a];
        }
        self.table.handle(x.bytes(), e, false, now);
        let mut out = Vec::new();
        while let Some(r) = self.table.poll_reply() {
            let mut b = vec![0u8; 2048];
            if let Some(enc) = self.table.encode(&r, &mut b) {
                b.truncate(enc.len);
                out.push(b);
            }
        }
        out
    }
}

fn session(rank: u16, n: u16) -> WorkerSession {
    let e = endpoint(rank);
    let params = JoinParams {
        job: 0,
        rank,
        n_workers: n,
        dtype: Dtype::F32 as u8,
        op: OP_SUM,
        secret: [0; 32],
        ip: e.source.ip,
        port: e.source.port,
        provision: Some(spec()),
    };
    let cfg = SessionConfig {
        join_timeout: Duration::from_secs(3),
        stall_timeout: Duration::from_secs(2),
    };
    WorkerSession::new(params, cfg, [rank as u8 + 7; 32])
}

/// Runs sessions against `sw` (no loss) until nothing moves; returns every
/// event.
fn pump(ss: &mut [WorkerSession], sw: &mut Switch, now: Instant) -> Vec<Event> {
    let n = ss.len() as u16;
    let mut events = Vec::new();
    for _ in 0..40 {
        let mut moved = false;
        for s in ss.iter_mut() {
            let rank = s.params().rank;
            while let Some(x) = s.poll_transmit(now) {
                moved = true;
                for a in sw.deliver(&x, rank, n, now) {
                    // Answers go to every session (each judges its own).
                    events.extend(s.handle(&a, now));
                }
            }
        }
        if !moved {
            break;
        }
    }
    events
}

#[test]
fn provisions_then_joins_the_job_it_was_given() {
    let t0 = Instant::now();
    let mut sw = Switch::new(1, t0);
    let mut ss = vec![session(0, 2), session(1, 2)];
    for s in &mut ss {
        assert!(s.is_provisioned_job());
        s.start_join(0, 0, t0);
    }
    let first = ss[0].poll_transmit(t0).unwrap();
    assert_eq!(first.msg_type, MsgType::Provision);
    let ev = pump(&mut ss, &mut sw, t0);
    // The lost first ask is resent later; the rest went through.
    let ev2 = pump(&mut ss, &mut sw, t0 + JOIN_RESEND);
    let provisioned: Vec<_> = ev
        .iter()
        .chain(&ev2)
        .filter_map(|e| match e {
            Event::Provisioned { job, created, .. } => Some((*job, *created)),
            _ => None,
        })
        .collect();
    assert_eq!(provisioned.len(), 2, "{ev:?} {ev2:?}");
    assert!(provisioned.iter().all(|p| p.0 == ID));
    assert_eq!(provisioned.iter().filter(|p| p.1).count(), 1, "one creator");
    for s in &ss {
        assert!(s.is_joined(), "{s:?}");
        assert_eq!(s.params().job, ID);
        assert_eq!(s.params().secret, spec().job_secret());
    }
    assert_eq!(sw.prov.jobs.len(), 1);
}

#[test]
fn a_switch_restart_makes_members_provision_again_and_rejoin_at_their_resume_point() {
    let t0 = Instant::now();
    let mut sw = Switch::new(1, t0);
    let mut ss = vec![session(0, 1)];
    ss[0].start_join(0, 0, t0);
    pump(&mut ss, &mut sw, t0);
    assert!(ss[0].is_joined());

    // The switch restarts: a new generation, the same tenant, no jobs.
    let t1 = t0 + Duration::from_secs(1);
    let mut sw = Switch::new(2, t1);
    // Something unauthenticated (the restarted switch's NACK 6) makes the
    // member probe; the probe gets NACK 1: the job is gone.
    let mut h = HeaderRepr::new(MsgType::Nack, ID);
    h.gen = 2;
    let mut b = vec![0u8; HEADER_LEN + crate::wire::NACK_PAYLOAD_LEN];
    h.emit_to(&mut b).unwrap();
    NackPayload::new(NackReason::JobNotActive)
        .emit(&mut b[HEADER_LEN..])
        .unwrap();
    assert!(ss[0].handle(&b, t1).is_none());
    let probe = ss[0].poll_transmit(t1).unwrap();
    assert!(probe.probe);
    let nack1 = sw.deliver(&probe, 0, 1, t1);
    let lost = ss[0].handle(&nack1[0], t1);
    assert!(
        matches!(
            lost,
            Some(Event::SessionLost(Lost::Nack(NackReason::UnknownJob)))
        ),
        "{lost:?}"
    );
    // The rejoin provisions first, then joins with the resume point.
    ss[0].start_join(3, 17, t1);
    assert_eq!(
        ss[0].poll_transmit(t1).unwrap().msg_type,
        MsgType::Provision
    );
    ss[0].start_join(3, 17, t1);
    let ev = pump(&mut ss, &mut sw, t1);
    assert!(ev
        .iter()
        .any(|e| matches!(e, Event::Provisioned { created: true, .. })));
    let j = ev
        .iter()
        .find_map(|e| match e {
            Event::Joined(j) => Some(j),
            _ => None,
        })
        .expect("joined again");
    assert_eq!((j.gen, j.collective, j.seq, j.first), (2, 3, 17, false));
}

#[test]
fn a_job_that_keeps_vanishing_stops_after_five_rounds() {
    let t0 = Instant::now();
    let mut sw = Switch::new(1, t0);
    let mut s = session(0, 1);
    s.start_join(0, 0, t0);
    let mut rounds = 0;
    let mut failed = None;
    for _ in 0..100 {
        let Some(x) = s.poll_transmit(t0) else { break };
        let h = HeaderRepr::parse(&Header::new_checked(x.bytes()).unwrap()).unwrap();
        if x.msg_type == MsgType::Provision && h.count == crate::wire::PROVISION_ASK {
            rounds += 1;
        }
        let answers = sw.deliver(&x, 0, 1, t0);
        // The job ends at once each time (as by `switchctl job rm`).
        for (id, _) in std::mem::take(&mut sw.prov.jobs).into_values() {
            sw.table.remove(id);
        }
        for a in answers {
            if let Some(Event::Failed(e)) = s.handle(&a, t0) {
                failed = Some(e);
            }
        }
    }
    assert_eq!(rounds, MAX_PROVISION_ROUNDS);
    let e = failed.expect("stopped");
    assert_eq!(e, SessionError::ProvisionedJobVanishes { rounds: 5 });
    assert!(e.to_string().contains("5 times in a row"));
}

#[test]
fn a_quota_refusal_is_final_and_names_the_quota() {
    let t0 = Instant::now();
    let mut sw = Switch::new(1, t0);
    sw.prov.max_jobs = 0;
    let mut ss = vec![session(0, 1)];
    ss[0].start_join(0, 0, t0);
    let ev = pump(&mut ss, &mut sw, t0);
    let e = ev
        .iter()
        .find_map(|e| match e {
            Event::Failed(e) => Some(*e),
            _ => None,
        })
        .expect("failed");
    let SessionError::Provision(p) = e else {
        panic!("{e:?}")
    };
    assert_eq!(p.quota(), Some(Quota::MaxJobs));
    assert!(e.to_string().contains("max_jobs"), "{e}");
    assert!(ss[0].is_failed());
    assert!(ss[0].poll_transmit(t0 + Duration::from_secs(1)).is_none());
}

#[test]
fn nack_meaning_makes_quota_and_unknown_tenant_final() {
    for joined in [false, true] {
        assert_eq!(
            nack_meaning(NackReason::QuotaExceeded, joined),
            NackMeaning::Refused
        );
        assert_eq!(
            nack_meaning(NackReason::UnknownTenant, joined),
            NackMeaning::Refused
        );
    }
}

#[test]
fn the_keepalive_is_a_third_of_the_lease_at_most_20_seconds() {
    use super::{keepalive_interval, KEEPALIVE_MAX, KEEPALIVE_MIN};
    let s = Duration::from_secs;
    assert_eq!(keepalive_interval(60), s(20));
    assert_eq!(keepalive_interval(30), s(10));
    assert_eq!(keepalive_interval(3), s(1));
    assert_eq!(keepalive_interval(1), Duration::from_nanos(333_333_333));
    assert_eq!(keepalive_interval(0), KEEPALIVE_MIN);
    assert_eq!(keepalive_interval(3600), KEEPALIVE_MAX);
}
