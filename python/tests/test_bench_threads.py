"""bench/harness: `scripts/bench efficiency` and `train` with
--worker-threads (issue 38): bench_efficiency_report.py on a fixture of rank
and peer reports (the switch per worker thread count T, gloo, OpenMPI),
bench_train_report.py on a fixture run folder (gloo, the switch at T = 1
and 2), the --worker-threads option and the scenarios' thread, folder and
seq-lane choices. No testbed, no root, no torch: the reports are written
here."""

import argparse
import json
import math
import os
import sys

import pytest

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "harness")
sys.path.insert(0, HARNESS)

import bench_efficiency_report as report  # noqa: E402
import bench_train_report as train_report  # noqa: E402
from options import thread_counts  # noqa: E402
from scenario import parse  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402
from lifecycle import lanes_for  # noqa: E402
from machine import runnable_threads  # noqa: E402
from scenarios.train import config_dir, thread_counts_of  # noqa: E402

MIB = 1
ELEMENTS = MIB * 1024 * 1024 // 4
REPEATS = 2
EPC = 2048  # elements per chunk


def bound():
    chunks = math.ceil(ELEMENTS / EPC)
    return (chunks * report.FRAME_HEADER_BYTES + ELEMENTS * 4) * 8 / 1e9


def switch_run(d, time_s, machine, workers, switchd, threads=None, ranks=4):
    """Rank reports whose slowest rank took time_s per all-reduce, with the
    machine's, the workers' (summed) and switchd's CPU per all-reduce."""
    d.mkdir(parents=True)
    for r in range(ranks):
        j = {"seconds": time_s * REPEATS * (1 if r == 0 else 0.9), "elems_per_chunk": EPC, "transport": "udp-gso",
             "stats": {"chunks_resent": r},
             # Rank 0 starts first and rank 1 ends last: the windows span both.
             "machine_busy_cpu_s": [100.0 + (0 if r == 0 else 0.01), 100.0 + machine * REPEATS - (0.01 if r != 1 else 0)],
             "process_cpu_s": [1.0, 1.0 + workers * REPEATS / ranks],
             "switchd_cpu_s": [50.0 + (0 if r == 0 else 0.01), 50.0 + switchd * REPEATS - (0.01 if r != 1 else 0)]}
        if threads is not None:
            j["threads"] = threads
        (d / f"rank{r}.json").write_text(json.dumps(j))
    return d


def peer_run(d, time_s, machine, workers):
    d.mkdir(parents=True)
    (d / "peer.json").write_text(json.dumps({
        "ranks": 4, "iterations": REPEATS, "mean_s": time_s, "median_s": time_s, "best_s": time_s * 0.9,
        "machine_busy_cpu_s": machine * REPEATS, "workers_cpu_s": workers * REPEATS, "verified": True}))
    return d


def write_manifest(tmp_path, entries):
    m = tmp_path / "runs.jsonl"
    m.write_text("".join(json.dumps({"dir": str(d), "mtu": 9000, "link": link, "method": method, "dtype": "f32",
                                     "transport": "auto" if method.startswith("switch") else "tcp",
                                     "threads": t}) + "\n"
                         for d, link, method, t in entries))
    return m


def fixture(tmp_path, many=False):
    """MTU 9000; gloo and OpenMPI; the switch at T = 1 (a worker without
    "threads" in its report) and T = 2 (ran 2) on unlimited and 1 Gbit/s
    links; with many, also 10 Gbit/s links and one worker alone."""
    e = [
        (peer_run(tmp_path / "u-mpi", 1.2, 2.5, 1.1), "unlimited", "openmpi_tso", None),
        (peer_run(tmp_path / "u-gloo", 1.0, 2.0, 1.0), "unlimited", "gloo_tso", None),
        (switch_run(tmp_path / "u-sw1", 0.8, 1.6, 0.8, 0.3), "unlimited", "switch", 1),
        (switch_run(tmp_path / "u-sw2", 0.6, 2.2, 0.7, 0.5, threads=2), "unlimited", "switch", 2),
        (peer_run(tmp_path / "g-mpi", 0.02, 0.5, 0.3), "1gbit", "openmpi_tso", None),
        (peer_run(tmp_path / "g-gloo", 0.0128, 0.4, 0.3), "1gbit", "gloo_tso", None),
        (switch_run(tmp_path / "g-sw1", bound() * 1.06, 0.3, 0.2, 0.1), "1gbit", "switch", 1),
        (switch_run(tmp_path / "g-sw2", bound() * 1.04, 0.3, 0.2, 0.1, threads=2), "1gbit", "switch", 2),
    ]
    if many:
        e += [
            (peer_run(tmp_path / "t-gloo", 0.1, 1.0, 0.8), "10gbit", "gloo_tso", None),
            (switch_run(tmp_path / "t-sw1", 0.09, 1.0, 0.5, 0.2), "10gbit", "switch", 1),
            (switch_run(tmp_path / "t-sw2", 0.065, 1.0, 0.5, 0.2, threads=2), "10gbit", "switch", 2),
            (switch_run(tmp_path / "a1", 0.4, 1.0, 0.5, 0.2, ranks=1), "unlimited", "switch_alone", 1),
            (switch_run(tmp_path / "a4", 0.125, 1.0, 0.5, 0.2, threads=4, ranks=1), "unlimited", "switch_alone", 4),
        ]
    return write_manifest(tmp_path, e)


def run_report(tmp_path, manifest, threads, cpus):
    out = {k: tmp_path / f"out.{k}" for k in ("json", "png", "md")}
    assert report.main(["--runs", str(manifest), "--stamp", "TEST", "--mib", str(MIB), "--repeats", str(REPEATS),
                        "--workers", "4", "--json", str(out["json"]), "--png", str(out["png"]),
                        "--table", str(out["md"]), "--worker-threads", threads, "--cpus", str(cpus)]) == 0
    return json.loads(out["json"].read_text()), out["md"].read_text(), out["png"]


def goal(res, key):
    return next(g for g in res["goals_38"] if g["key"] == key)


def test_cpu_is_split_into_workers_and_switchd_per_gib_and_every_run_has_one_schema(tmp_path):
    res, _, _ = run_report(tmp_path, fixture(tmp_path), "1,2,4", 2)
    gib = ELEMENTS * 4 / (1 << 30)
    by = {(r["link"], r["method"], r["threads"]): r for r in res["runs"]}
    sw = by[("unlimited", "switch", 1)]
    assert sw["time_s"] == pytest.approx(0.8)
    assert sw["cpu_s"] == pytest.approx(1.6)
    assert sw["workers_cpu_s"] == pytest.approx(0.8)
    assert sw["switchd_cpu_s"] == pytest.approx(0.3)
    assert sw["switchd_cpu_s_per_gib"] == pytest.approx(0.3 / gib)
    assert sw["threads_ran"] == 1, "a report without \"threads\" is one thread"
    assert by[("unlimited", "switch", 2)]["threads_ran"] == 2
    gloo = by[("unlimited", "gloo_tso", None)]
    assert gloo["switchd_cpu_s"] is None and gloo["workers_cpu_s"] == pytest.approx(1.0)
    assert all(list(r) == list(report.RUN_KEYS) for r in res["runs"])
    assert "T=2" in by[("unlimited", "switch", 2)]["label"]


def test_ratio_rows_per_thread_count_against_gloo(tmp_path):
    res, _, _ = run_report(tmp_path, fixture(tmp_path), "1,2,4", 2)
    rows = {(r["link"], r["threads"]): r for r in res["ratios"]}
    assert set(rows) == {("unlimited", 1), ("unlimited", 2), ("1gbit", 1), ("1gbit", 2)}
    u1 = rows[("unlimited", 1)]
    assert u1["switch_over_gloo_time"] == pytest.approx(0.8)
    assert u1["cpu_per_gib_switch_over_gloo"] == pytest.approx(0.8)
    assert u1["workers_cpu_per_gib_switch_over_gloo"] == pytest.approx(0.8)
    # gloo has no switchd: switchd's CPU is set against gloo's workers'.
    assert u1["switchd_cpu_per_gib_over_gloo_workers"] == pytest.approx(0.3)
    assert rows[("unlimited", 2)]["switch_over_gloo_time"] == pytest.approx(0.6)
    assert rows[("1gbit", 1)]["switch_over_line_rate"] == pytest.approx(1.06)
    assert res["headline"]["threads"] == 1
    assert res["headline"]["switch_over_openmpi_tso_unlimited"] == pytest.approx(0.8 / 1.2)
    assert res["worker_threads"] == {"asked": [1, 2, 4], "cpus": 2, "ran": [1, 2],
                                     "skipped": [{"threads": 4, "why": "more than the machine's 2 CPUs"}]}


def test_issue_38_goals_for_t1_and_the_best_t(tmp_path):
    res, table, png = run_report(tmp_path, fixture(tmp_path), "1,2,4", 2)
    w = goal(res, "workers_cpu_unlimited")
    assert w["t1"]["value"] == pytest.approx(0.8) and w["t1"]["met"] is False
    # T = 2 is fastest on unlimited links; its workers' CPU is 0.7 of gloo's.
    assert w["best"]["threads"] == 2 and w["best"]["value"] == pytest.approx(0.7) and w["best"]["met"] is True
    m = goal(res, "machine_cpu_unlimited")
    assert (m["t1"]["met"], m["best"]["met"]) == (True, False)  # 1.6 and 2.2 against gloo's 2.0
    t = goal(res, "time_unlimited")
    assert t["best"]["value"] == pytest.approx(0.6) and t["best"]["met"]
    g = goal(res, "time_1gbit")
    assert g["t1"]["value"] == pytest.approx(bound() * 1.06 / 0.0128)
    assert g["t1"]["met"] is False and g["best"]["met"] is True  # 0.700 and 0.687 against 0.69
    lr = goal(res, "line_rate_1gbit")
    assert (lr["t1"]["met"], lr["best"]["met"]) == (False, True)  # 1.06 and 1.04 against 1.05
    for key in ("alone_t4_over_t1", "time_10gbit"):
        assert goal(res, key)["measured"] is False and goal(res, key)["met"] is None
    assert table.count("needs a machine with >= 16 cores: not measured here (2 CPUs)") == 2
    assert "T = 4 skipped: more than the machine's 2 CPUs." in table
    assert "| 2-core VM, unlimited links | workers' CPU per GiB, switch / gloo | 0.800 | 0.700 (T=2, ran 2) " \
           "| <= 0.75 | NOT met | met |" in table
    assert png.stat().st_size > 0


def test_many_core_goals_from_the_10gbit_and_alone_runs(tmp_path):
    res, table, _ = run_report(tmp_path, fixture(tmp_path, many=True), "1,2,4", 16)
    alone = goal(res, "alone_t4_over_t1")
    assert alone["value"] == pytest.approx(3.2) and alone["met"] is True and alone["threads_ran"] == 4
    ten = goal(res, "time_10gbit")
    assert ten["threads"] == 2 and ten["value"] == pytest.approx(0.65) and ten["met"] is True
    assert "not measured here" not in table
    assert "| 3.20 (T=4, ran 4) | >= 3x | | met |" in table
    assert "| 0.65 (T=2, ran 2) | <= 0.70 | | met |" in table
    assert res["worker_threads"]["skipped"] == []
    # The one-worker runs are not ratio rows of their own.
    assert {r["link"] for r in res["ratios"]} == {"unlimited", "1gbit", "10gbit"}


def test_a_single_thread_count_keeps_the_labels_and_has_no_best_t_of_its_own(tmp_path):
    m = write_manifest(tmp_path, [
        (peer_run(tmp_path / "gloo", 1.0, 2.0, 1.0), "unlimited", "gloo_tso", None),
        (switch_run(tmp_path / "sw", 0.8, 1.6, 0.8, 0.3), "unlimited", "switch", 1),
    ])
    res, _, _ = run_report(tmp_path, m, "1", 2)
    assert res["runs"][1]["label"] == "switch f32 (udp-gso)"
    w = goal(res, "workers_cpu_unlimited")
    assert w["best"]["threads"] == 1 and w["best"]["value"] == w["t1"]["value"]
    assert goal(res, "time_1gbit")["t1"]["value"] is None and goal(res, "time_1gbit")["t1"]["met"] is None


@pytest.mark.parametrize("bad", ["0", "x", "1,,2", "", "65", "-1", "1.5"])
def test_worker_threads_refuses_what_is_not_a_thread_count(bad, capsys):
    with pytest.raises(argparse.ArgumentTypeError, match="each 1..64"):
        thread_counts(bad)
    with pytest.raises(SystemExit) as e:
        parse(SCENARIOS["efficiency"], ["--worker-threads", bad])
    assert e.value.code == 2
    assert "--worker-threads: must be worker thread counts" in capsys.readouterr().err


def test_worker_threads_parse_sorted_once_and_default_to_one():
    assert thread_counts("4,1,2,2") == [1, 2, 4]
    assert parse(SCENARIOS["efficiency"], []).worker_threads == [1]


def test_seq_lanes_cover_the_threads_and_t_above_the_cpus_is_skipped():
    assert [lanes_for(t) for t in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, 8]
    assert lanes_for(1, current=4) == 4 and lanes_for(2, current=1) == 2
    assert runnable_threads([1, 2, 4], 2) == ([1, 2], [4])
    assert runnable_threads([1, 2, 4], 16) == ([1, 2, 4], [])


# --- train --worker-threads ---------------------------------------------------------------

TRAIN_WARMUP, TRAIN_STEPS = 1, 4
STAT = "cpu  100 0 50 1000 0 0 10 0 0 0"


def train_config(run_dir, name, step_s, digest, cpu_s, switchd_cpu_s=None, threads=None):
    d = run_dir / name
    d.mkdir()
    for r in range(4):
        path = None
        if switchd_cpu_s is not None:
            path = {"mode": "switch", "fallback": True, "switch_collectives": 5, "host_collectives": 0,
                    "fallbacks": 0, "returns": 0}
            if threads is not None:
                path["threads"] = threads
        (d / f"rank{r}.json").write_text(json.dumps({
            "rank": r, "world": 4, "loss": 1.0, "digest": digest, "params": 1000,
            "step_times": [1.0] + [step_s * (1 + r / 100)] * TRAIN_STEPS, "path": path}))
        # GNU time: max RSS KiB, elapsed, user, system seconds.
        (d / f"rank{r}.time").write_text(f"1024 9.0 {cpu_s / 8} {cpu_s / 8}\n")
    for edge, t in (("before", 0.0), ("after", 10.0)):
        (d / f"{edge}.jsonl").write_text(json.dumps({"t": t, "stat": STAT, "loadavg": "0.5 0.4 0.3"}) + "\n")
    if switchd_cpu_s is not None:
        (d / "switchd-cpu-seconds").write_text(f"{switchd_cpu_s}\n")


def run_train(tmp_path, monkeypatch, run_dir, worker_threads, cpus=2):
    monkeypatch.setattr(train_report, "versions", lambda: {})  # no torch import
    out = tmp_path / "out.json"
    table = tmp_path / "out.md"
    monkeypatch.setattr(sys, "argv", [
        "bench_train_report.py", str(run_dir), "--json", str(out), "--table", str(table), "--stamp", "TEST",
        "--warmup", str(TRAIN_WARMUP), "--steps", str(TRAIN_STEPS), "--batch", "8", "--hidden", "10",
        "--layers", "2", "--seed", "0", "--links", "unlimited", "--comms", "gloo,switch",
        "--worker-threads", worker_threads, "--cpus", str(cpus)])
    rc = train_report.main()
    return rc, json.loads(out.read_text()), table.read_text()


def test_train_per_thread_count_step_ratio_and_cpu_per_step(tmp_path, monkeypatch):
    rd = tmp_path / "run"
    rd.mkdir()
    train_config(rd, "unlimited-gloo", 0.5, "g", 20.0)
    train_config(rd, "unlimited-switch", 0.4, "s", 15.0, switchd_cpu_s=2.5)
    train_config(rd, "unlimited-switch-t2", 0.3, "s", 16.0, switchd_cpu_s=3.0, threads=2)
    rc, res, table = run_train(tmp_path, monkeypatch, rd, "1,2,4")
    assert rc == 0
    per_t = res["ratios"]["unlimited"]["threads"]
    assert per_t["1"]["switch_over_gloo"] == pytest.approx(0.4 * 1.03 / (0.5 * 1.03))
    assert per_t["2"]["switch_over_gloo"] == pytest.approx(0.6)
    assert per_t["1"]["threads_ran"] is None, "no \"threads\" in aggswitch's stats: not claimed"
    assert per_t["2"]["threads_ran"] == 2
    steps = TRAIN_WARMUP + TRAIN_STEPS
    assert per_t["2"]["ranks_cpu_s_per_step"] == pytest.approx(4 * 16.0 / 4 / steps)
    assert per_t["2"]["switchd_cpu_s_per_step"] == pytest.approx(3.0 / steps)
    # The base T's figures stay what they were; the weights are the same at every T.
    assert res["ratios"]["unlimited"]["step"] == pytest.approx(0.8)
    assert res["checks"]["switch_runs_identical"] is True
    assert res["checks"]["same_weights_as_switch"] == {"unlimited switch T=2": True}
    assert res["setup"]["worker_threads"] == [1, 2] and res["setup"]["worker_threads_skipped"] == [4]
    assert "worker threads T = 4 skipped: more than the machine's 2 CPUs" in table
    assert "T=2 (ran 2) **0.60**" in table
    assert "**switch**, T=2 (ran 2)" in table


def test_train_a_switch_run_at_another_t_with_other_weights_fails_the_sanity_check(tmp_path, monkeypatch):
    rd = tmp_path / "run"
    rd.mkdir()
    train_config(rd, "unlimited-gloo", 0.5, "g", 20.0)
    train_config(rd, "unlimited-switch", 0.4, "s", 15.0, switchd_cpu_s=2.5)
    train_config(rd, "unlimited-switch-t2", 0.3, "DIFFERENT", 16.0, switchd_cpu_s=3.0, threads=2)
    rc, res, _ = run_train(tmp_path, monkeypatch, rd, "1,2")
    assert rc == 3
    assert res["checks"]["switch_runs_identical"] is False


def test_train_folders_and_thread_counts_per_configuration():
    assert config_dir("1gbit", "switch", 1) == "1gbit-switch"
    assert config_dir("1gbit", "switch", 2) == "1gbit-switch-t2"
    assert config_dir("1gbit", "gloo", None) == "1gbit-gloo"
    assert thread_counts_of("switch", [1, 2]) == [1, 2]
    assert thread_counts_of("switch-killed", [1, 2]) == [1]
    assert thread_counts_of("hosts", [1, 2]) == [None]
    assert train_report.config_dir("unlimited", "switch-nofallback", 4) == config_dir("unlimited", "switch-nofallback", 4)


@pytest.mark.parametrize("bad", ["0", "x", "2,0"])
def test_train_refuses_a_bad_worker_thread_count(bad, capsys):
    with pytest.raises(SystemExit):
        parse(SCENARIOS["train"], ["--worker-threads", bad])
    assert "--worker-threads: must be worker thread counts" in capsys.readouterr().err
    assert parse(SCENARIOS["train"], []).worker_threads == [1]


def test_efficiency_switch_threads_make_queues_and_dataplane_threads_and_no_build_needs_no_cargo():
    from scenarios import efficiency
    s = SCENARIOS["efficiency"]
    a = parse(s, [])
    assert a.switch_threads == 1 and a.no_build is False
    assert efficiency.switch_threads(1) == ([], [])
    assert efficiency.switch_threads(4) == (["--queues", 4],
                                            ["switch.queues=4", "switch.dataplane_threads=4"])
    a = parse(s, ["--switch-threads", "4", "--no-build", "--worker-threads", "1,2,4"])
    assert (a.switch_threads, a.no_build, a.worker_threads) == (4, True, [1, 2, 4])


@pytest.mark.parametrize("bad", ["0", "65", "x"])
def test_efficiency_refuses_a_bad_switch_thread_count(bad, capsys):
    with pytest.raises(SystemExit) as e:
        parse(SCENARIOS["efficiency"], ["--switch-threads", bad])
    assert e.value.code == 2
    assert "--switch-threads" in capsys.readouterr().err


def test_efficiency_without_openmpi_and_with_switch_threads_reports_them(tmp_path):
    """A lent machine without mpicc: no OpenMPI runs; the report still
    gives every gloo ratio, OpenMPI's as '-', and says switchd's threads."""
    m = write_manifest(tmp_path, [
        (peer_run(tmp_path / "gloo", 1.0, 2.0, 1.0), "unlimited", "gloo_tso", None),
        (switch_run(tmp_path / "sw", 0.8, 1.6, 0.8, 0.3), "unlimited", "switch", 1),
    ])
    out = {k: tmp_path / f"out.{k}" for k in ("json", "png", "md")}
    assert report.main(["--runs", str(m), "--stamp", "TEST", "--mib", str(MIB), "--repeats", str(REPEATS),
                        "--workers", "4", "--json", str(out["json"]), "--png", str(out["png"]),
                        "--table", str(out["md"]), "--worker-threads", "1", "--cpus", "16",
                        "--switch-threads", "4"]) == 0
    res, table = json.loads(out["json"].read_text()), out["md"].read_text()
    assert res["setup"]["switch_threads"] == 4
    assert "switchd: 4 dataplane thread(s)." in table
    row = res["ratios"][0]
    assert row["switch_over_gloo_time"] == pytest.approx(0.8)
    assert row.get("switch_over_openmpi_tso_time") is None


def test_efficiency_moves_each_sides_peer_receive_to_its_owner_by_the_profile(tmp_path):
    """With --profile-shares the report estimates each side's own CPU as on
    separate machines: the workers' samples that are switchd's receive go
    to switchd, switchd's that are the workers' receive to the workers."""
    m = write_manifest(tmp_path, [
        (peer_run(tmp_path / "gloo", 1.0, 2.0, 1.0), "unlimited", "gloo_tso", None),
        (switch_run(tmp_path / "sw", 0.8, 1.6, 0.8, 0.3), "unlimited", "switch", 1),
    ])
    shares = tmp_path / "profile-paths.json"
    # Workers 60 % of the samples, 15 of them switchd's receive; switchd 40 %, 10 the workers' receive.
    shares.write_text(json.dumps({"samples": 1000, "worker": 0.6, "switchd": 0.4,
                                  "worker_peer": 0.15, "switchd_peer": 0.1}))
    out = {k: tmp_path / f"out.{k}" for k in ("json", "png", "md")}
    args = ["--runs", str(m), "--stamp", "TEST", "--mib", str(MIB), "--repeats", str(REPEATS), "--workers", "4",
            "--json", str(out["json"]), "--png", str(out["png"]), "--table", str(out["md"]),
            "--worker-threads", "1", "--cpus", "2"]
    assert report.main(args + ["--profile-shares", str(shares)]) == 0
    res, table = json.loads(out["json"].read_text()), out["md"].read_text()
    at, row = res["attribution"], res["ratios"][0]
    assert at["workers_factor"] == pytest.approx((0.6 - 0.15 + 0.1) / 0.6)
    assert at["switchd_factor"] == pytest.approx((0.4 - 0.1 + 0.15) / 0.4)
    assert at["workers_cpu_per_gib_switch_over_gloo"] == pytest.approx(
        row["workers_cpu_per_gib_switch_over_gloo"] * at["workers_factor"])
    assert at["switchd_cpu_per_gib_over_gloo_workers"] == pytest.approx(
        row["switchd_cpu_per_gib_over_gloo_workers"] * at["switchd_factor"])
    assert "25.0 % are switchd's receive of their DATA" in table
    # Without a profile: the key is there, null, and the table says nothing.
    assert report.main(args) == 0
    assert json.loads(out["json"].read_text())["attribution"] is None
    assert "separate machines" not in out["md"].read_text()
