//! End-to-end test of a gradient-statistics job's declaration (issue 23):
//! `switchctl job add --stats` through switchd's admin socket, a default
//! chunk that leaves room for the 24-byte trailer, and `switchctl jobs`
//! showing it (text and JSON). Needs root.

use agg_e2e::*;

#[test]
#[ignore = "needs root"]
fn a_stats_job_is_added_and_listed_with_room_for_its_trailer() {
    if !can_run("stats_switch") {
        return;
    }
    let tb = Testbed::up("ss1", 2, 0);
    let mut sw = Switchd::start(&tb, &[]);
    let subnet = tb.subnet().to_string();
    let add = |id: &str, stats: bool| {
        let mut args = vec![
            "job",
            "add",
            "--id",
            id,
            "--workers",
            "2",
            "--allow",
            &subnet,
            "--secret-file",
            secret_file(),
        ];
        if stats {
            args.push("--stats");
        }
        let out = sw.switchctl(&args);
        assert!(out.status.success(), "{}", text(&out));
    };
    add("7", true);
    add("8", false);

    let jobs = sw.switchctl(&["--json", "jobs"]);
    let jobs: serde_json::Value = serde_json::from_slice(&jobs.stdout).unwrap();
    let got: Vec<(u64, bool, u64)> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["id"].as_u64().unwrap(),
                j["stats"].as_bool().unwrap(),
                j["elems_per_chunk"].as_u64().unwrap(),
            )
        })
        .collect();
    // MTU 1500: 358 float32 elements ((1500 − 50) / 4 less the RESULT's
    // 16-byte token), 6 fewer (24 bytes) with statistics.
    assert_eq!(got, [(7, true, 352), (8, false, 358)], "{jobs}");

    let listing = text(&sw.switchctl(&["jobs"]));
    // The column named "stats" (auth stays last: other tests read it).
    let header: Vec<&str> = listing
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let col = header
        .iter()
        .position(|h| *h == "stats")
        .unwrap_or_else(|| panic!("no stats column: {listing}"));
    let stats_of = |id: &str| {
        listing
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.first() == Some(&id))
            .unwrap_or_else(|| panic!("job {id} listed: {listing}"))
            .get(col)
            .map(|s| s.to_string())
            .unwrap_or_default()
    };
    assert_eq!(stats_of("7"), "on", "{listing}");
    assert_eq!(stats_of("8"), "off", "{listing}");
    let (ok, _) = sw.stop();
    assert!(ok);
}
