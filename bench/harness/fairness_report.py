#!/usr/bin/env python3
"""Results of `scripts/bench fairness`: every run's JSON, the summary JSON, the
tables and the plot, from the raw files the script leaves in its run folder.

Usage:
    fairness_report.py report RESULTS_DIR --json OUT.json --png OUT.png [settings]
    fairness_report.py plot RESULTS.json OUT.png     (redraw from the JSON alone)

RESULTS_DIR is results/fairness-STAMP/ as the fairness scenario leaves it, one folder
NAME-REPEAT per run (NAME idle, no_cc or cc), each holding the raw inputs:
  queue-wI.{before,after}.tc.json    `tc -s -j qdisc show dev eth0` of worker I
  queue-wI.{before,after}.map.json   `bpftool map dump -j` of worker I's CE
                                     marker (the tc-BPF marker only)
  switch.{before,start,end,after}.json  `switchctl stats --json`: before the
                                     workers start, at the probe's start and
                                     end, after the workers exit
  probe.t0, probe.t1                 the probe's start and end (Unix seconds)
  sockperf.txt, sockperf.csv         sockperf's output and its --full-log
  worker-wI.json, worker-wI.exit     worker I's report (last JSON line) and
                                     its exit status (a number or "timeout")
The report writes NAME-REPEAT/run.json for each run, then OUT.json (the
settings, the summary over repeats and every run), prints two tables and
draws OUT.png.

Arithmetic (all of it here, none in the shell script):
* counters are differences after - before of the snapshots around the run;
* a job's throughput is the mean of its ranks' gbit_per_s (their own clock);
  gbit_per_s_during_probe is the switch's bytes_aggregated over the probe's
  window, per rank;
* Jain's index is benchkit.jain over the two jobs;
* the CDF's round-trip quantiles and the medians over repeats are
  benchkit's (linear interpolation); the summary's CDF pools the round trips
  of every repeat of a kind of run.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import (  # noqa: E402
    fmt,
    jain,
    last_json_line,
    markdown_table,
    median,
    quantile,
    sockperf_rtts,
    sockperf_summary,
    write_json,
)

JOB_IDS = (1, 2)
WORKERS = 4
RUNS = {
    "idle": ("idle (sockperf alone)", None),
    "no_cc": ("load, no congestion control", False),
    "cc": ("load, DCTCP congestion control", True),
}
# The CE marker's counters (scripts/bpf/ecn_mark.bpf.c, map ecn_counters) by key.
MARKER_KEYS = ("ect", "marked", "other", "backlog_sum_ect", "backlog_sum_other", "backlog_max")
# Switch per-job counters whose difference over a run is reported.
SWITCH_JOB_COUNTERS = ("ece_marked", "results_sent", "retransmits_served", "chunks_completed")
# Percentiles of the stored CDF: every 1 % to 98, every 0.1 % from 99 to 99.8,
# every 0.01 % from 99.9 to 100 (the tail is what the plot is about).
CDF_PERCENTS = [
    int(q) if q == int(q) else q
    for q in list(range(99)) + [i / 10 for i in range(990, 999)] + [i / 100 for i in range(9990, 10001)]
]


# --- reading the run folder ---------------------------------------------------------


def read_text(path):
    """A file's text, or None when it is missing."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_json(path):
    """A JSON file, or None when it is missing or not JSON (a failed snapshot)."""
    text = read_text(path)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def read_seconds(path):
    """A timestamp file (Unix seconds), or None when missing or garbled."""
    try:
        return float((read_text(path) or "").strip())
    except ValueError:
        return None


def warn(msg):
    print(f"fairness_report: {msg}", file=sys.stderr)


def last_json_line_of(path):
    """The last line of a file that parses as a JSON object (the worker's
    report; its log lines go to stderr, but be safe), or None."""
    return last_json_line(read_text(path) or "")


def _int(v):
    """A bpftool value: a number, or (without BTF) little-endian hex bytes."""
    if isinstance(v, list):
        return int.from_bytes(bytes(int(b, 16) for b in v), "little")
    return int(v)


def queue_counters(tc_json, map_json, marker):
    """One worker's queue counters at one moment: the HTB root's bytes,
    packets and drops, and the marker's counters (bpf) or RED's CE marks
    (red). None when the tc snapshot is missing."""
    if not isinstance(tc_json, list):
        return None
    htb = next((q for q in tc_json if q.get("kind") == "htb"), {})
    out = dict.fromkeys(MARKER_KEYS)
    if marker == "bpf":
        if isinstance(map_json, list):
            by_key = {}
            for e in map_json:
                e = e.get("formatted", e)
                by_key[_int(e["key"])] = _int(e["value"])
            out.update({k: by_key.get(i) for i, k in enumerate(MARKER_KEYS)})
    else:
        red = next((q for q in tc_json if q.get("kind") == "red"), {})
        out["marked"] = red.get("marked") or 0
    out.update(
        sent_bytes=htb.get("bytes") or 0,
        sent_packets=htb.get("packets") or 0,
        drops=htb.get("drops") or 0,
    )
    return out


def diff(after, before, key):
    """after[key] - before[key], None when either is unknown."""
    if after is None or before is None or after.get(key) is None or before.get(key) is None:
        return None
    return after[key] - before[key]


def per(a, b):
    """a / b for a count b > 0, else None."""
    return a / b if a is not None and b else None


def queue_run(run_dir, i, ns, marker):
    """Worker I's queue over one run: packets, CE marks and mean depth."""
    snap = {}
    for w in ("before", "after"):
        base = os.path.join(run_dir, f"queue-w{i}.{w}")
        try:
            snap[w] = queue_counters(read_json(base + ".tc.json"), read_json(base + ".map.json"), marker)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            warn(f"{base}.{{tc,map}}.json: not a tc/bpftool dump ({e!r}); its counters are left out")
            snap[w] = None
    a, b = snap["before"], snap["after"]

    def d(k):
        return diff(b, a, k)

    return {
        "ns": ns,
        "ect_packets": d("ect"),
        "ce_marked": d("marked"),
        "other_packets": d("other"),
        "mean_backlog_ect_bytes": per(d("backlog_sum_ect"), d("ect")),
        "mean_backlog_other_bytes": per(d("backlog_sum_other"), d("other")),
        "max_backlog_bytes_ever": (b or {}).get("backlog_max"),
        "sent_packets": d("sent_packets"),
        "drops": d("drops"),
    }


def switch_snapshot(path):
    """A `switchctl stats --json` snapshot; None when it failed (the scenario
    writes {} then) or is missing."""
    s = read_json(path)
    return s if isinstance(s, dict) and s else None


def job_of(stats, job_id):
    """Job JOB_ID's counters in a switch snapshot: None when the snapshot
    failed, {} when it has no such job."""
    if stats is None:
        return None
    return next((j for j in stats.get("jobs") or [] if j.get("id") == job_id), {})


def counter_diff(after, before, key):
    """A switch counter's rise between two snapshots (a counter missing in
    one counts 0); None when a snapshot failed."""
    if after is None or before is None:
        return None
    return (after.get(key) or 0) - (before.get(key) or 0)


def cdf(rtts):
    """The stored distribution of round trips: percent q → rtt_us."""
    if not rtts:
        return {"q": [], "rtt_us": []}
    s = sorted(rtts)
    return {
        "q": CDF_PERCENTS,
        "rtt_us": [round(quantile(s, q / 100), 3) for q in CDF_PERCENTS],
        "samples": len(s),
    }


def rank_entry(report):
    st = report.get("stats") or {}
    return {
        "rank": report.get("rank"),
        "gbit_per_s": report.get("gbit_per_s"),
        "seconds": report.get("seconds"),
        "iterations": report.get("iterations"),
        "window": st.get("window"),
        "alpha": st.get("alpha"),
        "ece_results": st.get("ece_results"),
        "results": st.get("results"),
        "chunks_sent": st.get("chunks_sent"),
        "chunks_resent": st.get("chunks_resent"),
        "srtt_us": st.get("srtt_us"),
        "rto_us": st.get("rto_us"),
    }


def run_json(run_dir, name, repeat, prefix, marker, seconds):
    """One run's JSON (NAME-REPEAT/run.json)."""
    label, cc = RUNS[name]

    def snap(which):
        return switch_snapshot(os.path.join(run_dir, f"switch.{which}.json"))

    s0, ss, se, s1 = snap("before"), snap("start"), snap("end"), snap("after")
    t0 = read_seconds(os.path.join(run_dir, "probe.t0"))
    t1 = read_seconds(os.path.join(run_dir, "probe.t1"))
    workers = []
    if name != "idle":
        for i in range(WORKERS):
            workers.append(
                {
                    "ns": f"{prefix}-w{i}",
                    "exit": (read_text(os.path.join(run_dir, f"worker-w{i}.exit")) or "").strip(),
                    "report": last_json_line_of(os.path.join(run_dir, f"worker-w{i}.json")),
                }
            )
    reports = [w["report"] for w in workers if w["report"] is not None]
    jobs = []
    for jid in JOB_IDS:
        ranks = [rank_entry(r) for r in reports if r.get("job") == jid]
        rates = [r["gbit_per_s"] for r in ranks if r["gbit_per_s"] is not None]
        start, end = job_of(ss, jid), job_of(se, jid)
        during = None
        n = (start or {}).get("n_workers") or 0
        if t0 is not None and t1 is not None and t1 > t0 and n > 0 and end is not None:
            db = counter_diff(end, start, "bytes_aggregated")
            during = db * 8 / n / (t1 - t0) / 1e9
        before, after = job_of(s0, jid), job_of(s1, jid)
        jobs.append(
            {
                "id": jid,
                "ranks": ranks,
                "gbit_per_s": sum(rates) / len(rates) if rates else None,
                "gbit_per_s_during_probe": during,
                "switch": {k: counter_diff(after, before, k) for k in SWITCH_JOB_COUNTERS},
            }
        )
    loaded = name != "idle"
    return {
        "name": name,
        "repeat": repeat,
        "label": label,
        "congestion_control": cc,
        "seconds": seconds,
        "latency_us": sockperf_summary(read_text(os.path.join(run_dir, "sockperf.txt")) or ""),
        "cdf": cdf(sockperf_rtts(read_text(os.path.join(run_dir, "sockperf.csv")) or "")),
        "jobs": jobs if loaded else [],
        "jain": jain(j["gbit_per_s"] for j in jobs) if loaded else None,
        "jain_during_probe": jain(j["gbit_per_s_during_probe"] for j in jobs) if loaded else None,
        "queues": [queue_run(run_dir, i, f"{prefix}-w{i}", marker) for i in range(WORKERS)],
        "switch_ring_congested_frames": counter_diff(s1, s0, "ring_congested_frames"),
        "workers": workers,
    }


# --- summary over repeats ------------------------------------------------------------


def summary_entry(name, rs, pooled_rtts):
    """One kind of run over its repeats: medians, sums and the pooled CDF."""
    lat = [r["latency_us"] or {} for r in rs]
    jobs = []
    if name != "idle":
        for jid in JOB_IDS:
            js = [j for r in rs for j in r["jobs"] if j["id"] == jid]
            ranks = [rk for j in js for rk in j["ranks"]]
            marks = [j["switch"]["ece_marked"] for j in js if j["switch"]["ece_marked"] is not None]
            jobs.append(
                {
                    "id": jid,
                    "gbit_per_s": median(j["gbit_per_s"] for j in js),
                    "gbit_per_s_during_probe": median(j["gbit_per_s_during_probe"] for j in js),
                    "final_windows": [rk["window"] for rk in ranks],
                    "final_alphas": [rk["alpha"] for rk in ranks],
                    "ece_results": [rk["ece_results"] for rk in ranks],
                    "results": [rk["results"] for rk in ranks],
                    "chunks_resent": [rk["chunks_resent"] for rk in ranks],
                    "switch_ece_marked": sum(marks) if marks else None,
                }
            )
    q0 = [r["queues"][0] for r in rs]
    return {
        "name": name,
        "label": rs[0]["label"],
        "congestion_control": rs[0]["congestion_control"],
        "repeats": len(rs),
        "latency_us": {
            **{k: median(x.get(k) for x in lat) for k in ("p50", "p99", "p999", "max", "avg")},
            "samples": sum(x.get("samples") or 0 for x in lat),
            "dropped": sum(x.get("dropped") or 0 for x in lat),
        },
        "cdf": cdf(pooled_rtts),
        "jobs": jobs,
        "jain": median(r["jain"] for r in rs),
        "jain_during_probe": median(r["jain_during_probe"] for r in rs),
        "w0_queue": {
            "ce_marked_fraction": median(per(q["ce_marked"], q["ect_packets"]) for q in q0),
            "mean_backlog_probe_bytes": median(q["mean_backlog_other_bytes"] for q in q0),
            "mean_backlog_data_bytes": median(q["mean_backlog_ect_bytes"] for q in q0),
        },
    }


def build(res, a):
    """The whole result document of RESULTS_DIR res with settings a; writes
    each run's run.json on the way."""
    names = [n for n in a.runs.split(",") if n]
    runs, pooled = [], {}
    for rep in range(1, a.repeat + 1):
        for n in names:
            d = os.path.join(res, f"{n}-{rep}")
            if not os.path.isdir(d):
                warn(f"no run folder {d}; leaving it out")
                continue
            r = run_json(d, n, rep, a.prefix, a.marker, a.seconds)
            write_json(os.path.join(d, "run.json"), r)
            runs.append(r)
            pooled.setdefault(n, []).extend(sockperf_rtts(read_text(os.path.join(d, "sockperf.csv")) or ""))
    ws = [f"{a.prefix}-w{i}" for i in range(WORKERS)]
    return {
        "generated": os.path.basename(os.path.normpath(res)).replace("fairness-", "", 1),
        "commit": a.commit,
        "kernel": os.uname().release,
        "cpus": len(os.sched_getaffinity(0)),
        "command": a.command,
        "setup": {
            "workers": WORKERS,
            "jobs": [{"id": 1, "ranks": ws[0:2]}, {"id": 2, "ranks": ws[2:4]}],
            "probe": {
                "tool": f"sockperf {a.probe_mode}",
                "client": ws[0],
                "server": f"{a.prefix}-h0 {a.host_addr}",
                "msg_size": a.msg_size,
                "mps": a.mps,
                "metric": "round trip (--full-rtt), microseconds",
            },
            "bottleneck": {
                "where": "egress of every worker eth0",
                "rate_mbit": a.rate,
                "marker": a.marker,
                "mark_min_bytes": a.mark_min,
                "mark_max_bytes": a.mark_max,
            },
            "elements": a.elements,
            "iterations_per_worker": a.iterations,
            "seconds_per_run": a.seconds,
            "repeats": a.repeat,
            "switch": {"pool_slots": 256, "ecn_ring_threshold": "default"},
        },
        "summary": [
            summary_entry(n, [r for r in runs if r["name"] == n], pooled.get(n, []))
            for n in names
            if any(r["name"] == n for r in runs)
        ],
        "runs": runs,
    }


# --- tables ----------------------------------------------------------------------------


def tables(doc):
    """The two tables the fairness scenario prints: per kind of run, and per worker."""
    s, bn, pr = doc["setup"], doc["setup"]["bottleneck"], doc["setup"]["probe"]
    head = (
        f"=== fairness: {bn['rate_mbit']} Mbit/s per worker egress, CE marks "
        f"{bn['mark_min_bytes']}-{bn['mark_max_bytes']} B ({bn['marker']}), {pr['tool']} "
        f"{pr['msg_size']} B at {pr['mps']} msg/s from {pr['client']}, {s['seconds_per_run']} s per run"
        + (f", median of {s['repeats']} repeats" if s["repeats"] > 1 else "")
        + " ==="
    )
    rows = []
    for e in doc["summary"]:
        lat, jobs, q = e["latency_us"], e["jobs"], e["w0_queue"]
        ce = q["ce_marked_fraction"]
        rows.append(
            [
                e["name"],
                *(fmt(lat[k], 1) for k in ("p50", "p99", "p999", "max")),
                fmt(jobs[0]["gbit_per_s"] if jobs else None, 4),
                fmt(jobs[1]["gbit_per_s"] if jobs else None, 4),
                fmt(e["jain"], 4),
                fmt(q["mean_backlog_probe_bytes"], 0),
                fmt(None if ce is None else 100 * ce, 1),
            ]
        )
    runs = markdown_table(
        ["run", " p50_us", " p99_us", " p99.9_us", " max_us", " job1_Gbps", " job2_Gbps", " Jain",
         " w0_probe_queue_B", " w0_DATA_CE%"],
        rows,
    )
    rows = []
    for r in doc["runs"]:
        for k, w in enumerate(r["workers"]):
            p = w["report"] or {}
            st = p.get("stats") or {}
            rows.append(
                [
                    r["name"],
                    str(r["repeat"]),
                    w["ns"],
                    fmt(p.get("job")),
                    fmt(p.get("rank")),
                    fmt(p.get("gbit_per_s"), 4),
                    fmt(st.get("window")),
                    fmt(st.get("alpha"), 3),
                    fmt(st.get("ece_results")),
                    fmt(st.get("results")),
                    fmt(st.get("chunks_resent")),
                    fmt(st.get("srtt_us")),
                    fmt(r["queues"][k]["ce_marked"]),
                ]
            )
    workers = markdown_table(
        ["run", " rep", "worker", " job", " rank", " Gbps", " window", " alpha", " ece_results",
         " results", " resent", " srtt_us", " CE_marked"],
        rows,
    )
    return f"{head}\n{runs}\n\n{workers}\n"


# --- plot -------------------------------------------------------------------------------

COLORS = {"idle": "#7f7f7f", "no_cc": "#d62728", "cc": "#1f77b4"}
NAMES = {"idle": "idle (probe alone)", "no_cc": "load, no CC", "cc": "load, DCTCP CC"}
PCTS = [("p50", "p50"), ("p99", "p99"), ("p999", "p99.9")]
# Payload share of a full chunk's DATA on the wire (1432 of 1496 bytes:
# 358 floats at MTU 1500): the worker egress shaper's goodput limit drawn
# over the throughputs.
GOODPUT_SHARE = 1432 / 1496


def _label(run):
    return NAMES.get(run["name"], run["name"])


def _fmt_us(v):
    return f"{v / 1000:.1f} ms" if v >= 1000 else f"{v:.0f} µs"


def _latency_panel(ax, runs, probe):
    width = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        lat = run.get("latency_us") or {}
        xs = [g + (i - (len(runs) - 1) / 2) * width for g in range(len(PCTS))]
        pairs = [(x, lat.get(k)) for x, (k, _) in zip(xs, PCTS) if lat.get(k) is not None]
        if not pairs:
            continue
        bars = ax.bar([x for x, _ in pairs], [v for _, v in pairs], width * 0.95,
                      label=_label(run), color=COLORS.get(run["name"]))
        for b, (_, v) in zip(bars, pairs):
            ax.annotate(_fmt_us(v), (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom",
                        fontsize=7, rotation=90, xytext=(0, 2), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xticks(range(len(PCTS)))
    ax.set_xticklabels([name for _, name in PCTS])
    ax.set_ylabel("round trip (µs, log scale)")
    ax.set_title(f"latency probe ({probe.get('tool', 'sockperf')}, {probe.get('client', '?')} → "
                 f"{(probe.get('server') or '?').split()[0]})")
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * 8)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", which="both", alpha=0.3)


def _throughput_panel(ax, runs, rate_mbit, jobs_setup):
    loaded = [r for r in runs if r.get("jobs")]
    width = 0.35
    ranks = {j["id"]: j["ranks"] for j in jobs_setup}
    for ji, job_id in enumerate(JOB_IDS):
        xs, ys = [], []
        for ri, run in enumerate(loaded):
            job = next((j for j in run["jobs"] if j["id"] == job_id), None)
            if job and job.get("gbit_per_s") is not None:
                xs.append(ri + (ji - 0.5) * width)
                ys.append(job["gbit_per_s"])
        who = "+".join(ranks.get(job_id, []))
        bars = ax.bar(xs, ys, width * 0.95, label=f"job {job_id}" + (f" ({who})" if who else ""),
                      color=["#2ca02c", "#9467bd"][ji])
        for b, v in zip(bars, ys):
            ax.annotate(f"{v:.3f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom",
                        fontsize=8, xytext=(0, 2), textcoords="offset points")
    top = max([j.get("gbit_per_s") or 0.0 for r in loaded for j in r["jobs"]] + [0.0])
    if rate_mbit:
        line = rate_mbit / 1000 * GOODPUT_SHARE
        ax.axhline(line, color="k", ls="--", lw=0.8)
        ax.annotate("shaper's goodput limit", (len(loaded) - 0.5, line), ha="right", va="bottom", fontsize=7)
        top = max(top, line)
    for ri, run in enumerate(loaded):
        if run.get("jain") is not None:
            ax.annotate(f"Jain {run['jain']:.3f}", (ri, top * 1.12), ha="center", fontsize=9, fontweight="bold")
    ax.set_ylim(0, top * 1.45 if top > 0 else 1)
    ax.set_xticks(range(len(loaded)))
    ax.set_xticklabels([_label(r) for r in loaded])
    ax.set_ylabel("all-reduce throughput per rank (Gbit/s)")
    ax.set_title("aggregation jobs")
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax.grid(axis="y", alpha=0.3)


def _ccdf_panel(ax, runs):
    for run in runs:
        c = run.get("cdf") or {}
        pts = [(r, 1 - q / 100) for q, r in zip(c.get("q") or [], c.get("rtt_us") or []) if q < 100 and r > 0]
        if pts:
            ax.plot([r for r, _ in pts], [p for _, p in pts], label=_label(run), color=COLORS.get(run["name"]))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("round trip (µs)")
    ax.set_ylabel("fraction of messages slower")
    ax.set_title("probe round-trip tail (CCDF)")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8)


def plot(doc, path):
    """Three panels: the probe's percentiles per kind of run (log bars), each
    job's throughput with Jain's index, and the probe's CCDF (log-log). One
    entry per kind of run: the summary (medians over repeats) when present."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc.get("summary") or doc["runs"]
    setup = doc.get("setup", {})
    bn = setup.get("bottleneck", {})
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    _latency_panel(axes[0], runs, setup.get("probe", {}))
    _throughput_panel(axes[1], runs, bn.get("rate_mbit"), setup.get("jobs", []))
    _ccdf_panel(axes[2], runs)
    client = setup.get("probe", {}).get("client", "fair-w0")
    fig.suptitle(
        f"Two all-reduce jobs and a latency probe sharing {client}'s egress queue: "
        f"{bn.get('rate_mbit', '?')} Mbit/s, CE marks at "
        f"{bn.get('mark_min_bytes', '?')}–{bn.get('mark_max_bytes', '?')} B "
        f"({bn.get('marker', '?')}), {setup.get('seconds_per_run', '?')} s per run"
        + (f", median of {setup['repeats']} repeats" if (setup.get("repeats") or 1) > 1 else ""),
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- command line -------------------------------------------------------------------------


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report", help="run folder to run JSONs, summary JSON, tables and plot")
    r.add_argument("results", help="results/fairness-STAMP/")
    r.add_argument("--json", required=True, help="summary JSON to write")
    r.add_argument("--png", help="plot to draw (needs matplotlib)")
    for opt in ("rate", "mark-min", "mark-max", "elements", "iterations", "seconds", "repeat", "msg-size"):
        r.add_argument(f"--{opt}", type=int, required=True)
    r.add_argument("--mps", required=True, help="messages per second, or max")
    r.add_argument("--runs", required=True, help="comma-separated, in the order they ran")
    r.add_argument("--marker", required=True, choices=("bpf", "red"))
    r.add_argument("--probe-mode", required=True, help="sockperf mode (under-load, ping-pong)")
    r.add_argument("--prefix", default="fair", help="testbed prefix")
    r.add_argument("--host-addr", required=True, help="the sockperf server's address")
    r.add_argument("--command", default="")
    r.add_argument("--commit", default="unknown")
    g = sub.add_parser("plot", help="redraw the plot from a summary JSON")
    g.add_argument("json")
    g.add_argument("png")
    a = p.parse_args(argv)
    if a.cmd == "plot":
        with open(a.json, encoding="utf-8") as f:
            plot(json.load(f), a.png)
        return 0
    if not os.path.isdir(a.results):
        p.error(f"no results folder {a.results}")
    bad = [n for n in a.runs.split(",") if n and n not in RUNS]
    if bad:
        p.error(f"--runs: unknown run '{bad[0]}' (idle, no_cc, cc)")
    doc = build(a.results, a)
    if not doc["runs"]:
        warn(f"no run folders NAME-REPEAT in {a.results}; nothing to report")
        return 1
    write_json(a.json, doc)
    print(tables(doc))
    if a.png:
        plot(doc, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
