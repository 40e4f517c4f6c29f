"""The benchmark reports' arithmetic (bench/harness/bench_rates_report.py,
bench_transports_report.py, bench_per_packet_report.py, bench_report.py,
bench_train_report.py),
on small run folders written here: the shell scripts only leave raw
readings behind, so these numbers are the published ones."""

import importlib.util
import json
import os
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "harness")
sys.path.insert(0, SCRIPTS)
import bench_per_packet_report  # noqa: E402
import bench_rates_report  # noqa: E402
import bench_report  # noqa: E402
import bench_train_report  # noqa: E402
import bench_transports_report  # noqa: E402
import benchkit  # noqa: E402

HZ = benchkit.CLK_TCK


def proc_stat(jiffies):
    """A /proc/PID/stat line with utime + stime = jiffies."""
    return f"77 (switchd) S 1 2 3 4 5 6 7 8 9 10 {jiffies - 1} 1 0 0 20 0 1 0\n"


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def dump(path, obj):
    write(path, json.dumps(obj) + "\n")


# --- packet rates ---------------------------------------------------------------------


def rate_repeat(d, tag, k, stats_before, stats_after, cpu_jiffies, gen):
    dump(d / f"{tag}-stats-before{k}.json", stats_before)
    dump(d / f"{tag}-stats-after{k}.json", stats_after)
    write(d / f"{tag}-switchd-before{k}.stat", proc_stat(1000))
    write(d / f"{tag}-switchd-after{k}.stat", proc_stat(1000 + cpu_jiffies))
    dump(d / f"{tag}-gen{k}.json", gen)


def test_open_rate_is_counter_delta_over_generator_seconds_and_median_of_repeats(tmp_path):
    # Three repeats of 2 s: 400, 1000 and 700 frames echoed -> 200, 500, 350 pps.
    for k, (echoed, cpu) in enumerate([(400, HZ), (1000, 2 * HZ), (700, 0)], 1):
        rate_repeat(tmp_path, "echo", k, {"echoed": 50}, {"echoed": 50 + echoed}, cpu,
                    {"seconds": 2.0, "frame_bytes": 1512, "sent_per_s": 600.0 + k, "frames_refused": k})
    m = bench_rates_report.open_measurement(str(tmp_path), "echo", 3)
    assert m["pps_runs"] == [200.0, 500.0, 350.0]
    assert m["pps"] == 350.0
    assert m["pps_best"] == 500.0
    assert m["generator_sent_pps"] == 602.0
    assert m["generator_refused"] == 6
    assert m["counter"] == ".echoed"
    assert m["switchd_cpu_s"] == pytest.approx([1.0, 2.0, 0.0])
    # The third run's switchd used no CPU: its per-CPU rate is unknown, so
    # is the median of them.
    assert m["pps_per_switchd_cpu_s"] is None
    run1 = json.loads((tmp_path / "echo-1.json").read_text())
    assert run1["counter_delta"] == 400 and run1["pps_per_switchd_cpu_s"] == pytest.approx(400.0)


def test_xdp_drop_reads_port_zeros_counter_and_a_missing_counter_is_named(tmp_path):
    rate_repeat(tmp_path, "xdp_drop", 1, {"ports": [{"xdp_dropped": 10}]}, {"ports": [{"xdp_dropped": 310}]},
                HZ, {"seconds": 3.0, "frame_bytes": 1512})
    assert bench_rates_report.open_measurement(str(tmp_path), "xdp_drop", 1)["pps"] == 100.0
    dump(tmp_path / "xdp_drop-stats-after1.json", {"ports": []})
    with pytest.raises(bench_rates_report.RatesError, match="no counter ports.0.xdp_dropped"):
        bench_rates_report.open_measurement(str(tmp_path), "xdp_drop", 1)


def test_aggregation_medians_even_repeats_and_sums_counts(tmp_path):
    for k, data in enumerate([100.0, 300.0], 1):
        rate_repeat(tmp_path, "agg-n4-t2", k, {"rx_frames": 0}, {"rx_frames": 1000 * k}, HZ // 2,
                    {"seconds": 10.0, "ranks": 4, "elems_per_chunk": 362, "window": 256, "data_per_s": data,
                     "chunks_per_s": data / 4, "seq_resends": k, "verify_checked": 5, "verify_failed": 0})
    m = bench_rates_report.agg_measurement(str(tmp_path), 4, 2, 2)
    assert m["data_pps"] == 200.0  # the mean of the middle two
    assert m["data_pps_best"] == 300.0
    assert m["switch_rx_pps"] == 150.0  # 100 and 200 frames/s
    assert m["pps_per_switchd_cpu_s"] == pytest.approx(3000.0)  # 2000 and 4000 per 0.5 s
    assert m["seq_resends"] == 3 and m["verify_checked"] == 10 and m["verify_failed"] == 0
    assert m["threads"] == 2 and m["ranks"] == 4


def test_rate_headline_ratios_and_table():
    echo = {"frame_bytes": 1512, "pps": 1000.0, "pps_best": 1250.0, "pps_per_switchd_cpu_s": 2000.0}
    agg = [{"ranks": r, "threads": t, "data_pps": p, "data_pps_best": p, "pps_per_switchd_cpu_s": p,
            "chunks_per_s": p / r, "contributed_elems_per_s": p * 362.0, "seq_resends": 0}
           for r, t, p in [(2, 1, 900.0), (4, 1, 800.0), (2, 2, 1350.0), (4, 2, 400.0), (4, 4, 1600.0)]]
    h = bench_rates_report.headline({"pps": 4000.0}, echo, agg)
    assert h["agg_over_echo_pps"] == {"2": 0.9, "4": 0.8}
    assert h["agg_over_echo_pps_4_ranks"] == 0.8
    assert h["agg_over_echo_pps_best"] == {"2": 0.72, "4": 0.64}
    assert h["echo_over_xdp_drop"] == 0.25
    assert h["two_over_one_thread"] == {"2": 1.5, "4": 0.5}
    assert h["over_one_thread"] == {"2": {"2": 1.5, "4": 0.5}, "4": {"4": 2.0}}
    assert bench_rates_report.headline(None, echo, agg)["echo_over_xdp_drop"] is None
    r = {"xdp_drop": None, "echo": echo, "echo_64": {**echo, "frame_bytes": 64}, "aggregate": agg,
         "headline": h, "setup": {"loadavg_1min": {"start": 0.5, "end": 0.7}, "nproc": 2}}
    t = bench_rates_report.table(r).splitlines()
    assert t[2] == "| XDP_DROP | – | – | not measured |  |  |  |  |"
    assert t[5] == "| aggregate, 2 ranks | 1512 | 1 | 900 (900) | 900 | 450 | 0.326 | 0 |"
    assert "4 threads / 1 thread: 4 ranks 2.00" in t


# --- transports -------------------------------------------------------------------------


def edge(path, wall, busy, idle, switchd, children):
    write(path, f"wall {wall}\nstat cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\n"
                f"switchd {proc_stat(switchd)}children {children}\n")


def test_transport_run_takes_slowest_rank_and_the_windows_cpu(tmp_path):
    for r, (secs, tx) in enumerate([(1.5, 10), (2.5, 20)]):
        dump(tmp_path / f"mmsg-0-rank{r}.json",
             {"seconds": secs, "transport": "mmsg",
              "stats": {"tx_coalesced": tx, "rx_coalesced": 1, "chunks_sent": 100, "chunks_resent": r}})
    edge(tmp_path / "mmsg-0.before", 100.0, 1000, 5000, 300, "0m1.500s 0m0.250s")
    edge(tmp_path / "mmsg-0.after", 103.25, 1000 + 3 * HZ, 5000 + HZ, 300 + HZ // 2, "1m2.000s 0m1.750s")
    run = bench_transports_report.one_run(str(tmp_path), "mmsg", 0, 2)
    assert run["seconds"] == 2.5
    assert run["ran"] == ["mmsg"]
    assert run["cpu_s"] == pytest.approx(3.0)
    assert run["wall_s"] == 3.25
    assert run["workers_cpu_s"] == pytest.approx(62.0)  # 63.75 - 1.75
    assert run["switchd_cpu_s"] == pytest.approx(0.5)
    assert (run["tx_coalesced"], run["chunks_sent"], run["resent"]) == (30, 200, 1)


def test_transport_run_names_a_rank_without_a_report(tmp_path):
    dump(tmp_path / "udp-gso-1-rank0.json", {"seconds": 1.0})
    write(tmp_path / "udp-gso-1-rank1.json", "")
    with pytest.raises(bench_transports_report.TransportsError, match="rank 1 left no JSON report"):
        bench_transports_report.one_run(str(tmp_path), "udp-gso", 1, 2)


def test_transport_summary_is_the_median_per_transport():
    runs = [{"transport": t, "seconds": s, "cpu_s": s * 2, "workers_cpu_s": 1.0, "switchd_cpu_s": 0.5}
            for t, s in [("udp-gso", 4.0), ("mmsg", 1.0), ("mmsg", 3.0), ("udp-gso", 2.0), ("udp-gso", 9.0)]]
    s = bench_transports_report.summary(runs)
    assert [x["transport"] for x in s] == ["mmsg", "udp-gso"]
    assert s[0]["median_seconds"] == 2.0 and s[0]["median_cpu_s"] == 4.0
    assert s[1]["median_seconds"] == 4.0 and s[1]["runs"] == 3


def test_times_lines_parse_and_garbage_is_refused():
    assert bench_transports_report.times_seconds("2m0.500s 0m1.250s") == pytest.approx(121.75)
    with pytest.raises(bench_transports_report.TransportsError):
        bench_transports_report.times_seconds("0.5 1.2")


# --- per packet --------------------------------------------------------------------------


def test_per_packet_ratios_from_criterion_medians(tmp_path):
    for e in bench_per_packet_report.SIZES:
        for kind, ns in (("engine", 3.0 * e), ("copy", 2.0 * e), ("sum_only", 2.5 * e)):
            d = tmp_path / kind / str(e) / "new"
            d.mkdir(parents=True)
            dump(d / "estimates.json", {"median": {"point_estimate": ns}, "mean": {"point_estimate": 0}})
    r = bench_per_packet_report.result(str(tmp_path), 3, 1)
    s362 = next(s for s in r["sizes"] if s["elems"] == 362)
    assert s362["engine_over_copy"] == 1.5 and s362["sum_only_over_copy"] == 1.25
    assert s362["protocol_ns"] == pytest.approx(0.5 * 362)
    assert bench_per_packet_report.table(r).splitlines()[4] == \
        "| 362 | 1086.0 | 724.0 | 905.0 | 1.50 | 1.25 | 181.0 |"
    (tmp_path / "copy" / "870" / "new" / "estimates.json").unlink()
    with pytest.raises(bench_per_packet_report.PerPacketError, match="copy/870"):
        bench_per_packet_report.result(str(tmp_path), 3, 1)


# --- the allreduce scenario's phases ---------------------------------------------------------------------


def snapshot(path, busy, idle, tbf_bytes, fresh_stat=None):
    """lib.sh's snapshot: a stat line, then the shapers' tc -s -j lines."""
    lines = [{"t": 1.0, "stat": f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0", "loadavg": "0.1 0.2 0.3"}]
    for rank in range(2):
        lines.append({"kind": "worker_egress", "rank": rank, "tc": [
            {"kind": "tbf", "handle": "8001:", "root": True, "bytes": tbf_bytes, "packets": 10, "drops": 1,
             "overlimits": 2},
            # A child qdisc and an unshaped root count the same frames again.
            {"kind": "fq_codel", "handle": "0:", "parent": "8001:", "bytes": 7 * tbf_bytes}]})
        lines.append({"kind": "switch_port_egress", "rank": rank, "tc": [
            {"kind": "noqueue", "handle": "0:", "root": True, "bytes": 3 * tbf_bytes}]})
    if fresh_stat is not None:
        lines.append({"t": 2.0, "stat": f"cpu  {fresh_stat[0]} 0 0 {fresh_stat[1]} 0 0 0 0 0 0"})
    write(path, "".join(json.dumps(x) + "\n" for x in lines))


def test_peer_phase_adds_shaper_deltas_and_busy_share(tmp_path):
    # The before snapshot's fresh stat line (after the shaper reads) starts the phase.
    snapshot(tmp_path / "snap-gloo-before.jsonl", 100, 100, 1000, fresh_stat=(200, 200))
    snapshot(tmp_path / "snap-gloo-after.jsonl", 500, 300, 6000)
    write(tmp_path / "gloo-rank0.out", 'warming up\n{"mean_s": 1.0, "verified": true}\ndone\n')
    r = bench_report.peer_result(str(tmp_path), "gloo", str(tmp_path / "gloo-rank0.out"))
    assert r["mean_s"] == 1.0
    assert r["cpu_busy_fraction"] == 0.75  # busy +300 of +400
    assert r["shapers"]["worker_egress"] == {"bytes": 10000, "packets": 0, "drops": 0, "overlimits": 0}
    assert r["shapers"]["worker_ingress_ifb"] == {"bytes": 0, "packets": 0, "drops": 0, "overlimits": 0}
    assert r["shapers"]["switch_port_egress"]["bytes"] == 0
    write(tmp_path / "gloo-rank0.out", '{"mean_s": 1.0, "verified": false}\n')
    with pytest.raises(bench_report.ReportError, match="wrong sum"):
        bench_report.peer_result(str(tmp_path), "gloo", str(tmp_path / "gloo-rank0.out"))


def test_switch_phase_takes_the_slowest_rank_of_each_run(tmp_path):
    snapshot(tmp_path / "snap-switch-before.jsonl", 0, 0, 0)
    snapshot(tmp_path / "snap-switch-after.jsonl", 10, 10, 0)
    seconds = {"multi": [2.0, 3.0], "single0": [1.0, 1.25], "single1": [0.75, 0.5], "single2": [2.0, 0.25]}
    for tag, ss in seconds.items():
        for r, s in enumerate(ss):
            dump(tmp_path / f"{tag}-rank{r}.json",
                 {"rank": r, "seconds": s, "elems_per_chunk": 362, "stats": {"chunks_resent": r + 1}})
    raw = bench_report.switch_raw(str(tmp_path), 3, 2)
    assert raw["multi_run_slowest_rank_s"] == 3.0
    assert raw["single_runs_s"] == [1.25, 0.75, 2.0]
    assert raw["cpu_busy_fraction"] == 0.5
    assert raw["switchd_stats"] is None
    st = bench_report.switch_stats(raw, 3, 1 << 20)
    assert st["mean_s"] == 1.0 and st["median_s"] == 1.25 and st["best_s"] == 0.75
    assert st["chunks_resent_multi_run"] == 3
    assert st["gbit_per_s_slowest_rank"] == pytest.approx((1 << 20) * 4 * 8 * 3 / 3.0 / 1e9)
    (tmp_path / "single1-rank1.json").unlink()
    with pytest.raises(bench_report.ReportError, match="rank 1 of switch run 'single1'"):
        bench_report.switch_raw(str(tmp_path), 3, 2)


def test_iperf_rate_and_a_failed_iperf(tmp_path):
    dump(tmp_path / "ok.json", {"end": {"sum_received": {"bits_per_second": 2.5e9}}})
    dump(tmp_path / "failed.json", {"error": "unable to connect"})
    assert bench_report.iperf_gbps(str(tmp_path / "ok.json")) == 2.5
    assert bench_report.iperf_gbps(str(tmp_path / "failed.json")) is None


# --- DDP training (the train scenario) ---------------------------------------------------------


KILLED_DEFAULT = {"kill_s": 1000.25, "fallback_seen_s": 1002.75, "stall_timeout_s": 2, "kill_after_step": 10,
                  "step_seen": 10, "poll_interval_s": 0.05,
                  "fallback_line": "run on the hosts over the process group"}


def killed_json(d, link, **changes):
    """(Re)write LINK-switch-killed/killed.json: KILLED_DEFAULT with CHANGES."""
    dump(d / f"{link}-switch-killed" / "killed.json", {**KILLED_DEFAULT, **changes})


def train_config(d, link, comm, step_s, loss=0.5, digest="d0", path="default", warmup=1):
    """One LINK-COMM folder as the train scenario leaves it: 4 ranks' train_ddp.py
    JSON (ranks 1..3 take step_s, rank 0 half of it; one warm-up step of
    9 s), GNU time lines, the snapshots and, for switchd's runs, its CPU;
    for switch-killed, killed.json (KILLED_DEFAULT: on the host path 2.5 s
    after the kill)."""
    out = d / f"{link}-{comm}"
    out.mkdir()
    if path == "default" and comm == "switch-killed":  # killed after 10 steps, the rest on the hosts
        path = {"mode": "switch", "fallback": True, "path": "hosts", "switch_collectives": 30,
                "host_collectives": 69, "fallbacks": 1, "returns": 0, "failed_returns": 0,
                "last_fallback_reason": "this rank's collective failed on the switch (StalledError: ...)"}
    elif path == "default":  # what the state reports when the run went as configured
        path = None if comm == "gloo" else {
            "mode": "hosts" if comm == "hosts" else "switch", "fallback": comm != "switch-nofallback",
            "path": "hosts" if comm == "hosts" else "switch",
            "switch_collectives": 0 if comm == "hosts" else 99, "host_collectives": 99 if comm == "hosts" else 0,
            "fallbacks": 0, "returns": 0, "failed_returns": 0, "last_fallback_reason": None}
    for r in range(4):
        s = step_s / 2 if r == 0 else step_s
        rank = {"rank": r, "world": 4, "params": 1000, "loss": loss, "digest": digest,
                "step_times": [9.0] * warmup + [s, s * 1.25, s * 0.75]}
        if path is not None:
            rank["path"] = path
        dump(out / f"rank{r}.json", rank)
        write(out / f"rank{r}.time", "1024 10.0 5.0 1.0\n")
    snapshot(out / "before.jsonl", 0, 0, 0)
    snapshot(out / "after.jsonl", 30, 10, 0)
    if comm in ("switch", "switch-nofallback", "switch-killed"):
        write(out / "switchd-cpu-seconds", "2.5\n")
    if comm == "switch-killed":
        killed_json(d, link)


def run_train_report(tmp_path, monkeypatch, links, comms=None, extra=()):
    monkeypatch.setattr(bench_train_report, "versions", lambda: {})  # no torch import
    argv = ["bench_train_report.py", str(tmp_path), "--json", str(tmp_path / "r.json"),
            "--table", str(tmp_path / "t.md"), "--png", str(tmp_path / "p.png"), "--stamp", "S",
            "--warmup", "1", "--steps", "3", "--batch", "32", "--hidden", "10", "--layers", "2",
            "--seed", "0", "--mtu", "9000", "--links", links, *extra]
    monkeypatch.setattr(sys, "argv", argv + (["--comms", comms] if comms else []))
    rc = bench_train_report.main()
    return rc, json.loads((tmp_path / "r.json").read_text()), (tmp_path / "t.md").read_text()


ALL_COMMS = "gloo,switch,switch-nofallback,hosts"


def test_train_report_default_comms_keep_the_switch_over_gloo_report(tmp_path, monkeypatch):
    for link, gloo_s, switch_s in (("unlimited", 1.0, 1.5), ("1gbit", 2.0, 1.25)):
        train_config(tmp_path, link, "gloo", gloo_s, loss=0.5, digest="g")
        train_config(tmp_path, link, "switch", switch_s, loss=0.501, digest="s")
    rc, res, table = run_train_report(tmp_path, monkeypatch, "unlimited,1gbit")
    assert rc == 0
    assert res["setup"]["comms"] == ["gloo", "switch"]
    assert [(c["link"], c["comm"]) for c in res["configs"]] == [
        ("unlimited", "gloo"), ("unlimited", "switch"), ("1gbit", "gloo"), ("1gbit", "switch")]
    assert res["configs"][3]["step_s"] == 1.25 and res["configs"][3]["rank0_median_s"] == 0.625
    assert res["ratios"]["1gbit"]["step"] == 0.625
    assert res["ratios"]["unlimited"]["samples_per_s_gain"] == pytest.approx(1 / 1.5)
    assert res["headline"] == {"switch_over_gloo_unlimited": 1.5, "switch_over_gloo_1gbit": 0.625,
                               "switch_over_gloo_1gbit_goal": 0.75, "switch_over_gloo_1gbit_goal_met": True,
                               "sanity_ok": True}
    assert res["checks"]["loss"]["1gbit"]["switch"] == 0.501 and res["checks"]["loss"]["1gbit"]["ok"]
    assert res["checks"]["switch_runs_identical"] and res["checks"]["same_weights_as_switch"] == {}
    assert "| 1 Gbit/s links | **switch** | **1.250** |" in table
    assert "| 1 Gbit/s links | gloo (DDP default) | **2.000** |" in table
    assert "switch / gloo step time, 1 Gbit/s links: **0.62**" in table
    assert "hosts (" not in table and "agreement" not in table and "the switch's weights" not in table
    assert "ran as configured (" in table and "1gbit switch yes" in table


def test_train_report_hosts_and_agreement_ratios_and_their_digest_check(tmp_path, monkeypatch):
    steps = {"unlimited": {"gloo": 1.0, "switch": 1.5, "switch-nofallback": 1.5, "hosts": 1.25},
             "1gbit": {"gloo": 2.0, "switch": 1.28125, "switch-nofallback": 1.25, "hosts": 2.0625}}
    for link, by_comm in steps.items():
        for comm, s in by_comm.items():
            train_config(tmp_path, link, comm, s, loss=0.5 if comm == "gloo" else 0.5005,
                         digest="g" if comm == "gloo" else "s")
    rc, res, table = run_train_report(tmp_path, monkeypatch, "unlimited,1gbit", ALL_COMMS)
    assert rc == 0
    r = res["ratios"]
    assert r["1gbit"]["step"] == 0.640625  # switch / gloo as before
    assert r["1gbit"]["hosts_over_gloo"] == 1.03125
    assert r["1gbit"]["agreement_cost"] == 1.025
    assert r["unlimited"]["hosts_over_gloo"] == 1.25 and r["unlimited"]["agreement_cost"] == 1.0
    # The slowest rank's time of each step: the same ratios here.
    assert r["1gbit"]["agreement_cost_per_step_max_median"] == 1.025
    h = res["headline"]
    assert h["hosts_over_gloo_1gbit"] == 1.03125 and h["hosts_over_gloo_unlimited"] == 1.25
    assert h["hosts_over_gloo_1gbit_goal"] == 1.05 and h["hosts_over_gloo_1gbit_goal_met"] is True
    assert h["agreement_cost_1gbit"] == 1.025 and h["agreement_cost_unlimited"] == 1.0
    assert h["agreement_cost_goal"] == 1.02
    assert h["agreement_cost_unlimited_goal_met"] is True and h["agreement_cost_1gbit_goal_met"] is False
    assert h["agreement_cost_goal_met"] is False
    assert h["switch_over_gloo_1gbit_goal_met"] is True and h["sanity_ok"] is True
    ch = res["checks"]
    assert ch["same_weights_as_switch"] == {"unlimited switch-nofallback": True, "unlimited hosts": True,
                                            "1gbit switch-nofallback": True, "1gbit hosts": True}
    assert all(ch["ran_as_configured"].values()) and len(ch["ran_as_configured"]) == 6
    assert "| 1 Gbit/s links | hosts (host path over gloo) | **2.062** |" in table
    # switchd's CPU for both switch configurations, none for hosts.
    assert "| 1 Gbit/s links | switch, fallback off | **1.250** | 1.094–1.406 | 0.625 | 102.4 | 0.5005 | 1 | 75 % | 24 / 2.5 |" in table
    assert ("hosts / gloo step time (host path against gloo's all-reduce), 1 Gbit/s links: **1.031** "
            "(medians of per-step slowest 1.031); goal <= 1.05: met") in table
    assert ("agreement cost, switch / switch-nofallback step time, 1 Gbit/s links: **1.025** "
            "(medians of per-step slowest 1.025); goal <= 1.02: NOT met") in table
    if _has_matplotlib():
        assert (tmp_path / "p.png").stat().st_size > 0

    # A hosts run that ends with other weights than the switch's fails the
    # sanity check (exit status 3), though its loss is as close to gloo's.
    for rank in range(4):
        f = tmp_path / "1gbit-hosts" / f"rank{rank}.json"
        dump(f, {**json.loads(f.read_text()), "digest": "other"})
    rc, res, table = run_train_report(tmp_path, monkeypatch, "unlimited,1gbit", ALL_COMMS)
    assert rc == 3
    assert res["checks"]["same_weights_as_switch"]["1gbit hosts"] is False
    assert res["checks"]["same_weights_as_switch"]["unlimited hosts"] is True
    assert res["checks"]["same_weights_as_switch_ok"] is False
    assert res["checks"]["digests_equal_across_ranks"] and res["checks"]["loss"]["1gbit"]["ok"]
    assert res["checks"]["ok"] is False and res["headline"]["sanity_ok"] is False
    assert "1gbit hosts NO" in table


def test_train_report_a_switch_run_that_fell_back_is_not_measuring_the_switch(tmp_path, monkeypatch):
    fell_back = {"mode": "switch", "fallback": True, "path": "hosts", "switch_collectives": 3,
                 "host_collectives": 96, "fallbacks": 1, "returns": 0, "failed_returns": 0,
                 "last_fallback_reason": "rank 2 stalled"}
    train_config(tmp_path, "1gbit", "switch", 1.0, path=fell_back)
    train_config(tmp_path, "1gbit", "switch-nofallback", 1.0)
    # An older train_ddp.py, without path counters: nothing to check.
    train_config(tmp_path, "1gbit", "hosts", 1.0, path=None)
    rc, res, _ = run_train_report(tmp_path, monkeypatch, "1gbit", "switch,switch-nofallback,hosts")
    assert rc == 3
    assert res["checks"]["ran_as_configured"] == {"1gbit switch": False, "1gbit switch-nofallback": True,
                                                  "1gbit hosts": None}
    assert res["checks"]["loss"] == {} and "switch_over_gloo_1gbit" not in res["headline"]
    assert res["headline"]["agreement_cost_1gbit"] == 1.0
    # AGGSWITCH_FALLBACK that did not take: the "nofallback" run voted.
    train_config(tmp_path, "1gbit", "gloo", 1.0)
    rc, res, _ = run_train_report(tmp_path, monkeypatch, "1gbit", "gloo,switch-nofallback")
    assert rc == 0  # with the fallback off, as configured
    nf = tmp_path / "1gbit-switch-nofallback" / "rank3.json"
    dump(nf, {**json.loads(nf.read_text()), "path": {**json.loads(nf.read_text())["path"], "fallback": True}})
    rc, res, table = run_train_report(tmp_path, monkeypatch, "1gbit", "gloo,switch-nofallback")
    assert rc == 3 and res["checks"]["ran_as_configured"] == {"1gbit switch-nofallback": False}
    # Without a switch run the loss is compared with the first run of the switch's arithmetic.
    assert res["checks"]["loss"]["1gbit"]["compared"] == "switch-nofallback"
    assert "loss, 1 Gbit/s links: switch-nofallback 0.5000, gloo 0.5000" in table


def test_train_report_switch_killed_kill_to_host_path_and_its_goal(tmp_path, monkeypatch):
    for link, gloo_s, switch_s in (("unlimited", 1.0, 1.5), ("1gbit", 2.0, 1.25)):
        train_config(tmp_path, link, "gloo", gloo_s, loss=0.5, digest="g")
        train_config(tmp_path, link, "switch", switch_s, loss=0.5005, digest="s")
        # Its step times (a stall, then the host path) are compared with nothing.
        train_config(tmp_path, link, "switch-killed", 7.0, loss=0.5005, digest="s")
    killed_json(tmp_path, "unlimited", kill_s=500.0, fallback_seen_s=502.125)
    comms = "gloo,switch,switch-killed"
    rc, res, table = run_train_report(tmp_path, monkeypatch, "unlimited,1gbit", comms, ["--stall-timeout", "2"])
    assert rc == 0
    assert res["setup"]["stall_timeout_s"] == 2.0 and "switch-killed" in res["setup"]["comm"]
    r = res["ratios"]
    assert r["1gbit"] == {**r["1gbit"], "step": 0.625, "kill_to_host_path_s": 2.5,
                          "kill_to_host_path_goal_s": 3.0, "kill_to_host_path_goal_met": True}
    assert r["unlimited"]["kill_to_host_path_s"] == 2.125
    # No ratio of step times has the switch-killed run's.
    assert not {"hosts_over_gloo", "agreement_cost"} & set(r["1gbit"])
    killed = next(c for c in res["configs"] if c["comm"] == "switch-killed" and c["link"] == "1gbit")
    assert killed["step_s"] == 7.0 and killed["killed"]["kill_to_host_path_s"] == 2.5
    assert killed["switchd_cpu_s"] == 2.5
    h = res["headline"]
    assert h == {"switch_over_gloo_unlimited": 1.5, "switch_over_gloo_1gbit": 0.625,
                 "switch_over_gloo_1gbit_goal": 0.75, "switch_over_gloo_1gbit_goal_met": True,
                 "kill_to_host_path_s_unlimited": 2.125, "kill_to_host_path_s_1gbit": 2.5,
                 "kill_to_host_path_goal_s": 3.0, "kill_to_host_path_goal_met": True, "sanity_ok": True}
    ch = res["checks"]
    assert ch["same_weights_as_switch"] == {"unlimited switch-killed": True, "1gbit switch-killed": True}
    assert ch["ran_as_configured"]["1gbit switch-killed"] is True and ch["ok"]
    assert ("switch killed mid-run, 1 Gbit/s links: from switchd's kill (SIGKILL, after rank 0's step 10) to "
            "rank 0's first collective done on the host path **2.50 s** (rank 0's log read every 50 ms); "
            "goal <= stall timeout 2 s + 1 s = 3 s: met") in table
    assert "| 1 Gbit/s links | switch, switchd killed mid-run | **7.000** |" in table
    # switchd's CPU up to the kill.
    assert table.split("switchd killed mid-run")[1].splitlines()[0].endswith("| 24 / 2.5 |")
    assert "1gbit switch-killed yes" in table
    if _has_matplotlib():
        assert (tmp_path / "p.png").stat().st_size > 0

    # Later than the stall timeout + 1 s on one link: the goal is not met,
    # which is a measurement, not a failed sanity check.
    killed_json(tmp_path, "1gbit", fallback_seen_s=1003.5)
    rc, res, table = run_train_report(tmp_path, monkeypatch, "unlimited,1gbit", comms, ["--stall-timeout", "2"])
    assert rc == 0 and res["checks"]["ok"]
    assert res["headline"]["kill_to_host_path_s_1gbit"] == 3.25
    assert res["headline"]["kill_to_host_path_goal_met"] is False
    assert res["ratios"]["unlimited"]["kill_to_host_path_goal_met"] is True
    assert "**3.25 s**" in table and "= 3 s: NOT met" in table
    # The goal follows the stall timeout the ranks ran with (killed.json).
    killed_json(tmp_path, "1gbit", fallback_seen_s=1003.5, stall_timeout_s=5)
    rc, res, table = run_train_report(tmp_path, monkeypatch, "unlimited,1gbit", comms, ["--stall-timeout", "5"])
    assert res["ratios"]["1gbit"]["kill_to_host_path_goal_s"] == 6.0
    assert res["headline"]["kill_to_host_path_goal_s"] == 6.0
    # Rank 0 never logged the fallback: no time, the goal not met.
    killed_json(tmp_path, "1gbit", fallback_seen_s=None)
    rc, res, table = run_train_report(tmp_path, monkeypatch, "unlimited,1gbit", comms)
    assert res["headline"]["kill_to_host_path_s_1gbit"] is None
    assert res["headline"]["kill_to_host_path_goal_met"] is False
    assert "rank 0 NEVER logged that it runs on the hosts" in table
    # A switch-killed folder without killed.json is no run of it.
    (tmp_path / "1gbit-switch-killed" / "killed.json").unlink()
    with pytest.raises(SystemExit, match="killed.json"):
        run_train_report(tmp_path, monkeypatch, "unlimited,1gbit", comms)


def test_train_report_switch_killed_must_end_with_the_switchs_weights_having_fallen_back_once(tmp_path, monkeypatch):
    train_config(tmp_path, "1gbit", "gloo", 2.0, digest="g")
    train_config(tmp_path, "1gbit", "switch", 1.25, digest="s")
    train_config(tmp_path, "1gbit", "switch-killed", 3.0, digest="other")
    rc, res, table = run_train_report(tmp_path, monkeypatch, "1gbit", "gloo,switch,switch-killed")
    assert rc == 3
    assert res["checks"]["same_weights_as_switch"] == {"1gbit switch-killed": False}
    assert res["checks"]["ok"] is False and res["headline"]["sanity_ok"] is False
    # The kill-to-host-path time is still reported.
    assert res["headline"]["kill_to_host_path_s_1gbit"] == 2.5 and res["headline"]["kill_to_host_path_goal_met"]
    assert "1gbit switch-killed NO" in table

    # The switch's weights, but one rank never fell back (it would have
    # stalled: the counters are the check), or fell back twice, or came
    # back to a dead switch, or ran nothing on the hosts.
    rank3 = tmp_path / "1gbit-switch-killed" / "rank3.json"
    for rank in range(4):
        f = tmp_path / "1gbit-switch-killed" / f"rank{rank}.json"
        dump(f, {**json.loads(f.read_text()), "digest": "s"})
    rc, res, _ = run_train_report(tmp_path, monkeypatch, "1gbit", "gloo,switch,switch-killed")
    assert rc == 0 and res["checks"]["ran_as_configured"] == {"1gbit switch": True, "1gbit switch-killed": True}
    good = json.loads(rank3.read_text())
    for bad in ({"fallbacks": 0}, {"fallbacks": 2}, {"returns": 1}, {"host_collectives": 0}):
        dump(rank3, {**good, "path": {**good["path"], **bad}})
        rc, res, _ = run_train_report(tmp_path, monkeypatch, "1gbit", "gloo,switch,switch-killed")
        assert rc == 3, bad
        assert res["checks"]["ran_as_configured"]["1gbit switch-killed"] is False
        assert res["checks"]["ran_as_configured_ok"] is False
        assert res["checks"]["same_weights_as_switch"] == {"1gbit switch-killed": True}
    # A switch run that fell back is still not measuring the switch.
    dump(rank3, good)
    sw3 = tmp_path / "1gbit-switch" / "rank3.json"
    sw = json.loads(sw3.read_text())
    dump(sw3, {**sw, "path": good["path"]})
    rc, res, _ = run_train_report(tmp_path, monkeypatch, "1gbit", "gloo,switch,switch-killed")
    assert rc == 3 and res["checks"]["ran_as_configured"] == {"1gbit switch": False, "1gbit switch-killed": True}


def test_train_report_refuses_an_unknown_comm(tmp_path, monkeypatch):
    with pytest.raises(SystemExit):
        run_train_report(tmp_path, monkeypatch, "1gbit", "gloo,nccl")


def _has_matplotlib():
    return importlib.util.find_spec("matplotlib") is not None
