//! The provisioner against a hand-built switch side ([`fake_switch`]) in
//! virtual time: lost, duplicated and forged answers are made here.

use super::*;
use crate::wire::{NACK_PAYLOAD_LEN, OP_SUM};

use super::fake_switch::FakeSwitch;

const KEY: TenantKey = [0x5a; 32];
const IP: [u8; 4] = [198, 18, 0, 10];

fn spec(key: TenantKey, job: &str) -> ProvisionSpec {
    ProvisionSpec {
        tenant: TenantName::new("vision").unwrap(),
        key,
        job_name: JobName::new(job).unwrap(),
        auth: AuthMode::Port,
        stats: false,
        priority: 1,
    }
}

fn asker(rank: u16, n: u16) -> Asker {
    Asker {
        job: 0,
        rank,
        n_workers: n,
        dtype: 0,
        op: OP_SUM,
        ip: IP,
        port: 1000 + rank,
    }
}

fn prov(rank: u16, key: TenantKey, job: &str) -> Provisioner {
    Provisioner::new(spec(key, job), asker(rank, 4), [rank as u8 + 1; 32])
}

fn send(p: &mut Provisioner, now: Instant) -> Option<Vec<u8>> {
    let mut b = vec![0u8; PROVISION_LEN];
    let n = p.poll_transmit(now, &mut b)?;
    b.truncate(n);
    Some(b)
}

/// Runs `p` against `sw` until final (no loss); returns the outcome.
fn run(p: &mut Provisioner, sw: &mut FakeSwitch, now: Instant) -> Outcome {
    p.start(now);
    for _ in 0..10 {
        let out = send(p, now).expect("something to send");
        let port = p.asker().port;
        let ans = sw.answer(&out, IP, port, now);
        if let Some(o) = p.handle(&ans, now) {
            return o;
        }
    }
    panic!("no outcome");
}

fn refusal(o: Outcome) -> ProvisionError {
    match o {
        Outcome::Refused(e) => e,
        o => panic!("expected a refusal, got {o:?}"),
    }
}

#[test]
fn provisions_through_lost_duplicated_and_forged_answers() {
    let t0 = Instant::now();
    let mut sw = FakeSwitch::new(7, "vision", KEY, t0);
    let mut p = prov(0, KEY, "run-1");
    assert!(send(&mut p, t0).is_none(), "idle until started");
    p.start(t0);
    // The ask is lost: the same ask again after 200 ms, not before.
    let ask = send(&mut p, t0).unwrap();
    assert!(send(&mut p, t0 + PROVISION_RESEND / 2).is_none());
    assert_eq!(p.poll_timeout(), Some(t0 + PROVISION_RESEND));
    let t1 = t0 + PROVISION_RESEND;
    let ask2 = send(&mut p, t1).unwrap();
    assert_eq!(ask, ask2);
    let hdr = HeaderRepr::parse(&Header::new_checked(&ask[..]).unwrap()).unwrap();
    assert_eq!((hdr.job, hdr.count), (0, PROVISION_ASK));
    let pl = ProvisionPayload::parse(&ask[HEADER_LEN..]).unwrap();
    assert_eq!(pl.mac, [0; 32], "an ask carries no MAC");

    // Duplicated: two CHALLENGEs; a forged one (another echo) is ignored.
    let ch1 = sw.answer(&ask2, IP, 1000, t1);
    let ch2 = sw.answer(&ask2, IP, 1000, t1);
    let mut forged = ch1.clone();
    forged[HEADER_LEN] ^= 1;
    assert!(p.handle(&forged, t1).is_none());
    assert_eq!(p.stats().claims_sent, 0);
    assert_eq!(p.challenged(), None);
    assert!(p.handle(&ch1, t1).is_none());
    assert_eq!(p.challenged(), Some(7));
    let claim = send(&mut p, t1).expect("the claim goes at once");
    assert!(
        p.handle(&ch2, t1).is_none(),
        "a second CHALLENGE changes nothing"
    );
    let t2 = t1 + PROVISION_RESEND;
    let claim2 = send(&mut p, t2).unwrap();
    assert_eq!(claim, claim2, "the claim is resent unchanged");
    let ch = HeaderRepr::parse(&Header::new_checked(&claim[..]).unwrap()).unwrap();
    assert_eq!((ch.count, ch.gen), (PROVISION_CLAIM, 7));

    let ans = sw.answer(&claim2, IP, 1000, t2);
    // A PROVISIONED with a bad tag, or echoing another nonce, is ignored.
    let mut bad = ans.clone();
    *bad.last_mut().unwrap() ^= 1;
    assert!(p.handle(&bad, t2).is_none());
    assert_eq!(p.stats().bad_tags, 1);
    let mut other = ans.clone();
    other[HEADER_LEN] ^= 1;
    assert!(p.handle(&other, t2).is_none());
    match p.handle(&ans, t2) {
        Some(Outcome::Provisioned {
            job,
            gen,
            secret,
            lease_secs,
            created,
        }) => {
            assert_eq!((job, gen, lease_secs, created), (32768, 7, 60, true));
            assert_eq!(secret, spec(KEY, "run-1").job_secret());
        }
        o => panic!("{o:?}"),
    }
    // Final: nothing more is sent or taken.
    assert!(send(&mut p, t2 + PROVISION_RESEND * 5).is_none());
    assert!(p.handle(&ans, t2).is_none());

    // Another rank of the same run reaches the same job; it did not create it.
    let mut q = prov(1, KEY, "run-1");
    match run(&mut q, &mut sw, t2) {
        Outcome::Provisioned { job, created, .. } => assert_eq!((job, created), (32768, false)),
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_stale_nonce_or_generation_asks_again_with_a_fresh_nonce() {
    let t0 = Instant::now();
    let mut sw = FakeSwitch::new(1, "vision", KEY, t0);
    let mut p = prov(0, KEY, "j");
    p.start(t0);
    let ask = send(&mut p, t0).unwrap();
    let ch = sw.answer(&ask, IP, 1000, t0);
    assert!(p.handle(&ch, t0).is_none());
    let claim = send(&mut p, t0).unwrap();
    // The switch restarted between CHALLENGE and claim: NACK 7.
    sw.gen = 2;
    let nack = sw.answer(&claim, IP, 1000, t0);
    assert!(p.handle(&nack, t0).is_none());
    let ask2 = send(&mut p, t0).expect("a new ask at once");
    let nonce = |b: &[u8]| ProvisionPayload::parse(&b[HEADER_LEN..]).unwrap().nonce;
    assert_ne!(nonce(&ask), nonce(&ask2));
    assert_eq!(
        HeaderRepr::parse(&Header::new_checked(&ask2[..]).unwrap())
            .unwrap()
            .count,
        PROVISION_ASK
    );
    // A NACK 9 to the new claim asks again too; then it goes through.
    let ch = sw.answer(&ask2, IP, 1000, t0);
    assert!(p.handle(&ch, t0).is_none());
    let claim = send(&mut p, t0).unwrap();
    let mut h = HeaderRepr::new(MsgType::Nack, 0);
    h.gen = 2;
    let mut b = vec![0u8; HEADER_LEN + NACK_PAYLOAD_LEN];
    h.emit_to(&mut b).unwrap();
    NackPayload::echoing(NackReason::StaleNonce, nonce(&claim))
        .emit(&mut b[HEADER_LEN..])
        .unwrap();
    assert!(p.handle(&b, t0).is_none());
    assert_eq!(p.stats().restarts, 2);
    let ask3 = send(&mut p, t0).unwrap();
    let ch = sw.answer(&ask3, IP, 1000, t0);
    assert!(p.handle(&ch, t0).is_none());
    let claim = send(&mut p, t0).unwrap();
    let ans = sw.answer(&claim, IP, 1000, t0);
    assert!(matches!(
        p.handle(&ans, t0),
        Some(Outcome::Provisioned { gen: 2, .. })
    ));
}

#[test]
fn refusals_are_typed_and_say_what_to_do() {
    let t0 = Instant::now();
    let mut sw = FakeSwitch::new(1, "vision", KEY, t0);

    // A wrong tenant key: the claim's MAC fails.
    let e = refusal(run(&mut prov(0, [0x33; 32], "j"), &mut sw, t0));
    assert!(matches!(e, ProvisionError::BadKey(_)));
    assert_eq!(e.reason(), Some(NackReason::BadSecret));
    let msg = e.to_string();
    assert!(
        msg.contains("the tenant key does not match the switch's for tenant \"vision\"")
            && msg.contains("--tenant-key-file"),
        "{msg}"
    );
    assert!(!msg.contains("33333333"));

    // An unknown tenant.
    let mut other = Provisioner::new(
        ProvisionSpec {
            tenant: TenantName::new("audio").unwrap(),
            ..spec(KEY, "j")
        },
        asker(0, 4),
        [1; 32],
    );
    let e = refusal(run(&mut other, &mut sw, t0));
    assert!(matches!(e, ProvisionError::UnknownTenant(_)), "{e}");
    assert!(e.to_string().contains("\"audio\""));

    // Same name, another shape.
    assert!(matches!(
        run(&mut prov(0, KEY, "j"), &mut sw, t0),
        Outcome::Provisioned { .. }
    ));
    let mut bigger = Provisioner::new(spec(KEY, "j"), asker(0, 8), [2; 32]);
    let e = refusal(run(&mut bigger, &mut sw, t0));
    assert!(matches!(e, ProvisionError::ParametersDiffer(_)));
    assert!(e
        .to_string()
        .contains("a job named \"j\" of tenant \"vision\" exists with another shape"));

    // The quota: max_jobs, named with its advice.
    sw.max_jobs = 1;
    let e = refusal(run(&mut prov(0, KEY, "k"), &mut sw, t0));
    assert_eq!(e.quota(), Some(Quota::MaxJobs));
    assert_eq!(e.reason(), Some(NackReason::QuotaExceeded));
    let msg = e.to_string();
    assert!(
        msg.contains("max_jobs") && msg.contains(Quota::MaxJobs.advice()),
        "{msg}"
    );
}

#[test]
fn answers_to_other_requests_and_other_addresses() {
    let t0 = Instant::now();
    let mut sw = FakeSwitch::new(1, "vision", KEY, t0);
    let mut p = prov(0, KEY, "j");
    p.start(t0);
    let ask = send(&mut p, t0).unwrap();
    // A NACK echoing someone else's nonce is not ours.
    let mut h = HeaderRepr::new(MsgType::Nack, 0);
    h.gen = 1;
    let mut b = vec![0u8; HEADER_LEN + NACK_PAYLOAD_LEN];
    h.emit_to(&mut b).unwrap();
    NackPayload::echoing(NackReason::UnknownTenant, [7; 16])
        .emit(&mut b[HEADER_LEN..])
        .unwrap();
    assert!(p.handle(&b, t0).is_none());
    assert!(p.is_running());
    // The switch sees another address (NAT): fatal, and says so.
    let ch = sw.answer(&ask, [198, 18, 0, 99], 1000, t0);
    let e = refusal(p.handle(&ch, t0).unwrap());
    assert!(matches!(e, ProvisionError::AddressMismatch { .. }));
    assert!(e.to_string().contains("address translation"));
    assert!(!p.is_running());
}

#[test]
fn the_tenant_key_and_the_secret_never_print() {
    let t0 = Instant::now();
    let mut sw = FakeSwitch::new(1, "vision", KEY, t0);
    let mut p = prov(0, KEY, "j");
    let dbg = format!("{p:?}");
    assert!(
        dbg.contains("<redacted>") && !dbg.contains(&format!("{KEY:?}")),
        "{dbg}"
    );
    let o = run(&mut p, &mut sw, t0);
    let Outcome::Provisioned { secret, .. } = &o else {
        panic!("{o:?}")
    };
    let dbg = format!("{o:?}");
    assert!(dbg.contains("<redacted>"));
    assert!(!dbg.contains(&format!("{secret:?}")), "{dbg}");
}

/// A leaf's split send: `poll_due` says whether an ask or claim is due
/// (counting it, restarting the timer), `emit` writes the current one
/// whenever asked, the same bytes `poll_transmit` sends; nothing when idle
/// or done.
#[test]
fn poll_due_and_emit_are_poll_transmit_in_two() {
    let t0 = Instant::now();
    let mut p = prov(0, KEY, "run-1");
    let mut b = vec![0u8; PROVISION_LEN];
    assert!(!p.poll_due(t0));
    assert_eq!(p.emit(&mut b), None, "idle");
    p.start(t0);
    let mut twin = p.clone();
    assert!(p.poll_due(t0));
    assert!(!p.poll_due(t0), "not again before the resend");
    let n = p.emit(&mut b).unwrap();
    assert_eq!(Some(b[..n].to_vec()), send(&mut twin, t0), "the ask");
    assert_eq!(p.emit(&mut b), Some(n), "emit leaves the timer alone");
    assert!(!p.poll_due(t0 + PROVISION_RESEND / 2));
    assert!(p.poll_due(t0 + PROVISION_RESEND));
    assert_eq!(p.stats().asks_sent, 2);
    // After the CHALLENGE, the claim; after the outcome, nothing.
    let mut sw = FakeSwitch::new(7, "vision", KEY, t0);
    let ans = sw.answer(&b[..n], IP, p.asker().port, t0);
    assert!(p.handle(&ans, t0).is_none());
    let t1 = t0 + PROVISION_RESEND;
    assert!(p.poll_due(t1), "the claim goes at once");
    let n = p.emit(&mut b).unwrap();
    let ans = sw.answer(&b[..n], IP, p.asker().port, t1);
    assert!(matches!(
        p.handle(&ans, t1),
        Some(Outcome::Provisioned { .. })
    ));
    assert_eq!(p.stats().claims_sent, 1);
    assert!(!p.poll_due(t1 + PROVISION_RESEND));
    assert_eq!(p.emit(&mut b), None, "done");
}
