"""bench/harness/fairness_report.py: the arithmetic behind bench/results/fairness.json
(Jain's index, counter differences, medians over repeats, the probe's
quantiles), on a small run folder laid out as `scripts/bench fairness` leaves
it (issue 24: benchmark logic in Python, not jq)."""

import importlib.util
import json
import os

import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "harness")
_spec = importlib.util.spec_from_file_location("fairness_report", os.path.join(SCRIPTS, "fairness_report.py"))
fr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fr)

SOCKPERF_TXT = """sockperf: [Valid Duration] RunTime=1.549 sec; SentMessages=1550; ReceivedMessages={n}
sockperf: ====> avg-rtt={avg} (std-dev=294.112)
sockperf: # dropped messages = {dropped}; # duplicated messages = 0; # out-of-order messages = 0
sockperf: ---> <MAX> observation = {max}
sockperf: ---> percentile 99.900 = {p999}
sockperf: ---> percentile 99.000 = {p99}
sockperf: ---> percentile 50.000 =   {p50}
sockperf: ---> <MIN> observation =   1.000
------------------------------
sockperf: [Valid Duration] RunTime=1.549 sec; SentMessages=1550; ReceivedMessages=999999
sockperf: ---> percentile 50.000 =   999999.0
"""


def sockperf_csv(rtts):
    rows = "".join(f"{i}, {1 + i / 1000:.9f}, {1 + i / 1000 + r / 1e6:.9f}, {r:.3f}\n" for i, r in enumerate(rtts))
    # sockperf repeats its summary above the samples; a "0, ..." line there
    # must not count.
    head = "sockperf: ---> percentile 50.000 = 5.0\n0, x, y, 123456\n"
    return head + "packet, txTime(sec), rxTime(sec), rtt(usec)\n" + rows


def tc_dump(packets, drops=0, red_marked=None):
    q = [{"kind": "htb", "handle": "1:", "root": True, "bytes": packets * 1500, "packets": packets, "drops": drops}]
    if red_marked is not None:
        q.append({"kind": "red", "handle": "10:", "parent": "1:1", "marked": red_marked})
    return q


def map_dump(counters, btf=True):
    """bpftool map dump -j of the marker's counters [ect, marked, other,
    backlog_sum_ect, backlog_sum_other, backlog_max]."""
    out = []
    for k, v in enumerate(counters):
        raw = {"key": [f"0x{b:02x}" for b in k.to_bytes(4, "little")],
               "value": [f"0x{b:02x}" for b in v.to_bytes(8, "little")]}
        if btf:
            raw["formatted"] = {"key": k, "value": v}
        out.append(raw)
    return out


def switch(jobs, ring=0):
    return {"ring_congested_frames": ring, "jobs": [{"id": i, "n_workers": 2, **c} for i, c in jobs.items()]}


def worker(job, rank, gbps, window=8, alpha=0.25, resent=3):
    return {"job": job, "rank": rank, "gbit_per_s": gbps, "seconds": 4.0, "iterations": 5,
            "stats": {"window": window, "alpha": alpha, "ece_results": 10, "results": 100,
                      "chunks_sent": 103, "chunks_resent": resent, "srtt_us": 900, "rto_us": 5000}}


def write(d, name, content):
    with open(os.path.join(d, name), "w") as f:
        f.write(content if isinstance(content, str) else json.dumps(content))


# The CE marker's counters before and after a run (every worker's queue).
MARKER_BEFORE = (1000, 100, 50, 2_000_000, 10_000, 9000)
MARKER_AFTER = (3000, 600, 150, 6_000_000, 60_000, 12_000)


def make_run(res, name, rep, *, rtts, lat, rates=(0.06, 0.06, 0.02, 0.02), marker="bpf", btf=True,
             ece=(100, 350), switch_ok=True):
    d = os.path.join(res, f"{name}-{rep}")
    os.makedirs(d)
    write(d, "sockperf.txt", SOCKPERF_TXT.format(**lat))
    write(d, "sockperf.csv", sockperf_csv(rtts))
    write(d, "probe.t0", "1000.0\n")
    write(d, "probe.t1", "1002.0\n")
    for i in range(4):
        for w, (pk, counters) in (("before", (10, MARKER_BEFORE)), ("after", (2010, MARKER_AFTER))):
            write(d, f"queue-w{i}.{w}.tc.json", tc_dump(pk + i, red_marked=counters[1] if marker == "red" else None))
            if marker == "bpf":
                write(d, f"queue-w{i}.{w}.map.json", map_dump(counters, btf))
    before = switch({1: {"ece_marked": ece[0], "chunks_completed": 7}, 2: {"ece_marked": 0}}, ring=4)
    after = switch({1: {"ece_marked": ece[1], "chunks_completed": 57}, 2: {"ece_marked": 40}}, ring=9)
    start = switch({1: {"bytes_aggregated": 1_000_000}, 2: {"bytes_aggregated": 0}})
    end = switch({1: {"bytes_aggregated": 1_500_000}, 2: {"bytes_aggregated": 250_000}})
    for which, s in (("before", before), ("start", start), ("end", end), ("after", after)):
        write(d, f"switch.{which}.json", s if switch_ok else {})
    if name != "idle":
        for i, g in enumerate(rates):
            write(d, f"worker-w{i}.json", "note: a log line\n" + json.dumps(worker(i // 2 + 1, i % 2, g)) + "\n")
            write(d, f"worker-w{i}.exit", "0\n")
    return d


LAT = dict(n=1550, avg=80.5, dropped=2, max=4000.0, p999=3000.0, p99=1000.0, p50=40.0)


def settings(**kw):
    a = dict(prefix="fair", marker="bpf", rate=100, mark_min=6000, mark_max=18000, elements=4194304,
             iterations=5, seconds=2, repeat=1, runs="idle,no_cc,cc", mps="1000", msg_size=64,
             probe_mode="under-load", host_addr="198.18.0.100", command="sudo scripts/bench fairness", commit="abc")
    a.update(kw)
    return type("Args", (), a)


def test_jain_is_one_for_equal_jobs_and_falls_as_they_diverge():
    assert fr.jain([0.09, 0.09]) == pytest.approx(1.0)
    # (0.06 + 0.02)^2 / (2 * (0.06^2 + 0.02^2)) = 0.0064 / 0.008
    assert fr.jain([0.06, 0.02]) == pytest.approx(0.8)
    assert fr.jain([1.0, 0.0]) == pytest.approx(0.5)
    assert fr.jain([0.06, None]) is None
    assert fr.jain([0.0, 0.0]) is None


def test_a_run_reports_rates_jain_and_counter_differences(tmp_path):
    d = make_run(str(tmp_path), "cc", 1, rtts=[10.0, 20.0, 30.0], lat=LAT)
    r = fr.run_json(d, "cc", 1, "fair", "bpf", 2)
    assert (r["name"], r["repeat"], r["congestion_control"]) == ("cc", 1, True)
    j1, j2 = r["jobs"]
    assert j1["gbit_per_s"] == pytest.approx(0.06) and j2["gbit_per_s"] == pytest.approx(0.02)
    assert r["jain"] == pytest.approx(0.8)
    # The switch's bytes over the probe's 2 s, per rank: 500 000 B * 8 / 2 / 2 s.
    assert j1["gbit_per_s_during_probe"] == pytest.approx(0.001)
    assert j2["gbit_per_s_during_probe"] == pytest.approx(0.0005)
    assert r["jain_during_probe"] == pytest.approx(0.0015**2 / (2 * (0.001**2 + 0.0005**2)))
    assert j1["switch"]["ece_marked"] == 250 and j2["switch"]["ece_marked"] == 40
    assert j1["switch"]["chunks_completed"] == 50
    assert j1["switch"]["results_sent"] == 0  # in neither snapshot: no rise
    assert r["switch_ring_congested_frames"] == 5
    assert [rk["rank"] for rk in j1["ranks"]] == [0, 1] and j1["ranks"][0]["window"] == 8
    q = r["queues"][0]
    assert q["ns"] == "fair-w0"
    assert (q["ect_packets"], q["ce_marked"], q["other_packets"]) == (2000, 500, 100)
    assert q["mean_backlog_ect_bytes"] == pytest.approx(4_000_000 / 2000)
    assert q["mean_backlog_other_bytes"] == pytest.approx(50_000 / 100)
    assert q["max_backlog_bytes_ever"] == 12_000
    assert (q["sent_packets"], q["drops"]) == (2000, 0)
    assert r["latency_us"] == {"p50": 40.0, "p99": 1000.0, "p999": 3000.0, "max": 4000.0, "min": 1.0,
                               "avg": 80.5, "samples": 1550, "dropped": 2}
    cdf = dict(zip(r["cdf"]["q"], r["cdf"]["rtt_us"]))
    assert r["cdf"]["samples"] == 3
    # Linear between neighbouring samples (benchkit.quantile), as numpy does.
    assert (cdf[0], cdf[25], cdf[50], cdf[99], cdf[100]) == pytest.approx((10.0, 15.0, 20.0, 29.8, 30.0))
    assert [w["exit"] for w in r["workers"]] == ["0"] * 4


def test_the_marker_map_without_btf_decodes_the_same(tmp_path):
    with_btf = fr.run_json(make_run(str(tmp_path / "a"), "cc", 1, rtts=[1.0], lat=LAT), "cc", 1, "fair", "bpf", 2)
    raw = fr.run_json(make_run(str(tmp_path / "b"), "cc", 1, rtts=[1.0], lat=LAT, btf=False), "cc", 1, "fair", "bpf", 2)
    assert raw["queues"] == with_btf["queues"]


def test_red_counts_its_ce_marks_and_leaves_the_bpf_only_counters_unknown(tmp_path):
    d = make_run(str(tmp_path), "no_cc", 1, rtts=[1.0], lat=LAT, marker="red")
    q = fr.run_json(d, "no_cc", 1, "fair", "red", 2)["queues"][0]
    assert q["ce_marked"] == 500
    assert q["ect_packets"] is None and q["mean_backlog_ect_bytes"] is None
    assert q["sent_packets"] == 2000


def test_a_failed_switch_snapshot_is_unknown_not_zero(tmp_path):
    d = make_run(str(tmp_path), "cc", 1, rtts=[1.0], lat=LAT, switch_ok=False)
    r = fr.run_json(d, "cc", 1, "fair", "bpf", 2)
    assert r["jobs"][0]["switch"]["ece_marked"] is None
    assert r["jobs"][0]["gbit_per_s_during_probe"] is None
    assert r["switch_ring_congested_frames"] is None
    assert r["jain"] == pytest.approx(0.8)  # the workers' own rates still count


def test_the_summary_takes_medians_over_repeats_and_pools_the_cdf(tmp_path):
    res = str(tmp_path)
    make_run(res, "idle", 1, rtts=[5.0], lat=LAT)
    for rep, (p99, rates, rtts) in enumerate(
        [(1000.0, (0.06, 0.06, 0.02, 0.02), range(1, 51)),
         (3000.0, (0.04, 0.04, 0.04, 0.04), range(51, 101)),
         (9000.0, (0.05, 0.05, 0.03, 0.03), range(101, 102))], start=1):
        make_run(res, "cc", rep, rtts=[float(x) for x in rtts], lat={**LAT, "p99": p99}, rates=rates)
    doc = fr.build(res, settings(repeat=3, runs="idle,cc"))
    assert [r["name"] for r in doc["runs"]] == ["idle", "cc", "cc", "cc"]
    idle, cc = doc["summary"]
    assert idle["jobs"] == [] and idle["jain"] is None
    assert cc["repeats"] == 3
    assert cc["latency_us"]["p99"] == 3000.0
    assert cc["latency_us"]["samples"] == 3 * 1550 and cc["latency_us"]["dropped"] == 6
    assert cc["jobs"][0]["gbit_per_s"] == pytest.approx(0.05)
    assert cc["jobs"][1]["gbit_per_s"] == pytest.approx(0.03)
    # Jain per repeat: 0.8, 1.0, 0.9412; the median is the middle one.
    assert cc["jain"] == pytest.approx(0.08**2 / (2 * (0.05**2 + 0.03**2)))
    assert cc["jobs"][0]["switch_ece_marked"] == 3 * 250
    assert cc["jobs"][0]["final_windows"] == [8] * 6
    assert cc["w0_queue"]["ce_marked_fraction"] == pytest.approx(500 / 2000)
    # The pooled CDF: 1..101 µs, so its median is 51 and p99 is 100.
    c = cc["cdf"]
    assert c["samples"] == 101
    assert c["rtt_us"][c["q"].index(50)] == pytest.approx(51.0)
    assert c["rtt_us"][c["q"].index(99)] == pytest.approx(100.0)
    assert c["rtt_us"][-1] == 101.0 and c["q"][-1] == 100
    assert doc["setup"]["jobs"][0]["ranks"] == ["fair-w0", "fair-w1"]
    assert json.load(open(os.path.join(res, "cc-2", "run.json")))["jobs"][0]["gbit_per_s"] == pytest.approx(0.04)


def test_the_command_line_writes_the_json_and_prints_the_tables(tmp_path, capsys):
    res = str(tmp_path / "fairness-20260101T000000Z")
    make_run(res, "cc", 1, rtts=[10.0, 20.0], lat=LAT)
    out = str(tmp_path / "out.json")
    argv = ["report", res, "--json", out, "--runs", "cc", "--marker", "bpf", "--probe-mode", "under-load",
            "--host-addr", "198.18.0.100", "--mps", "1000", "--prefix", "fpy"]
    for k in ("rate", "mark-min", "mark-max", "elements", "iterations", "seconds", "repeat", "msg-size"):
        argv += [f"--{k}", "1"]
    assert fr.main(argv) == 0
    doc = json.load(open(out))
    assert doc["generated"] == "20260101T000000Z"
    assert doc["summary"][0]["jain"] == pytest.approx(0.8)
    table = capsys.readouterr().out
    assert "| cc | 40.0 | 1000.0 | 3000.0 | 4000.0 | 0.0600 | 0.0200 | 0.8000 | 500 | 25.0 |" in table
    assert "| cc | 1 | fpy-w0 | 1 | 0 | 0.0600 | 8 | 0.250 | 10 | 100 | 3 | 900 | 500 |" in table


def test_an_unknown_run_name_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fr.main(["report", str(tmp_path), "--json", str(tmp_path / "o.json"), "--runs", "cc,fast",
                 "--marker", "bpf", "--probe-mode", "ul", "--host-addr", "x", "--mps", "1"]
                + [a for k in ("rate", "mark-min", "mark-max", "elements", "iterations", "seconds", "repeat",
                               "msg-size") for a in (f"--{k}", "1")])
    assert "unknown run 'fast'" in capsys.readouterr().err


def test_a_garbled_dump_leaves_its_counters_out_and_says_which_file(tmp_path, capsys):
    d = make_run(str(tmp_path), "cc", 1, rtts=[1.0], lat=LAT)
    write(d, "queue-w0.after.map.json", [{"formatted": {"key": "zero", "value": 1}}])
    write(d, "probe.t1", "not a time\n")
    r = fr.run_json(d, "cc", 1, "fair", "bpf", 2)
    assert r["queues"][0]["ce_marked"] is None and r["queues"][1]["ce_marked"] == 500
    assert r["jobs"][0]["gbit_per_s_during_probe"] is None
    assert "queue-w0.after.{tc,map}.json: not a tc/bpftool dump" in capsys.readouterr().err
