//! Self-provisioned jobs (docs/PROTOCOL.md, "Tenants and self-provisioned
//! jobs"): the table's tenants, PROVISION asks and claims built as a worker
//! builds them, quotas, replays, leases and the end of a job.

use super::*;
use crate::provision::{job_secret, provision_mac, verify_provisioned, JobName, ProvisionClaim};
use crate::provision::{TenantKey, TenantName};
use crate::switch::tenant::DEFAULT_LEASE;
use crate::tag::AuthMode;
use crate::wire::{
    ChallengePayload, Dtype, ProvisionPayload, ProvisionedPayload, Quota, PROVISIONED_CREATED,
    PROVISION_ASK, PROVISION_CLAIM,
};

const KEY_A: TenantKey = [0x5a; 32];
const KEY_B: TenantKey = [0x3c; 32];

fn tenant(name: &str, key: TenantKey, ids: (u16, u16)) -> TenantConfig {
    TenantConfig {
        name: TenantName::new(name).unwrap(),
        key,
        allowed_sources: vec![Ipv4Prefix {
            addr: [198, 18, 0, 0],
            len: 24,
        }],
        max_jobs: 2,
        max_workers_per_job: 8,
        max_pool_bytes: 1 << 30,
        dtypes: Dtype::ALL.to_vec(),
        auth: vec![AuthMode::Port, AuthMode::Mac],
        max_priority: Priority::Normal,
        job_ids: ids,
        lease: DEFAULT_LEASE,
        pool_slots: 16,
        upstream: None,
    }
}

/// A table with tenants `vision` (key A, ids 1000..=1999) and `speech`
/// (key B, ids 2000..=2999).
fn ptable() -> JobTable {
    let mut t = table();
    t.add_tenant(tenant("vision", KEY_A, (1000, 1999))).unwrap();
    t.add_tenant(tenant("speech", KEY_B, (2000, 2999))).unwrap();
    t
}

/// What a worker asks for.
#[derive(Clone, Copy)]
struct Want<'a> {
    tenant: &'a str,
    key: TenantKey,
    job: &'a str,
    n: u16,
    dtype: Dtype,
    auth: AuthMode,
    stats: bool,
    priority: Priority,
    /// The header's job: 0 lets the switch pick.
    id: u16,
}

fn want<'a>(job: &'a str, n: u16) -> Want<'a> {
    Want {
        tenant: "vision",
        key: KEY_A,
        job,
        n,
        dtype: Dtype::F32,
        auth: AuthMode::Port,
        stats: false,
        priority: Priority::Normal,
        id: 0,
    }
}

fn wire_name<const N: usize>(s: &str) -> [u8; N] {
    let mut b = [0u8; N];
    b[..s.len()].copy_from_slice(s.as_bytes());
    b
}

fn payload(w: &Want, nonce: Nonce) -> ProvisionPayload {
    ProvisionPayload {
        tenant: wire_name(w.tenant),
        job_name: wire_name(w.job),
        n_workers: w.n,
        dtype: w.dtype as u8,
        op: 0,
        auth: w.auth as u8,
        stats: u8::from(w.stats),
        priority: w.priority as u8,
        nonce,
        mac: [0; 32],
    }
}

fn provision_frame(w: &Want, count: u16, gen: u32, p: &ProvisionPayload) -> Vec<u8> {
    let mut h = HeaderRepr::new(MsgType::Provision, 1);
    h.job = w.id;
    h.count = count;
    h.gen = gen;
    let mut b = vec![0u8; HEADER_LEN + crate::wire::PROVISION_PAYLOAD_LEN];
    h.emit_to(&mut b).unwrap();
    p.emit(&mut b[HEADER_LEN..]).unwrap();
    b
}

/// Every reply queued so far, encoded, with its length on the wire.
fn replies(t: &mut JobTable) -> Vec<(HeaderRepr, Vec<u8>, usize)> {
    let mut out = Vec::new();
    while let Some(r) = t.poll_reply() {
        let mut buf = [0u8; 2048];
        let Some(e) = t.encode(&r, &mut buf) else {
            continue;
        };
        let hdr = HeaderRepr::parse(&crate::wire::Header::new_checked(&buf[..e.len]).unwrap())
            .expect("the switch's answers parse, job 0 included");
        out.push((hdr, buf[HEADER_LEN..e.len].to_vec(), e.len));
    }
    out
}

/// The one answer to a PROVISION of `request_len` bytes, checked smaller.
fn one_answer(t: &mut JobTable, request_len: usize) -> (HeaderRepr, Vec<u8>) {
    let mut r = replies(t);
    assert_eq!(r.len(), 1, "one answer");
    let (h, p, len) = r.pop().unwrap();
    assert!(
        len < request_len,
        "answer {len} bytes, request {request_len}"
    );
    (h, p)
}

/// A NACK's (reason, detail), checking it echoes `nonce`.
fn nack_of(h: &HeaderRepr, p: &[u8], nonce: &Nonce) -> (NackReason, u16) {
    assert_eq!(h.msg_type, MsgType::Nack, "{h:?}");
    let n = NackPayload::parse(p).unwrap();
    assert_eq!(&n.echo, nonce, "the NACK echoes the PROVISION's nonce");
    (n.reason, n.detail)
}

/// An ask from `from`: the CHALLENGE's switch nonce and gen, or the NACK.
fn ask(
    t: &mut JobTable,
    w: &Want,
    from: Endpoint,
    now: Instant,
) -> Result<(Nonce, u32), (NackReason, u16)> {
    replies(t);
    let mine = [0x11; 16];
    let f = provision_frame(w, PROVISION_ASK, 0, &payload(w, mine));
    t.handle(&f, from, false, now);
    let (h, p) = one_answer(t, f.len());
    if h.msg_type == MsgType::Nack {
        return Err(nack_of(&h, &p, &mine));
    }
    assert_eq!(h.msg_type, MsgType::Challenge);
    assert_eq!(h.job, w.id, "the CHALLENGE names the PROVISION's job");
    let c = ChallengePayload::parse(&p).unwrap();
    assert_eq!(c.hello_nonce, mine, "the CHALLENGE echoes the ask's nonce");
    Ok((c.nonce, h.gen))
}

/// The claim a worker builds from a CHALLENGE.
fn claim_frame(w: &Want, nonce: Nonce, gen: u32, from: &Endpoint) -> Vec<u8> {
    let mut p = payload(w, nonce);
    let c = ProvisionClaim {
        job: w.id,
        gen,
        ip: from.source.ip,
        port: from.source.port,
    };
    p.mac = provision_mac(&w.key, &c, &p.covered());
    provision_frame(w, PROVISION_CLAIM, gen, &p)
}

/// What a claim got: (job id, created) from a PROVISIONED whose tag
/// verified under the secret `w`'s key derives, or the NACK.
fn claim_bytes(
    t: &mut JobTable,
    w: &Want,
    f: &[u8],
    nonce: Nonce,
    from: Endpoint,
    now: Instant,
) -> Result<(u16, bool), (NackReason, u16)> {
    replies(t);
    t.handle(f, from, false, now);
    let (h, p) = one_answer(t, f.len());
    if h.msg_type == MsgType::Nack {
        return Err(nack_of(&h, &p, &nonce));
    }
    assert_eq!(h.msg_type, MsgType::Provisioned);
    let a = ProvisionedPayload::parse(&p).unwrap();
    assert_eq!(a.nonce, nonce);
    let secret = derived(w);
    assert!(
        verify_provisioned(&secret, h.job, h.gen, &a.nonce, a.lease_secs, &a.tag),
        "the PROVISIONED's tag verifies under the derived secret"
    );
    assert_eq!(a.lease_secs, 60);
    Ok((h.job, a.flags & PROVISIONED_CREATED != 0))
}

fn derived(w: &Want) -> [u8; 32] {
    job_secret(
        &w.key,
        &TenantName::new(w.tenant).unwrap(),
        &JobName::new(w.job).unwrap(),
    )
}

/// Ask and claim from `from` at `now`.
fn provision_at(
    t: &mut JobTable,
    w: &Want,
    from: Endpoint,
    now: Instant,
) -> Result<(u16, bool), (NackReason, u16)> {
    let (nonce, gen) = ask(t, w, from, now)?;
    let f = claim_frame(w, nonce, gen, &from);
    claim_bytes(t, w, &f, nonce, from, now)
}

fn provision(t: &mut JobTable, w: &Want) -> Result<(u16, bool), (NackReason, u16)> {
    provision_at(t, w, endpoint(0), t0())
}

/// A JOIN handshake of `rank` to job `job` with `secret` at `now`.
fn join_job(
    t: &mut JobTable,
    job: u16,
    rank: u16,
    n: u16,
    secret: [u8; 32],
    now: Instant,
) -> (Verdict, Handshake) {
    let from = endpoint(rank);
    let params = JoinParams {
        job,
        rank,
        n_workers: n,
        dtype: 0,
        op: 0,
        secret,
        ip: from.source.ip,
        port: from.source.port,
        provision: None,
    };
    let mut hs = Handshake::new(params, [rank as u8 + 1; 16]);
    hello(t, &mut hs, from, now);
    let v = t.handle(&join_bytes(&hs, (0, 0)), from, false, now);
    (v, hs)
}

fn tenant_jobs(t: &JobTable, name: &str) -> usize {
    t.tenant_usage(name).unwrap().0
}

#[test]
fn the_tenant_api_adds_lists_refuses_and_removes() {
    let mut t = ptable();
    let names: Vec<String> = t.tenants().map(|c| c.name.to_string()).collect();
    assert_eq!(names, ["vision", "speech"]);
    assert_eq!(t.tenant_usage("vision"), Some((0, 0)));
    assert_eq!(t.tenant_usage("nobody"), None);
    let e = t
        .add_tenant(tenant("vision", KEY_B, (5000, 5001)))
        .unwrap_err();
    assert!(matches!(e, TenantError::Duplicate(_)), "{e}");
    let e = t
        .add_tenant(tenant("other", KEY_B, (1999, 2000)))
        .unwrap_err();
    assert!(e.to_string().contains("overlap tenant vision"), "{e}");
    let mut bad = tenant("other", KEY_B, (3000, 3001));
    bad.max_jobs = 0;
    assert!(matches!(t.add_tenant(bad), Err(TenantError::ZeroQuota(..))));
    // Declared jobs and tenant ranges stay apart, either way round.
    t.add(config(1, 4, 4), 64).unwrap();
    let e = t.add_tenant(tenant("other", KEY_B, (1, 10))).unwrap_err();
    assert!(e.to_string().contains("declared job 5"), "{e}");
    let mut inside = config(1, 4, 4);
    inside.id = 1500;
    let e = t.add(inside, 64).unwrap_err();
    assert!(e.to_string().contains("tenant vision's job_ids"), "{e}");

    let (id, _) = provision(&mut t, &want("run-1", 1)).unwrap();
    let e = t.remove_tenant("vision").unwrap_err();
    assert!(e.to_string().contains("still has 1 job"), "{e}");
    assert!(matches!(
        t.remove_tenant("nobody"),
        Err(TenantError::Unknown(_))
    ));
    t.remove(id).unwrap();
    assert_eq!(t.remove_tenant("vision").unwrap().name.as_str(), "vision");
    assert_eq!(t.tenants().count(), 1);
}

#[test]
fn ask_claim_and_join_with_the_derived_secret() {
    let mut t = ptable();
    let w = want("run-1", 2);
    let (id, created) = provision(&mut t, &w).unwrap();
    assert!(created);
    assert!((1000..=1999).contains(&id));
    let job = t.get(id).unwrap();
    assert_eq!(
        job.origin(),
        &JobOrigin::Provisioned {
            tenant: TenantName::new("vision").unwrap(),
            name: JobName::new("run-1").unwrap()
        }
    );
    assert_eq!(job.config.secret, derived(&w));
    assert_eq!(job.config.pool_slots, 16);
    assert_eq!(job.config.window, 16);
    assert_eq!(
        job.config.elems_per_chunk,
        config::max_elems_for(
            crate::wire::elems_per_chunk_for_mtu(1500),
            Dtype::F32,
            AuthMode::Port,
            false
        )
    );
    assert_eq!(job.lease_left(t0()), Some(DEFAULT_LEASE));
    assert_eq!(t.counters.provisioned_jobs, 1);
    assert_eq!(tenant_jobs(&t, "vision"), 1);
    let usage = t.tenant_usage("vision").unwrap().1;
    assert_eq!(usage, job.config.pool_bytes());
    assert_eq!(t.pool_memory().1, usage);
    assert!(matches!(
        t.poll_event(),
        Some(Event::JobProvisioned { job, n_workers: 2, .. }) if job == id
    ));
    // Declared jobs have no lease.
    let (v, _) = join_job(&mut t, id, 0, 2, derived(&w), t0());
    assert_eq!(v, Verdict::Join(JoinOutcome::Waiting));
    let (v, _) = join_job(&mut t, id, 1, 2, derived(&w), t0());
    assert_eq!(v, Verdict::Join(JoinOutcome::Activated));
    // A JOIN with the tenant key itself is refused: only the derived
    // secret is the job's.
    let (v, _) = join_job(&mut t, id, 1, 2, KEY_A, t0());
    assert_eq!(v, Verdict::Join(JoinOutcome::Nack(NackReason::BadSecret)));
}

#[test]
fn every_rank_reaches_the_same_job_and_copies_change_nothing() {
    let mut t = ptable();
    let w = want("run-1", 2);
    let from = endpoint(0);
    let (nonce, gen) = ask(&mut t, &w, from, t0()).unwrap();
    let first = claim_frame(&w, nonce, gen, &from);
    let (id, created) = claim_bytes(&mut t, &w, &first, nonce, from, t0()).unwrap();
    assert!(created);
    let mem = t.pool_memory();
    // Rank 1, from its own address: the same job, not created by it.
    let (id1, created1) = provision_at(&mut t, &w, endpoint(1), t0()).unwrap();
    assert_eq!((id1, created1), (id, false));
    // The worker's own resend of the creating claim: the same answer.
    let again = claim_bytes(&mut t, &w, &first, nonce, from, t0()).unwrap();
    assert_eq!(again, (id, true));
    assert_eq!(t.pool_memory(), mem);
    assert_eq!(t.jobs().count(), 1);
    assert_eq!(t.counters.provisioned_jobs, 1);
    assert_eq!(t.counters.provision_repeats, 2);
    // Naming the id it has is the same job; another id is not.
    let named = Want { id, ..w };
    assert_eq!(provision(&mut t, &named).unwrap(), (id, false));
    let other = Want { id: id + 1, ..w };
    assert_eq!(
        provision(&mut t, &other).unwrap_err().0,
        NackReason::ParametersDiffer
    );
}

#[test]
fn a_claim_of_another_shape_gets_nack_5() {
    let mut t = ptable();
    provision(&mut t, &want("run-1", 2)).unwrap();
    for w in [
        want("run-1", 3),
        Want {
            dtype: Dtype::Bf16,
            ..want("run-1", 2)
        },
        Want {
            auth: AuthMode::Mac,
            ..want("run-1", 2)
        },
        Want {
            stats: true,
            ..want("run-1", 2)
        },
        Want {
            priority: Priority::Low,
            ..want("run-1", 2)
        },
    ] {
        let e = provision(&mut t, &w).unwrap_err();
        assert_eq!(e, (NackReason::ParametersDiffer, 0));
    }
    assert_eq!(t.jobs().count(), 1);
}

#[test]
fn each_quota_refuses_with_nack_11_naming_it() {
    let mut t = table();
    let mut c = tenant("vision", KEY_A, (1000, 1001));
    c.dtypes = vec![Dtype::F32];
    c.auth = vec![AuthMode::Port];
    c.max_pool_bytes = 200_000;
    t.add_tenant(c).unwrap();
    let q = |t: &mut JobTable, w: Want| {
        let (r, d) = provision(t, &w).unwrap_err();
        assert_eq!(r, NackReason::QuotaExceeded);
        Quota::from_u16(d).unwrap()
    };
    let base = want("a", 2);
    let cases = [
        (
            Want {
                dtype: Dtype::Bf16,
                ..base
            },
            Quota::Dtype,
        ),
        (
            Want {
                auth: AuthMode::Mac,
                ..base
            },
            Quota::Auth,
        ),
        (
            Want {
                priority: Priority::High,
                ..base
            },
            Quota::Priority,
        ),
        (want("a", 9), Quota::MaxWorkersPerJob),
        (want("a", 8), Quota::MaxPoolBytes),
        (Want { id: 999, ..base }, Quota::JobIds),
    ];
    for (w, quota) in cases {
        assert_eq!(q(&mut t, w), quota);
    }
    assert_eq!(t.jobs().count(), 0);
    assert_eq!(t.counters.provision_refused, cases.len() as u64);
    provision(&mut t, &want("a", 1)).unwrap();
    provision(&mut t, &want("b", 1)).unwrap();
    // The third job: max_jobs, named with the numbers.
    assert_eq!(q(&mut t, want("c", 1)), Quota::MaxJobs);
    let k = Refusal::Quota(QuotaRefusal {
        label: JobLabel::new(&TenantName::new("x").unwrap(), &JobName::new("y").unwrap()),
        quota: Quota::MaxJobs,
        asked: 0,
        limit: 0,
        in_use: 0,
    })
    .index();
    let why = t.last_refusal(k).unwrap().why.to_string();
    assert!(
        why.contains("tenant vision: job c would be its 3rd; max_jobs is 2"),
        "{why}"
    );
    assert!(why.contains("ask the operator to raise"), "{why}");

    // No free id: a one-id tenant with room for two jobs.
    let mut t = table();
    let mut c = tenant("vision", KEY_A, (1000, 1000));
    c.max_jobs = 2;
    t.add_tenant(c).unwrap();
    provision(&mut t, &want("a", 1)).unwrap();
    assert_eq!(q(&mut t, want("b", 1)), Quota::JobIds);
    let why = t.last_refusal(k).unwrap().why.to_string();
    assert!(
        why.contains("no free id left in job_ids [1000, 1000]"),
        "{why}"
    );

    // The switch's own budget.
    let mut cfg = TableConfig::new(GEN, [0x42; 32]);
    cfg.pool_budget = 1000;
    let mut t = JobTable::new(cfg, t0());
    t.add_tenant(tenant("vision", KEY_A, (1000, 1999))).unwrap();
    assert_eq!(q(&mut t, want("a", 1)), Quota::SwitchPoolMemory);
    assert_eq!(t.pool_memory(), (1000, 0));
}

#[test]
fn ids_start_at_the_names_hash_and_skip_taken_ones() {
    let mut t = table();
    t.add_tenant(tenant("vision", KEY_A, (1000, 1003))).unwrap();
    // FNV-1a-32("a") = 0xe40c292c; mod 4 = 0.
    assert_eq!(provision(&mut t, &want("a", 1)).unwrap().0, 1000);
    // FNV-1a-32("e") = 0xe00c22e0, also 0 mod 4: the next free id.
    assert_eq!(provision(&mut t, &want("e", 1)).unwrap().0, 1001);
}

#[test]
fn a_wrong_key_creates_nothing_and_costs_no_state() {
    let mut t = ptable();
    let w = Want {
        key: [0x77; 32],
        ..want("run-1", 2)
    };
    let serials_before: Vec<u64> = t.tenants.iter().map(|x| x.min_serial).collect();
    let (nonce, gen) = ask(&mut t, &w, endpoint(0), t0()).unwrap();
    let f = claim_frame(&w, nonce, gen, &endpoint(0));
    assert_eq!(
        claim_bytes(&mut t, &w, &f, nonce, endpoint(0), t0()),
        Err((NackReason::BadSecret, 0))
    );
    // The log's sample speaks of the tenant's key, not of a JOIN's secret.
    let sample = t.last_refusal(NackReason::BadSecret as usize).unwrap();
    let said = sample.why.to_string();
    assert!(said.contains("tenant vision's job run-1"), "{said}");
    assert!(
        said.contains("does not verify under the tenant's key"),
        "{said}"
    );
    assert!(!said.contains("JOIN"), "{said}");
    // 10 000 more, each its own (name, source port), over time so the
    // rate limit lets them through.
    for i in 0..10_000u32 {
        let name = format!("x{i}");
        let w = Want { job: &name, ..w };
        let mut from = endpoint(0);
        from.source.port = 1000 + (i % 50_000) as u16;
        let now = t0() + Duration::from_millis(u64::from(i) * 10);
        let Ok((nonce, gen)) = ask(&mut t, &w, from, now) else {
            panic!("ask {i} answered");
        };
        t.handle(&claim_frame(&w, nonce, gen, &from), from, false, now);
        replies(&mut t);
    }
    assert_eq!(t.jobs().count(), 0);
    assert_eq!(tenant_jobs(&t, "vision"), 0);
    assert!(t.tenants.iter().all(|x| x.jobs.is_empty()));
    let serials: Vec<u64> = t.tenants.iter().map(|x| x.min_serial).collect();
    assert_eq!(serials, serials_before, "no serial moved");
    assert_eq!(t.tenants.len(), 2);
    assert!(t.reserved.is_empty() && t.removed.is_empty());
    assert_eq!(t.pool_memory().1, 0);
    assert_eq!(t.counters.provision_refused, 10_001);
    assert!(t.poll_event().is_none(), "strangers make no events");
}

#[test]
fn unknown_tenants_foreign_sources_and_bad_nonces_are_refused() {
    let mut t = ptable();
    let nobody = Want {
        tenant: "nobody",
        ..want("run-1", 2)
    };
    assert_eq!(
        ask(&mut t, &nobody, endpoint(0), t0()),
        Err((NackReason::UnknownTenant, 0))
    );
    let mut outside = endpoint(0);
    outside.source.ip = [198, 19, 0, 1];
    assert_eq!(
        ask(&mut t, &want("run-1", 2), outside, t0()),
        Err((NackReason::SourceNotAllowed, 0))
    );
    let bad_name = want("a b", 2);
    assert_eq!(
        ask(&mut t, &bad_name, endpoint(0), t0()),
        Err((NackReason::Malformed, 0))
    );
    // A forged nonce, a nonce for another source, a stale one.
    let w = want("run-1", 2);
    let from = endpoint(0);
    let forged = [9u8; 16];
    let f = claim_frame(&w, forged, GEN, &from);
    assert_eq!(
        claim_bytes(&mut t, &w, &f, forged, from, t0()),
        Err((NackReason::StaleNonce, 0))
    );
    let (nonce, gen) = ask(&mut t, &w, endpoint(1), t0()).unwrap();
    let f = claim_frame(&w, nonce, gen, &from);
    assert_eq!(
        claim_bytes(&mut t, &w, &f, nonce, from, t0()),
        Err((NackReason::StaleNonce, 0))
    );
    let (nonce, gen) = ask(&mut t, &w, from, t0()).unwrap();
    let f = claim_frame(&w, nonce, gen, &from);
    let late = t0() + Duration::from_secs(11);
    assert_eq!(
        claim_bytes(&mut t, &w, &f, nonce, from, late),
        Err((NackReason::StaleNonce, 0))
    );
    // Another generation (checked before the nonce's age).
    let f = claim_frame(&w, nonce, GEN ^ 1, &from);
    assert_eq!(
        claim_bytes(&mut t, &w, &f, nonce, from, late),
        Err((NackReason::StaleGeneration, 0))
    );
    assert_eq!(t.jobs().count(), 0);
}

#[test]
fn a_claim_replayed_after_its_job_ended_gets_nack_9() {
    let mut t = ptable();
    let w = want("run-1", 1);
    let from = endpoint(0);
    let (nonce, gen) = ask(&mut t, &w, from, t0()).unwrap();
    let f = claim_frame(&w, nonce, gen, &from);
    let (id, _) = claim_bytes(&mut t, &w, &f, nonce, from, t0()).unwrap();
    // While it exists: answered again, nothing changes.
    assert_eq!(
        claim_bytes(&mut t, &w, &f, nonce, from, t0()),
        Ok((id, true))
    );
    // switchctl job rm.
    t.remove(id).unwrap();
    assert!(matches!(t.poll_event(), Some(Event::JobProvisioned { .. })));
    assert!(matches!(
        t.poll_event(),
        Some(Event::JobEnded {
            why: JobEnd::Removed,
            ..
        })
    ));
    assert_eq!(
        claim_bytes(&mut t, &w, &f, nonce, from, t0()),
        Err((NackReason::StaleNonce, 0))
    );
    assert!(t.get(id).is_none());
    assert_eq!(tenant_jobs(&t, "vision"), 0);
    // A fresh ask and claim make it again.
    assert!(provision(&mut t, &w).unwrap().1);
}

#[test]
fn a_claim_from_before_its_tenant_was_declared_again_is_a_replay() {
    let mut t = ptable();
    let w = want("run-1", 1);
    let from = endpoint(0);
    let (nonce, gen) = ask(&mut t, &w, from, t0()).unwrap();
    let f = claim_frame(&w, nonce, gen, &from);
    let c = t.remove_tenant("vision").unwrap();
    t.add_tenant(c).unwrap();
    assert_eq!(
        claim_bytes(&mut t, &w, &f, nonce, from, t0()),
        Err((NackReason::StaleNonce, 0))
    );
    assert_eq!(t.jobs().count(), 0);
}

#[test]
fn a_job_nobody_joined_ends_with_its_lease() {
    let mut t = ptable();
    let (id, _) = provision(&mut t, &want("run-1", 2)).unwrap();
    t.handle_timeout(t0() + Duration::from_secs(59));
    assert_eq!(
        t.get(id)
            .unwrap()
            .lease_left(t0() + Duration::from_secs(59)),
        Some(Duration::from_secs(1))
    );
    t.handle_timeout(t0() + Duration::from_secs(60));
    assert!(t.get(id).is_none());
    assert_eq!(t.counters.jobs_ended_lease, 1);
    assert_eq!(t.pool_memory().1, 0, "the pool is back in the budget");
    assert_eq!(tenant_jobs(&t, "vision"), 0);
    let ended: Vec<_> = std::iter::from_fn(|| t.poll_event()).collect();
    assert!(matches!(
        ended.last(),
        Some(Event::JobEnded { job, why: JobEnd::Lease, label }) if *job == id
            && label.to_string() == "vision/run-1"
    ));
}

#[test]
fn data_heartbeats_and_joins_renew_the_lease() {
    let mut t = ptable();
    let w = want("run-1", 1);
    let (id, _) = provision(&mut t, &w).unwrap();
    let s = |secs| t0() + Duration::from_secs(secs);
    // A JOIN at 30 s renews it.
    let (v, _) = join_job(&mut t, id, 0, 1, derived(&w), s(30));
    assert_eq!(v, Verdict::Join(JoinOutcome::Activated));
    t.handle_timeout(s(89));
    assert!(t.get(id).is_some());
    // DATA at 89 s: sampled by handle_timeout, not recorded per packet.
    let (mut h, p) = data_message(0, 0, &[1.0; 4], GEN);
    h.job = id;
    let v = t.handle(&frame(&h, &p), endpoint(0), false, s(89));
    assert!(matches!(v, Verdict::Data(_)), "{v:?}");
    t.handle_timeout(s(90));
    t.handle_timeout(s(149));
    assert!(t.get(id).is_some(), "DATA seen at 90 s: leased until 150 s");
    // A HEARTBEAT at 149 s.
    let mut hb = HeaderRepr::new(MsgType::Heartbeat, id);
    hb.gen = GEN;
    let v = t.handle(&frame(&hb, &[]), endpoint(0), false, s(149));
    assert!(matches!(v, Verdict::Heartbeat { .. }), "{v:?}");
    t.handle_timeout(s(208));
    assert!(t.get(id).is_some());
    t.handle_timeout(s(209));
    assert!(t.get(id).is_none());
    assert_eq!(t.counters.jobs_ended_lease, 1);
}

#[test]
fn a_job_ends_when_every_member_left() {
    let mut t = ptable();
    let w = want("run-1", 2);
    let (id, _) = provision(&mut t, &w).unwrap();
    let (_, hs0) = join_job(&mut t, id, 0, 2, derived(&w), t0());
    let (v, hs1) = join_job(&mut t, id, 1, 2, derived(&w), t0());
    assert_eq!(v, Verdict::Join(JoinOutcome::Activated));
    let mut b = [0u8; 128];
    let n = hs0.emit_leave(&mut b).unwrap();
    assert_eq!(t.handle(&b[..n], endpoint(0), false, t0()), Verdict::Noted);
    assert!(t.get(id).is_some(), "rank 1 is still there");
    let n = hs1.emit_leave(&mut b).unwrap();
    assert_eq!(t.handle(&b[..n], endpoint(1), false, t0()), Verdict::Noted);
    assert!(t.get(id).is_none());
    assert_eq!(t.counters.jobs_ended_left, 1);
    assert_eq!(t.pool_memory().1, 0);
    assert_eq!(tenant_jobs(&t, "vision"), 0);
}

#[test]
fn a_tenant_cannot_reach_another_tenants_job() {
    let mut t = ptable();
    let wa = want("shared", 1);
    let (a_id, _) = provision(&mut t, &wa).unwrap();
    // Tenant speech names the same job under its own name: its own job.
    let wb = Want {
        tenant: "speech",
        key: KEY_B,
        ..wa
    };
    let (b_id, created) = provision(&mut t, &wb).unwrap();
    assert!(created && b_id != a_id && (2000..=2999).contains(&b_id));
    // Key B claiming in vision's name: NACK 2.
    let forged = Want {
        tenant: "vision",
        key: KEY_B,
        ..wa
    };
    assert_eq!(provision(&mut t, &forged), Err((NackReason::BadSecret, 0)));
    // Vision's derived secret does not join speech's job.
    let (v, _) = join_job(&mut t, b_id, 0, 1, derived(&wa), t0());
    assert_eq!(v, Verdict::Join(JoinOutcome::Nack(NackReason::BadSecret)));
    // Nor may vision ask for speech's id.
    let by_id = Want { id: b_id, ..wa };
    assert_eq!(
        provision(&mut t, &by_id).unwrap_err().0,
        NackReason::ParametersDiffer
    );
    let new_by_id = Want {
        id: b_id,
        ..want("other", 1)
    };
    assert_eq!(
        provision(&mut t, &new_by_id),
        Err((NackReason::QuotaExceeded, Quota::JobIds as u16))
    );
}

#[test]
fn a_flood_of_asks_gets_at_most_the_hello_burst_of_answers() {
    let mut t = ptable();
    let w = want("run-1", 1);
    let f = provision_frame(&w, PROVISION_ASK, 0, &payload(&w, [1; 16]));
    let mut limited = 0;
    for i in 0..3000u32 {
        let now = t0() + Duration::from_nanos(u64::from(i) * 333);
        if t.handle(&f, endpoint(0), false, now) == Verdict::RateLimited {
            limited += 1;
        }
    }
    let answers = replies(&mut t).len();
    assert!(answers <= HELLO_LIMIT.burst as usize + 1, "{answers}");
    assert_eq!(answers + limited, 3000);
    assert_eq!(t.counters.hello_rate_limited, limited as u64);
    // Unknown tenants are refused on the same budget.
    let mut t = ptable();
    let nobody = Want {
        tenant: "nobody",
        ..w
    };
    let f = provision_frame(&nobody, PROVISION_ASK, 0, &payload(&nobody, [1; 16]));
    for _ in 0..3000 {
        t.handle(&f, endpoint(0), false, t0());
    }
    assert!(replies(&mut t).len() <= HELLO_LIMIT.burst as usize + 1);
}

#[test]
fn a_tenant_with_an_upstream_makes_leaf_jobs() {
    let mut t = table();
    let mut c = tenant("vision", KEY_A, (1000, 1999));
    let up = Upstream {
        leaf_index: 1,
        n_leaves: 2,
        spines: vec![SpineAddr {
            ip: [198, 18, 1, 1],
            port: 9000,
        }],
        local_ip: [198, 18, 1, 2],
        local_port: 9001,
    };
    c.upstream = Some(up.clone());
    t.add_tenant(c.clone()).unwrap();
    let w = Want {
        dtype: Dtype::Bf16,
        ..want("run-1", 2)
    };
    let (id, _) = provision(&mut t, &w).unwrap();
    let job = t.get(id).unwrap();
    assert_eq!(job.config.upstream.as_ref(), Some(&up));
    assert!(job.uplink().is_some());
    // A leaf's chunks are float32 towards its spines.
    assert_eq!(
        job.config.elems_per_chunk,
        config::max_elems_for(
            crate::wire::elems_per_chunk_for_mtu(1500),
            Dtype::F32,
            AuthMode::Port,
            false
        )
    );
    // Leaf jobs take auth port only.
    let mac = Want {
        auth: AuthMode::Mac,
        ..want("run-2", 2)
    };
    assert_eq!(
        provision(&mut t, &mac),
        Err((NackReason::QuotaExceeded, Quota::Auth as u16))
    );
    // A tenant upstream needs the uplink's address.
    c.name = TenantName::new("other").unwrap();
    c.job_ids = (3000, 3001);
    c.upstream.as_mut().unwrap().local_port = 0;
    let e = t.add_tenant(c).unwrap_err();
    assert!(e.to_string().contains("[switch] uplink"), "{e}");
}

/// On jumbo ports (multi-buffer sockets), a provisioned `auth = "mac"`
/// job's chunk is one frame's worth, as a declared one's: its tagged
/// RESULT leaves from one TX frame. A port job gets the whole MTU.
#[test]
fn a_mac_job_s_chunk_fits_one_frame_on_jumbo_ports() {
    let mut cfg = TableConfig::new(GEN, [0x42; 32]);
    cfg.max_f32_elems = crate::wire::elems_per_chunk_for_mtu(9000);
    cfg.max_f32_elems_mac = 940;
    let mut t = JobTable::new(cfg, t0());
    t.add_tenant(tenant("vision", KEY_A, (1000, 1999))).unwrap();
    let port = provision(&mut t, &want("big", 2)).unwrap().0;
    let mac = provision(
        &mut t,
        &Want {
            auth: AuthMode::Mac,
            ..want("tagged", 2)
        },
    )
    .unwrap()
    .0;
    let elems = |id| t.get(id).unwrap().config.elems_per_chunk;
    assert_eq!(
        elems(port),
        crate::switch::config::max_elems_for(
            crate::wire::elems_per_chunk_for_mtu(9000),
            Dtype::F32,
            AuthMode::Port,
            false
        )
    );
    assert_eq!(
        elems(mac),
        crate::switch::config::max_elems_for(940, Dtype::F32, AuthMode::Mac, false)
    );
}
