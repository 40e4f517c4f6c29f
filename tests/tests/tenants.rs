//! End-to-end tests of issue 37: tenants and self-provisioned jobs
//! (docs/PROTOCOL.md, "Tenants and self-provisioned jobs"). switchd runs
//! with `[[tenant]]`s and no `[[job]]`; workers name their jobs with the
//! tenant key (`worker allreduce --tenant T --tenant-key-file F --job-name
//! NAME`) and nobody runs `switchctl job add`. What a user sees is
//! checked: verified sums, the refusal's text, `switchctl jobs` and the
//! counters, the pool memory coming back. Two tenants' jobs at once and a
//! quota refusal; one tenant's key against another's job; a killed job
//! ending with its lease; a switchd restart; a leaf–spine tree with
//! tenants only. Each test makes its own testbed (prefix `tn…`) and key
//! directory and removes them, also on failure.

use std::process::Child;
use std::time::{Duration, Instant};

use agg_e2e::tenants::*;
use agg_e2e::*;

/// Tenant A's and B's job id ranges (they must not overlap).
const A_IDS: [i64; 2] = [32768, 40000];
const B_IDS: [i64; 2] = [40001, 65535];

/// Rank `job.rank` of a named job, in worker namespace `job.rank`.
fn spawn_named(tb: &Testbed, job: &Named) -> Child {
    spawn_piped(provisioned_cmd(
        tb,
        &tb.worker_ns(job.rank),
        tb.switch_addr(),
        job,
    ))
}

/// Every rank of a named job of `n` ranks, rank r in worker namespace r.
fn spawn_job(tb: &Testbed, key: &TenantKey, name: &str, n: u16, size: (usize, u32)) -> Vec<Child> {
    (0..n)
        .map(|r| spawn_named(tb, &Named::new(key, name, r, n).size(size.0, size.1)))
        .collect()
}

/// Runs one rank to its end; it must fail. Returns what it printed.
fn expect_refused(mut cmd: std::process::Command) -> String {
    let started = Instant::now();
    cmd.args(["--join-timeout", "10"]);
    let out = wait_with_timeout(spawn_piped(cmd), Duration::from_secs(30));
    let t = text(&out);
    assert!(!out.status.success(), "a refused worker succeeded: {t}");
    eprintln!("refused in {:.1?}: {}", started.elapsed(), t.trim());
    t
}

/// The id every report of one job names (they must agree).
fn job_id(reports: &[serde_json::Value]) -> u64 {
    let id = reports[0]["job"].as_u64().expect("a job id in the report");
    for r in reports {
        assert_eq!(
            r["job"], id,
            "ranks of one name reached different jobs: {reports:?}"
        );
    }
    id
}

fn pool_in_use(sw: &Switchd) -> u64 {
    counter(&sw.live_stats(), "pool_in_use_bytes")
}

/// Tenants team-a (at most 2 jobs) and team-b on the workers of `tb`,
/// their keys in `keys`; switchd with no job.
fn start_two_tenants(tb: &Testbed, keys: &KeyDir) -> (Switchd, TenantKey, TenantKey) {
    let (a, b) = (keys.key("team-a"), keys.key("team-b"));
    let cfg = SwitchConfig::for_testbed(tb)
        .tenant(
            tenant(&a, &tb.worker_sources())
                .set("max_jobs", 2)
                .set("job_ids", A_IDS.to_vec()),
        )
        .tenant(tenant(&b, &tb.worker_sources()).set("job_ids", B_IDS.to_vec()));
    let sw = Switchd::start_in(&tb.switch_ns(), &tb.prefix, &cfg);
    (sw, a, b)
}

#[test]
#[ignore = "needs root"]
fn two_tenants_provision_three_jobs_by_name_and_a_fourth_is_refused_by_quota() {
    if !can_run("tenants_by_name") {
        return;
    }
    let started = Instant::now();
    let tb = Testbed::up("tn1", 4, 0);
    let keys = KeyDir::new("tn1");
    let (mut sw, a, b) = start_two_tenants(&tb, &keys);
    assert!(
        jobs_listing(&sw).is_empty(),
        "a config without jobs has none"
    );
    let pool_before = pool_in_use(&sw);
    let before = sw.live_stats();

    // Three jobs at once, 4 ranks each: every worker namespace runs one
    // rank of each (3 worker processes each). Long enough (seconds) that
    // team-a's quota is full while its third job asks.
    let size = (200_000, 40);
    let mut children = spawn_job(&tb, &a, "a-one", 4, size);
    children.extend(spawn_job(&tb, &a, "a-two", 4, size));
    children.extend(spawn_job(&tb, &b, "b-one", 4, size));
    wait_jobs(&sw, 30.0, "team-a's two jobs and team-b's one", |jobs| {
        jobs.iter().filter(|j| j["tenant"] == "team-a").count() == 2
            && jobs.iter().any(|j| j["tenant"] == "team-b")
    });

    // team-a's third job: refused, naming the quota and what to do.
    let third = Named::new(&a, "a-three", 0, 4);
    let t = expect_refused(provisioned_cmd(
        &tb,
        &tb.worker_ns(0),
        tb.switch_addr(),
        &third,
    ));
    assert!(
        t.contains("a-three")
            && t.contains("quota max_jobs")
            && t.contains("NACK 11")
            && t.contains("wait for one of the tenant's jobs to end"),
        "the refusal names the job, the quota and what to do: {t}"
    );
    // Still both of team-a's jobs (so the quota was full when it asked),
    // and no a-three.
    let listed = jobs_listing(&sw);
    assert_eq!(
        listed.iter().filter(|j| j["tenant"] == "team-a").count(),
        2,
        "{listed:?}"
    );
    assert!(
        !listed.iter().any(|j| j["job_name"] == "a-three"),
        "{listed:?}"
    );
    // What the operator sees: tenant, origin, name and lease of each.
    let table = text(&sw.switchctl(&["jobs"]));
    for (tenant_name, job_name) in [
        ("team-a", "a-one"),
        ("team-a", "a-two"),
        ("team-b", "b-one"),
    ] {
        let line = table
            .lines()
            .find(|l| l.split_whitespace().any(|w| w == job_name))
            .unwrap_or_else(|| panic!("no line for {job_name} in switchctl jobs:\n{table}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(
            words.contains(&"provisioned") && words.contains(&tenant_name),
            "{job_name}: {line}\n{table}"
        );
        // The lease: whole seconds left, "NNs", at most the default 60.
        let lease = words
            .iter()
            .filter_map(|w| w.strip_suffix('s')?.parse::<u64>().ok())
            .next_back()
            .unwrap_or_else(|| panic!("no lease (NNs) on {job_name}'s line: {line}"));
        assert!(
            (1..=60).contains(&lease),
            "{job_name}'s lease {lease}: {line}"
        );
    }
    eprintln!("switchctl jobs while they run:\n{table}");
    let pool_during = pool_in_use(&sw);
    assert!(pool_during > pool_before, "{pool_during} vs {pool_before}");

    let reports = expect_verified(children);
    let (a1, a2, b1) = (
        job_id(&reports[0..4]),
        job_id(&reports[4..8]),
        job_id(&reports[8..12]),
    );
    assert!(a1 != a2, "team-a's two names are two jobs: {a1} {a2}");
    for id in [a1, a2] {
        assert!(
            (A_IDS[0] as u64..=A_IDS[1] as u64).contains(&id),
            "team-a's job id {id} outside its job_ids"
        );
    }
    assert!(
        (B_IDS[0] as u64..=B_IDS[1] as u64).contains(&b1),
        "team-b's id {b1}"
    );

    // Every rank left: the jobs are gone and their pools are back.
    let gone = wait_jobs(&sw, 10.0, "every job gone after its ranks left", |j| {
        j.is_empty()
    });
    let after = sw.live_stats();
    assert_eq!(counter(&after, "pool_in_use_bytes"), pool_before, "{after}");
    let delta = |k: &str| counter(&after, k) - counter(&before, k);
    assert_eq!(delta("provisioned_jobs"), 3, "{after}");
    assert_eq!(delta("jobs_ended_left"), 3, "{after}");
    assert_eq!(delta("jobs_ended_lease"), 0, "{after}");
    assert!(delta("provision_refused") >= 1, "{after}");
    eprintln!(
        "pool in use: {pool_before} B before, {pool_during} B with 3 jobs, {} B after; \
         jobs gone {gone:.1?} after the last rank exited; test took {:.1?}",
        counter(&after, "pool_in_use_bytes"),
        started.elapsed()
    );
    stop_clean(&tb, &mut sw);
}

#[test]
#[ignore = "needs root"]
fn another_tenants_key_neither_provisions_nor_joins_its_job_and_names_are_per_tenant() {
    if !can_run("tenants_isolated") {
        return;
    }
    let started = Instant::now();
    let tb = Testbed::up("tn2", 4, 0);
    let keys = KeyDir::new("tn2");
    let (mut sw, a, b) = start_two_tenants(&tb, &keys);
    let name = "shared-name";
    // team-a's job on workers 0 and 1: rank 0 provisions it and waits
    // (it exists, joining) while team-b tries; rank 1 comes after.
    let a_rank = |r: u16, join_timeout: &str| {
        let job = Named::new(&a, name, r, 2).size(200_000, 10);
        let mut c = provisioned_cmd(&tb, &tb.worker_ns(r), tb.switch_addr(), &job);
        c.args(["--join-timeout", join_timeout]);
        spawn_piped(c)
    };
    let a_rank0 = a_rank(0, "60");
    wait_jobs(&sw, 30.0, "team-a's job", |jobs| {
        jobs.iter().any(|j| j["tenant"] == "team-a")
    });
    let a_job = provisioned_jobs(&sw, "team-a")[0].clone();
    let a_id = a_job["id"].as_u64().unwrap();

    // team-b's key under team-a's name: the key does not match.
    let mut lie = Named::new(&b, name, 0, 2);
    lie.tenant = "team-a";
    let t = expect_refused(provisioned_cmd(
        &tb,
        &tb.worker_ns(2),
        tb.switch_addr(),
        &lie,
    ));
    assert!(
        t.contains("tenant key does not match") && t.contains("NACK 2"),
        "a wrong tenant key is named as such: {t}"
    );
    let listed = jobs_listing(&sw);
    assert_eq!(
        listed.len(),
        1,
        "a refused claim created nothing: {listed:?}"
    );

    // team-b's key, its own tenant, team-a's job's id: the secret derived
    // from team-b's key is not team-a's job's, so the JOIN is refused.
    let mut join = tb.cmd_in(&tb.worker_ns(2), worker_bin());
    join.args(["allreduce", "--switch", &tb.switch_addr().to_string()])
        .args(["--job", &a_id.to_string(), "--rank", "0", "--workers", "2"])
        .env(proto::secret::SECRET_ENV, b.job_secret_hex(name))
        .args(["--elements", "1000", "--iterations", "1", "--json"]);
    let t = expect_refused(join);
    assert!(
        t.contains("bad secret") && t.contains(&format!("job {a_id}")),
        "a JOIN with another tenant's derived secret is refused as a bad secret: {t}"
    );

    // team-b names a job the same: its own job, another id.
    let b_ranks: Vec<Child> = (0..2)
        .map(|r| {
            let job = Named::new(&b, name, r, 2).size(100_000, 4);
            spawn_piped(provisioned_cmd(
                &tb,
                &tb.worker_ns(2 + r),
                tb.switch_addr(),
                &job,
            ))
        })
        .collect();
    let a_ranks = vec![a_rank0, a_rank(1, "30")];
    let b_reports = expect_verified(b_ranks);
    let b_id = job_id(&b_reports);
    assert_ne!(b_id, a_id, "team-b's {name:?} is not team-a's");
    assert!(
        (B_IDS[0] as u64..=B_IDS[1] as u64).contains(&b_id),
        "{b_id}"
    );
    let a_reports = expect_verified(a_ranks);
    assert_eq!(job_id(&a_reports), a_id);
    // team-a's job never reset: nobody else joined it.
    for r in &a_reports {
        assert_eq!(r["stats"]["rejoins"], 0, "team-a's rank rejoined: {r}");
    }
    let stats = sw.live_stats();
    assert_eq!(counter(&stats, "provisioned_jobs"), 2, "{stats}");
    eprintln!("test took {:.1?}", started.elapsed());
    stop_clean(&tb, &mut sw);
}

#[test]
#[ignore = "needs root"]
fn a_job_whose_ranks_were_killed_ends_with_its_lease() {
    if !can_run("tenants_lease") {
        return;
    }
    let started = Instant::now();
    let tb = Testbed::up("tn3", 2, 0);
    let keys = KeyDir::new("tn3");
    let a = keys.key("team-a");
    const LEASE: u64 = 3;
    let cfg = SwitchConfig::for_testbed(&tb)
        .tenant(tenant(&a, &tb.worker_sources()).set("lease_secs", LEASE as i64));
    let mut sw = Switchd::start_in(&tb.switch_ns(), &tb.prefix, &cfg);
    let pool_before = pool_in_use(&sw);
    let before = sw.live_stats();
    let mut ranks = spawn_job(&tb, &a, "doomed", 2, (1_000_000, 1000));
    // Well into its collectives: chunks completed.
    sw.wait_stats(30, "the job under way", |s| {
        s["jobs"].as_array().is_some_and(|j| {
            j.iter()
                .any(|j| j["chunks_completed"].as_u64() >= Some(2000))
        })
    });
    let listed = provisioned_jobs(&sw, "team-a");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(pool_in_use(&sw) > pool_before);
    for c in &mut ranks {
        c.kill().expect("SIGKILL to a rank");
    }
    for mut c in ranks {
        let _ = c.wait();
    }
    // Gone within the lease and a few seconds (the lease is sampled off
    // the hot path), and not before most of the lease passed.
    let gone = wait_jobs(
        &sw,
        (LEASE + 5) as f64,
        "the job gone after its lease",
        |j| j.is_empty(),
    );
    assert!(
        gone >= Duration::from_secs(LEASE - 1),
        "removed after {gone:?}, before its {LEASE} s lease ran out"
    );
    let after = sw.live_stats();
    let delta = |k: &str| counter(&after, k) - counter(&before, k);
    assert_eq!(delta("jobs_ended_lease"), 1, "{after}");
    assert_eq!(delta("jobs_ended_left"), 0, "{after}");
    assert_eq!(counter(&after, "pool_in_use_bytes"), pool_before, "{after}");
    eprintln!(
        "killed job gone {gone:.1?} after the kill (lease {LEASE} s); test took {:.1?}",
        started.elapsed()
    );
    stop_clean(&tb, &mut sw);
}

#[test]
#[ignore = "needs root"]
fn a_switchd_restart_mid_collective_is_reprovisioned_and_completes_verified() {
    if !can_run("tenants_restart") {
        return;
    }
    let started = Instant::now();
    let tb = Testbed::up("tn4", 4, 0);
    let keys = KeyDir::new("tn4");
    let a = keys.key("team-a");
    let cfg = SwitchConfig::for_testbed(&tb).tenant(tenant(&a, &tb.worker_sources()));
    let mut sw = Switchd::start_in(&tb.switch_ns(), &tb.prefix, &cfg);
    let ranks = spawn_job(&tb, &a, "survivor", 4, (500_000, 30));
    sw.wait_stats(30, "the job under way", |s| {
        s["jobs"].as_array().is_some_and(|j| {
            j.iter()
                .any(|j| j["chunks_completed"].as_u64() >= Some(3000))
        })
    });
    let old_gen = sw.live_stats()["generation"].as_u64().unwrap();
    sw.restart();
    let reports = expect_verified(ranks);
    let after = sw.live_stats();
    assert_ne!(after["generation"].as_u64().unwrap(), old_gen);
    for (r, rep) in reports.iter().enumerate() {
        assert!(
            rep["stats"]["rejoins"].as_u64().unwrap() >= 1,
            "rank {r} never re-joined: {rep}"
        );
    }
    job_id(&reports);
    // The new switchd made the job again from the workers' claims.
    assert_eq!(counter(&after, "provisioned_jobs"), 1, "{after}");
    wait_jobs(&sw, 10.0, "the job gone after its ranks left", |j| {
        j.is_empty()
    });
    eprintln!("test took {:.1?}", started.elapsed());
    stop_clean(&tb, &mut sw);
}

/// A tree of 2 leaves (2 workers each) and 2 spines with team-a declared
/// on every switch and no job anywhere: the leaves provision the job their
/// workers name, and on their spines (docs/PROTOCOL.md, "Trees"); the
/// all-reduce is verified against the tree-order sum.
#[test]
#[ignore = "needs root"]
fn a_tree_with_tenants_and_no_jobs_all_reduces_a_named_job_verified() {
    if !can_run("tenants_tree") {
        return;
    }
    let started = Instant::now();
    const LEAVES: u16 = 2;
    const SPINES: u16 = 2;
    const WPL: u16 = 2;
    /// The spines' idle lease: their job ends at the latest this long
    /// after the leaves stopped sending.
    const SPINE_LEASE: u64 = 3;
    let fabric = LeafSpine::up("tn5", LEAVES, SPINES, WPL, 0);
    let keys = KeyDir::new("tn5");
    let a = keys.key("team-a");
    // Spines: team-a from the leaves' subnets (where their uplinks send
    // from); leaves: team-a from their own subnet, its jobs up to both
    // spines.
    let leaf_nets: Vec<_> = (0..LEAVES).map(|i| fabric.leaf_subnet(i)).collect();
    let spine_addrs: Vec<String> = (0..SPINES)
        .map(|j| format!("{}:{AGG_PORT}", fabric.spine_addr(j)))
        .collect();
    let mut spines: Vec<Switchd> = (0..SPINES)
        .map(|j| {
            let ports: Vec<String> = (0..LEAVES).map(|i| fabric.downlink_port(j, i)).collect();
            let cfg = SwitchConfig::new(&ports, fabric.spine_addr(j))
                .set("forwarding", "bridge")
                .tenant(tenant(&a, &leaf_nets).set("lease_secs", SPINE_LEASE as i64));
            Switchd::start_in(&fabric.spine_ns(j), &format!("tn5-s{j}"), &cfg)
        })
        .collect();
    let mut leaves: Vec<Switchd> = (0..LEAVES)
        .map(|i| {
            let ports: Vec<String> = (0..WPL).map(|k| fabric.worker_port(i, k)).collect();
            let gw = fabric.leaf_gateway(i);
            let cfg = SwitchConfig::new(&ports, gw)
                .set("uplink", format!("{gw}:{UPLINK_PORT}"))
                .tenant(tenant(&a, &[fabric.leaf_subnet(i)]).upstream(i, LEAVES, &spine_addrs));
            Switchd::start_in(&fabric.leaf_ns(i), &format!("tn5-l{i}"), &cfg)
        })
        .collect();
    for sw in leaves.iter().chain(&spines) {
        assert!(jobs_listing(sw).is_empty(), "no switch has a job before");
    }
    let sizes = vec![WPL.to_string(); usize::from(LEAVES)].join(",");
    let ranks: Vec<Child> = (0..LEAVES)
        .flat_map(|i| (0..WPL).map(move |k| (i, k)))
        .map(|(i, k)| {
            let job = Named::new(&a, "tree-run", k, WPL).size(100_000, 3);
            let mut c = provisioned_cmd(
                &fabric,
                &fabric.worker_ns(i, k),
                fabric.leaf_gateway(i),
                &job,
            );
            c.args(["--tree-leaves", &sizes, "--leaf", &i.to_string()]);
            spawn_piped(c)
        })
        .collect();
    let reports = expect_verified(ranks);
    let exited = Instant::now();
    let id = job_id(&reports);
    for (i, sw) in leaves.iter().enumerate() {
        let s = sw.live_stats();
        assert_eq!(counter(&s, "provisioned_jobs"), 1, "leaf {i}: {s}");
    }
    for (j, sw) in spines.iter().enumerate() {
        let s = sw.live_stats();
        assert_eq!(
            counter(&s, "provisioned_jobs"),
            1,
            "spine {j}: the leaves provisioned the job there: {s}"
        );
    }
    // Every rank left: the leaves' jobs end, and the spines' (the leaves
    // left them, or at the latest their lease ran out); no pool stays
    // taken anywhere.
    for (name, sw, secs) in leaves
        .iter()
        .enumerate()
        .map(|(i, sw)| (format!("leaf {i}"), sw, 5))
        .chain(
            spines
                .iter()
                .enumerate()
                .map(|(j, sw)| (format!("spine {j}"), sw, SPINE_LEASE + 5)),
        )
    {
        wait_jobs(sw, secs as f64, &format!("{name}'s job gone"), |j| {
            j.is_empty()
        });
        let t = exited.elapsed();
        let s = sw.live_stats();
        assert_eq!(counter(&s, "pool_in_use_bytes"), 0, "{name}: {s}");
        eprintln!(
            "{name}: job gone {t:.1?} after the ranks exited (jobs_ended_left {}, \
             jobs_ended_lease {})",
            counter(&s, "jobs_ended_left"),
            counter(&s, "jobs_ended_lease")
        );
    }
    eprintln!("tree job {id}; test took {:.1?}", started.elapsed());
    for sw in leaves.iter_mut().chain(spines.iter_mut()) {
        let (ok, _) = sw.stop();
        assert!(ok, "switchd did not stop cleanly:\n{}", sw.log_text());
    }
}
