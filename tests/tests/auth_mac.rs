//! End-to-end tests of `auth = "mac"` (issue 20, item 3): a job whose DATA
//! and RESULT carry a tag runs bit-exact through switchd, and a DATA that an
//! attacker altered on the wire, with the member's own addresses, is dropped
//! as `bad_tag` and never summed.

use std::process::Child;

use agg_e2e::*;

/// switchd's config for `tb` with one job of 4 workers and `auth`.
fn config(tb: &Testbed, auth: &str) -> SwitchConfig {
    SwitchConfig::for_testbed(tb)
        .set("agg_port", i64::from(AGG_PORT))
        .job(Job::new(1, 4, &tb.worker_sources()).set("auth", auth))
}

/// `worker allreduce` on the mmsg transport (one datagram per DATA, which
/// the attacker's capture takes apart).
fn spawn(tb: &Testbed, rank: u16, elements: usize, iterations: u32) -> Child {
    let mut c = allreduce_cmd(
        tb,
        &tb.worker_ns(rank),
        1,
        rank,
        4,
        elements,
        iterations,
        30,
    );
    c.args(["--transport", "mmsg"]);
    spawn_piped(c)
}

#[test]
#[ignore = "needs root"]
fn tagged_all_reduce_is_bit_exact_and_a_flipped_data_byte_is_dropped_as_bad_tag() {
    if !can_run("auth_mac") {
        return;
    }
    let tb = Testbed::up("ma1", 4, 1);
    let mut sw = Switchd::start_in(&tb.switch_ns(), "ma1", &config(&tb, "mac"));
    let workers: Vec<Child> = (0..4).map(|r| spawn(&tb, r, 2_000_000, 20)).collect();
    sw.wait_stats(30, "job active", |s| s["jobs"][0]["state"] == "active");
    let jobs = sw.switchctl(&["jobs"]);
    assert!(jobs.status.success(), "{}", text(&jobs));
    let line = String::from_utf8_lossy(&jobs.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with('1'))
        .unwrap_or_default()
        .to_owned();
    assert!(
        line.trim_end().ends_with("mac"),
        "switchctl jobs: {}",
        text(&jobs)
    );
    // From worker 1's own namespace (its MAC, IP, UDP port and switch
    // port): 200 of its DATA frames, each with one payload bit flipped and
    // a correct UDP checksum, sent again while the all-reduce runs.
    let sent = attack_py(&tb, &tb.worker_ns(1), &["flip-data", "eth0", "10", "200"]);
    assert!(sent >= 50, "only {sent} DATA frames captured");
    let reports = expect_verified(workers);
    for (r, v) in reports.iter().enumerate() {
        assert_eq!(v["auth"], "mac", "rank {r}: {v}");
        assert_eq!(v["stats"]["bad_tag_results"], 0, "rank {r}: {v}");
    }
    let stats = stop_clean(&tb, &mut sw);
    let j = job(&stats, 1);
    assert_eq!(
        j["drops"]["bad_tag"].as_u64(),
        Some(sent),
        "every altered DATA is dropped as bad_tag: {j}"
    );
}
