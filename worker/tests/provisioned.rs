//! Self-provisioned jobs through the worker library against
//! `worker::loopback` with a tenant (the same `proto` switch and job
//! table switchd runs): ranks provision a job by tenant and name, join it
//! and all-reduce bit for bit; after a switch restart they provision again
//! and go on; after every rank left, the same name gives a job again; the
//! tenant's quota and a wrong key are typed errors that say what to do; a
//! pause between collectives longer than the lease keeps the job while the
//! ranks run `Worker::keepalive`, and without it the job ends by its lease
//! (the stand-in runs the table's timers) and the next collective makes it
//! again.

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
    stand_in_leased(max_jobs, proto::switch::tenant::DEFAULT_LEASE)
}

fn stand_in_leased(max_jobs: u16, lease: Duration) -> LoopbackSwitch {
    let mut cfg = LoopbackConfig::new(1, 2, [0x5a; 32]);
    let mut t = LoopbackConfig::tenant(TenantName::new("vision").unwrap(), KEY, max_jobs);
    t.lease = lease;
    cfg.tenants = vec![t];
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
        WorkerError::Provision { refusal, .. } => assert_eq!(refusal.quota(), Some(Quota::MaxJobs)),
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
                refusal: ProvisionError::BadKey(_),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--tenant-key-file"), "{err}");
    // The CLI prints errors with their chain (anyhow's `{:#}`): said once.
    let chained = format!("{:#}", anyhow::Error::from(err));
    assert_eq!(chained.matches("NACK 2").count(), 1, "{chained}");
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

/// Two ranks of a job with a 2 s lease all-reduce, pause 3.5 s (longer
/// than the lease) and all-reduce again. With `keepalive` they call
/// `Worker::keepalive` every 100 ms while paused: the job stays (no
/// rejoin). Without, the stand-in ends the job by its lease, and the next
/// collective finds it gone and makes it again (a rejoin). Bit-exact
/// either way. With `restart` the switch restarts 1 s into the pause: a
/// keepalive finds the job gone and the next collective joins again.
/// Returns each rank's (job id before, after, rejoins).
fn pause(keepalive: bool, restart: bool) -> Vec<(u16, u16, u64)> {
    let sw = stand_in_leased(4, Duration::from_secs(2));
    let job = if keepalive {
        "paused-alive"
    } else {
        "paused-dead"
    };
    let restarter = sw.restarter();
    let restarter = &restarter;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u16)
            .map(|rank| {
                let sw = &sw;
                s.spawn(move || {
                    let mut w = Worker::join(config(sw, KEY, job, rank, 2)).expect("join");
                    assert_eq!(w.keepalive_interval(), Some(Duration::from_secs(2) / 3));
                    let mut data = vec![0f32; 5_000];
                    let mut check = |w: &mut Worker, it: u32| {
                        fill_pattern(rank, it, &mut data);
                        w.all_reduce(&mut data).expect("all_reduce");
                        for (i, v) in data.iter().enumerate() {
                            assert_eq!(v.to_bits(), expected_sum(2, it, i).to_bits());
                        }
                    };
                    check(&mut w, 0);
                    let before = w.job();
                    let start = std::time::Instant::now();
                    let mut restarted = !restart || rank != 0;
                    while start.elapsed() < Duration::from_millis(3500) {
                        if !restarted && start.elapsed() >= Duration::from_secs(1) {
                            restarter();
                            restarted = true;
                        }
                        if keepalive {
                            w.keepalive().expect("keepalive");
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    check(&mut w, 1);
                    let r = (before, w.job(), w.stats().rejoins);
                    w.leave().expect("leave");
                    r
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_pause_longer_than_the_lease_keeps_the_job_with_keepalives() {
    let got = pause(true, false);
    assert!(
        got.iter().all(|&(a, b, rejoins)| a == b && rejoins == 0),
        "{got:?}"
    );
}

#[test]
fn without_keepalives_the_lease_ends_the_job_and_the_next_collective_makes_it_again() {
    let got = pause(false, false);
    assert!(got.iter().all(|&(_, _, rejoins)| rejoins >= 1), "{got:?}");
}

#[test]
fn a_switch_restart_during_a_pause_is_found_by_a_keepalive_and_joined_again() {
    let got = pause(true, true);
    assert!(got.iter().all(|&(_, _, rejoins)| rejoins >= 1), "{got:?}");
}
