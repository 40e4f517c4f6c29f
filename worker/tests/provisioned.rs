//! Self-provisioned jobs through the worker library against
//! `worker::loopback` with a tenant (the same `proto` switch and job
//! table switchd runs): ranks provision a job by tenant and name, join it
//! and all-reduce bit for bit; after a switch restart they provision again
//! and go on; after every rank left, the same name gives a job again; the
//! tenant's quota and a wrong key are typed errors that say what to do.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use proto::provision::{JobName, TenantName};
use proto::reference::{expected_sum, fill_pattern};
use proto::wire::Quota;
use worker::loopback::{LoopbackConfig, LoopbackSwitch};
use worker::probe::{probe_switch, SwitchAnswer};
use worker::{AuthMode, ProvisionError, ProvisionSpec, Worker, WorkerConfig, WorkerError};

const KEY: [u8; 32] = [0x4d; 32];

fn stand_in(max_jobs: u16) -> LoopbackSwitch {
    let mut cfg = LoopbackConfig::new(1, 2, [0x5a; 32]);
    cfg.tenants = vec![LoopbackConfig::tenant(
        TenantName::new("vision").unwrap(),
        KEY,
        max_jobs,
    )];
    LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap()
}

fn config(sw: &LoopbackSwitch, key: [u8; 32], job: &str, rank: u16, n: u16) -> WorkerConfig {
    let spec = ProvisionSpec {
        tenant: TenantName::new("vision").unwrap(),
        key,
        job_name: JobName::new(job).unwrap(),
        auth: AuthMode::Port,
        stats: false,
        priority: 1,
    };
    let mut cfg = WorkerConfig::provisioned(sw.addr(), spec, rank, n);
    cfg.join_timeout = Duration::from_secs(20);
    cfg
}

/// `n` ranks of job `job` all-reduce `iterations` times, checked bit for
/// bit; `mid(it)` runs on rank 0 before iteration `it`. Returns the job
/// ids the ranks ended on.
fn run(
    sw: &LoopbackSwitch,
    job: &str,
    n: u16,
    iterations: u32,
    mid: impl Fn(u32) + Sync,
) -> Vec<u16> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let mid = &mid;
                s.spawn(move || {
                    let mut w = Worker::join(config(sw, KEY, job, rank, n)).expect("join");
                    let mut data = vec![0f32; 5_000];
                    for it in 0..iterations {
                        if rank == 0 {
                            mid(it);
                        }
                        fill_pattern(rank, it, &mut data);
                        w.all_reduce(&mut data).expect("all_reduce");
                        for (i, v) in data.iter().enumerate() {
                            assert_eq!(
                                v.to_bits(),
                                expected_sum(n, it, i).to_bits(),
                                "rank {rank} it {it} elem {i}"
                            );
                        }
                    }
                    let job = w.job();
                    w.leave().expect("leave");
                    job
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn four_ranks_provision_and_all_reduce_bit_exact_then_the_name_works_again() {
    let sw = stand_in(4);
    let ids = run(&sw, "run-a", 4, 3, |_| {});
    assert!(ids.iter().all(|&j| j == ids[0] && j >= 32768), "{ids:?}");
    // Every rank left: the job ended; the same name makes it again.
    let again = run(&sw, "run-a", 4, 1, |_| {});
    assert!(again.iter().all(|&j| j == again[0]), "{again:?}");
}

#[test]
fn a_switch_restart_makes_the_ranks_provision_again_and_go_on() {
    let sw = stand_in(4);
    let restart = sw.restarter();
    run(&sw, "run-b", 2, 4, move |it| {
        if it == 2 {
            restart();
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

#[test]
fn the_quota_and_a_wrong_key_are_typed_refusals() {
    let sw = stand_in(1);
    // One job is the tenant's quota: a second name is refused, naming it.
    let hold = std::thread::scope(|s| {
        let h = s.spawn(|| Worker::join(config(&sw, KEY, "first", 0, 1)).expect("join"));
        h.join().unwrap()
    });
    let err = Worker::join(config(&sw, KEY, "second", 0, 1))
        .err()
        .expect("over quota");
    match &err {
        WorkerError::Provision { source, .. } => assert_eq!(source.quota(), Some(Quota::MaxJobs)),
        e => panic!("{e}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("max_jobs") && msg.contains(Quota::MaxJobs.advice()),
        "{msg}"
    );
    // A wrong key creates nothing and says which flag to check.
    let err = Worker::join(config(&sw, [0x11; 32], "first", 0, 1))
        .err()
        .expect("bad key");
    assert!(
        matches!(
            err,
            WorkerError::Provision {
                source: ProvisionError::BadKey(_),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--tenant-key-file"), "{err}");
    // The probe of a provisioned job: an ask, answered with a CHALLENGE.
    let got = probe_switch(&config(&sw, KEY, "third", 0, 1), Duration::from_secs(2)).unwrap();
    assert!(matches!(got, SwitchAnswer::Alive { .. }), "{got:?}");
    let other = {
        let mut c = config(&sw, KEY, "x", 0, 1);
        if let Some(p) = c.provision.as_mut() {
            p.tenant = TenantName::new("nobody").unwrap();
        }
        c
    };
    let got = probe_switch(&other, Duration::from_secs(2)).unwrap();
    assert_eq!(
        got,
        SwitchAnswer::Refused(proto::wire::NackReason::UnknownTenant)
    );
    hold.leave().unwrap();
}
