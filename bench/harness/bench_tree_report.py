#!/usr/bin/env python3
"""Table, JSON and plot of a `scripts/bench tree` run.

Usage: bench_tree_report.py RESULTS_DIR --json OUT.json --png OUT.png [settings]

RESULTS_DIR is results/bench-tree-STAMP/ as `scripts/bench tree` leaves it:
  trees/{unshaped,shaped}-{1,2}tree-rN/   one all-reduce run each: worker
      reports (worker-lIwK.json), switch stats files (leafI-stats.json,
      spineJ-stats.json), qdisc snapshots (tc-*.json), /proc/stat before and
      after, every switchd's /proc/PID/stat at the end
  fairness/{idle,no_cc,cc}-rN/   the same plus sockperf.txt / sockperf.csv,
      the CE markers' maps (marker-*.json) and the spine's counters at the
      probe's start and end (spine0.start.json, spine0.end.json)
Prints the tables, writes the JSON and a PNG (matplotlib, Agg) of three
panels: time per all-reduce over 1 and 2 trees, the probe's round-trip
percentiles per run, and each job's throughput per run.
"""

import argparse
import json
import os
import re
import statistics
import sys

GOAL = 0.55
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import (  # noqa: E402
    busy_fraction,
    jain,
    last_json_line,
    median,
    proc_seconds,
    quantile,
    sockperf_rtts,
    sockperf_summary,
)


def load_json(path):
    """The last JSON object in a file (worker output may have log lines)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return last_json_line(text)


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def job_of(stats, job_id):
    if not isinstance(stats, dict):
        return {}
    for j in stats.get("jobs") or []:
        if j.get("id") == job_id:
            return j
    return {}


def cpu_busy(run_dir):
    """Share of the machine's CPU time that was busy between the snapshots."""
    a, b = read(os.path.join(run_dir, "procstat.before")), read(os.path.join(run_dir, "procstat.after"))
    return busy_fraction(a, b) if a and b else None


def switchd_cpu(run_dir):
    """CPU seconds of every switchd over its life, by name (leaf0, spine1...)."""
    out = {}
    for name in sorted(os.listdir(run_dir)):
        if name.endswith(".procstat"):
            text = read(os.path.join(run_dir, name))
            if text:
                out[name[: -len(".procstat")]] = proc_seconds(text)
    return out


def qdisc_delta(run_dir, leaf, dev):
    """Bytes, packets and drops the root qdisc of DEV in leaf LEAF sent during the run."""

    def root(path):
        data = load_json(path)
        if not isinstance(data, list):
            return None
        for q in data:
            if q.get("root") or q.get("parent") in (None, "root"):
                return q
        return data[0] if data else None

    a = root(os.path.join(run_dir, f"tc-leaf{leaf}-{dev}.before.json"))
    b = root(os.path.join(run_dir, f"tc-leaf{leaf}-{dev}.after.json"))
    if not a or not b:
        return None
    return {k: (b.get(k) or 0) - (a.get(k) or 0) for k in ("bytes", "packets", "drops")}


def marker_delta(run_dir, leaf, dev):
    """The CE marker's counters (scripts/bpf/ecn_mark.bpf.c) during the run."""

    def counters(path):
        data = load_json(path)
        if not isinstance(data, list):
            return None
        out = {}
        for e in data:
            e = e.get("formatted", e)
            out[int(e["key"])] = int(e["value"])
        return out

    a = counters(os.path.join(run_dir, f"marker-leaf{leaf}-{dev}.before.json"))
    b = counters(os.path.join(run_dir, f"marker-leaf{leaf}-{dev}.after.json"))
    if a is None or b is None:
        return None
    d = {k: b.get(k, 0) - a.get(k, 0) for k in range(5)}
    ect, other = d[0], d[2]
    return {
        "ect_packets": ect,
        "ce_marked": d[1],
        "other_packets": other,
        "ce_fraction": d[1] / ect if ect else None,
        "mean_backlog_ect_bytes": d[3] / ect if ect else None,
        "mean_backlog_other_bytes": d[4] / other if other else None,
        "max_backlog_bytes_ever": b.get(5),
    }


# --- part 1: trees -----------------------------------------------------------------

RUN_RE = re.compile(r"^(unshaped|shaped)-([0-9]+)tree-r([0-9]+)$")


def trees_run(run_dir, name):
    m = RUN_RE.match(name)
    shaped, trees, rep = m.group(1) == "shaped", int(m.group(2)), int(m.group(3))
    workers = []
    for f in sorted(os.listdir(run_dir)):
        if f.startswith("worker-") and f.endswith(".json"):
            rep_json = load_json(os.path.join(run_dir, f))
            workers.append({"name": f[:-5], "report": rep_json})
    exits = (read(os.path.join(run_dir, "worker-exit"), "") or "").split(",")
    reports = [w["report"] for w in workers if isinstance(w["report"], dict)]
    ok = (
        len(reports) == len(workers) > 0
        and all(e == "0" for e in exits)
        and all(r.get("verified") for r in reports)
    )
    iters = reports[0].get("iterations", 1) if reports else 1
    slowest = max((r["seconds"] for r in reports), default=None)
    spines = []
    for j in range(8):
        path = os.path.join(run_dir, f"spine{j}-stats.json")
        if not os.path.exists(path):
            break
        spines.append(job_of(load_json(path), 1).get("chunks_completed"))
    leaves = []
    for i in range(8):
        path = os.path.join(run_dir, f"leaf{i}-stats.json")
        if not os.path.exists(path):
            break
        j = job_of(load_json(path), 1)
        leaves.append(
            {
                "partials_sent": j.get("partials_sent"),
                "partials_resent": j.get("partials_resent"),
                "chunks_completed": j.get("chunks_completed"),
                "retransmits_served": j.get("retransmits_served"),
                "duplicates": (j.get("drops") or {}).get("duplicate"),
            }
        )
    links = {}
    for i in range(len(leaves)):
        for j in range(len(spines)):
            for dev in (f"up-s{j}", f"ifb-s{j}"):
                d = qdisc_delta(run_dir, i, dev)
                if d is not None:
                    links[f"leaf{i} {dev}"] = d
    chunks_sent = sum(r["stats"]["chunks_sent"] for r in reports if "stats" in r)
    chunks_resent = sum(r["stats"]["chunks_resent"] for r in reports if "stats" in r)
    ps = sum(leaf["partials_sent"] or 0 for leaf in leaves)
    pr = sum(leaf["partials_resent"] or 0 for leaf in leaves)
    return {
        "name": name,
        "shaped": shaped,
        "trees": trees,
        "repeat": rep,
        "ok": ok,
        "worker_exits": exits,
        "iterations": iters,
        "seconds_per_allreduce": slowest / iters if slowest is not None else None,
        "gbit_per_s_per_rank": [r.get("gbit_per_s") for r in reports],
        "spine_chunks": spines,
        "leaves": leaves,
        "worker_chunks_sent": chunks_sent,
        "worker_chunks_resent": chunks_resent,
        "worker_resent_fraction": chunks_resent / chunks_sent if chunks_sent else None,
        "leaf_partials_resent_fraction": pr / ps if ps else None,
        "link_qdiscs": links,
        "cpu_busy": cpu_busy(run_dir),
        "switchd_cpu_s": switchd_cpu(run_dir),
        "switchd_exit": read(os.path.join(run_dir, "switchd-exit")),
        "workers": workers,
    }


def trees_summary(runs, rate_mbit, mib):
    def group(shaped, trees):
        return [r for r in runs if r["shaped"] == shaped and r["trees"] == trees]

    out = {}
    for shaped in (False, True):
        key = "shaped" if shaped else "unshaped"
        rows = {}
        for t in (1, 2):
            rs = group(shaped, t)
            if not rs:
                continue
            split = [median([r["spine_chunks"][j] for r in rs]) for j in range(len(rs[0]["spine_chunks"]))]
            total = sum(x for x in split if x)
            rows[f"{t}tree"] = {
                "runs": len(rs),
                "all_verified": all(r["ok"] for r in rs),
                "seconds_per_allreduce": median([r["seconds_per_allreduce"] for r in rs]),
                "seconds_each": [r["seconds_per_allreduce"] for r in rs],
                "spine_chunks": split,
                "spine_share": [x / total if total and x is not None else None for x in split],
                "worker_resent_fraction": median([r["worker_resent_fraction"] for r in rs]),
                "leaf_partials_resent_fraction": median([r["leaf_partials_resent_fraction"] for r in rs]),
                "cpu_busy": median([r["cpu_busy"] for r in rs]),
            }
        if "1tree" in rows and "2tree" in rows:
            a = rows["1tree"]["seconds_per_allreduce"]
            b = rows["2tree"]["seconds_per_allreduce"]
            rows["ratio_2_over_1"] = b / a if a and b else None
            # Pairwise: each repeat's 2-tree time over the same repeat's 1-tree.
            pairs = []
            for r2 in group(shaped, 2):
                r1 = [r for r in group(shaped, 1) if r["repeat"] == r2["repeat"]]
                if r1 and r1[0]["seconds_per_allreduce"] and r2["seconds_per_allreduce"]:
                    pairs.append(r2["seconds_per_allreduce"] / r1[0]["seconds_per_allreduce"])
            rows["ratio_each_repeat"] = pairs
        out[key] = rows
    # The link's bound: per 358-float chunk per leaf, one partial of 1496
    # bytes up and one RESULT of 1512 (its 16-byte token) down; both ways are
    # shaped, so the RESULTs bound it.
    chunks = -(-mib * 1024 * 1024 // 4 // 358)
    one_tree_bound = chunks * 1512 * 8 / (rate_mbit * 1e6)
    out["line_rate_bound_s"] = {"1tree": one_tree_bound, "2tree": one_tree_bound / 2}
    shaped = out.get("shaped", {})
    out["goal"] = GOAL
    out["goal_met"] = (
        shaped.get("ratio_2_over_1") is not None and shaped["ratio_2_over_1"] <= GOAL
    )
    if "unshaped" in out and "1tree" in out["unshaped"] and "1tree" in shaped:
        u = out["unshaped"]["1tree"]["seconds_per_allreduce"]
        s = shaped["1tree"]["seconds_per_allreduce"]
        out["shaped_1tree_over_unshaped_1tree"] = s / u if u and s else None
    return out


# --- part 2: fairness --------------------------------------------------------------

FAIR_RE = re.compile(r"^(idle|no_cc|cc)-r([0-9]+)$")


def fair_run(run_dir, name):
    m = FAIR_RE.match(name)
    kind, rep = m.group(1), int(m.group(2))
    lat = sockperf_summary(read(os.path.join(run_dir, "sockperf.txt"), ""))
    rtts = sorted(sockperf_rtts(read(os.path.join(run_dir, "sockperf.csv"), "")))
    exits = (read(os.path.join(run_dir, "worker-exit"), "") or "").split(",")
    workers = {}
    for f in sorted(os.listdir(run_dir)):
        if f.startswith("worker-") and f.endswith(".json"):
            workers[f[:-5]] = load_json(os.path.join(run_dir, f))
    t0 = float(read(os.path.join(run_dir, "probe.t0"), "0") or 0)
    t1 = float(read(os.path.join(run_dir, "probe.t1"), "0") or 0)
    s0 = load_json(os.path.join(run_dir, "spine0.start.json"))
    s1 = load_json(os.path.join(run_dir, "spine0.end.json"))
    spine_final = load_json(os.path.join(run_dir, "spine0-stats.json"))
    jobs = []
    if kind != "idle":
        for jid in (1, 2):
            ranks = [
                {
                    "worker": w,
                    "gbit_per_s": r.get("gbit_per_s"),
                    "seconds": r.get("seconds"),
                    "window": r.get("stats", {}).get("window"),
                    "alpha": r.get("stats", {}).get("alpha"),
                    "ece_results": r.get("stats", {}).get("ece_results"),
                    "results": r.get("stats", {}).get("results"),
                    "chunks_sent": r.get("stats", {}).get("chunks_sent"),
                    "chunks_resent": r.get("stats", {}).get("chunks_resent"),
                    "srtt_us": r.get("stats", {}).get("srtt_us"),
                }
                for w, r in workers.items()
                if isinstance(r, dict) and r.get("job") == jid
            ]
            a, b = job_of(s0, jid), job_of(s1, jid)
            during = None
            if t1 > t0 and a and b and b.get("n_workers"):
                db = (b.get("bytes_aggregated") or 0) - (a.get("bytes_aggregated") or 0)
                during = db * 8 / b["n_workers"] / (t1 - t0) / 1e9
            fin = job_of(spine_final, jid)
            jobs.append(
                {
                    "id": jid,
                    "gbit_per_s": statistics.mean([r["gbit_per_s"] for r in ranks])
                    if ranks and all(r["gbit_per_s"] is not None for r in ranks)
                    else None,
                    "gbit_per_s_during_probe": during,
                    "ranks": ranks,
                    "spine_ece_marked": fin.get("ece_marked"),
                    "spine_chunks_completed": fin.get("chunks_completed"),
                }
            )
    queues = {}
    leaves = []
    for leaf in (0, 1):
        for dev in ("up-s0", "ifb-s0"):
            q = marker_delta(run_dir, leaf, dev)
            if q is not None:
                queues[f"leaf{leaf} {dev}"] = q
            d = qdisc_delta(run_dir, leaf, dev)
            if d is not None:
                queues.setdefault(f"leaf{leaf} {dev}", {}).update({"qdisc": d})
        st = load_json(os.path.join(run_dir, f"leaf{leaf}-stats.json"))
        leaves.append(
            {
                f"job{jid}": {
                    k: job_of(st, jid).get(k)
                    for k in ("partials_sent", "partials_resent", "ece_marked", "chunks_completed")
                }
                for jid in (1, 2)
            }
        )
    return {
        "name": kind,
        "repeat": rep,
        "latency_us": lat,
        "csv_samples": len(rtts),
        "csv_quantiles_us": {
            "p50": quantile(rtts, 0.5),
            "p99": quantile(rtts, 0.99),
            "p999": quantile(rtts, 0.999),
        },
        "worker_exits": exits if kind != "idle" else [],
        "jobs": jobs,
        "jain": jain([j["gbit_per_s"] for j in jobs]) if jobs else None,
        "jain_during_probe": jain([j["gbit_per_s_during_probe"] for j in jobs]) if jobs else None,
        "queues": queues,
        "leaves": leaves,
        "cpu_busy": cpu_busy(run_dir),
        "switchd_cpu_s": switchd_cpu(run_dir),
    }


def fair_summary(runs):
    out = []
    for kind in ("idle", "no_cc", "cc"):
        rs = [r for r in runs if r["name"] == kind]
        if not rs:
            continue
        lat = {
            k: median([(r["latency_us"] or {}).get(k) for r in rs])
            for k in ("p50", "p99", "p999", "max", "avg")
        }
        jobs = []
        if kind != "idle":
            for jid in (1, 2):
                js = [j for r in rs for j in r["jobs"] if j["id"] == jid]
                jobs.append(
                    {
                        "id": jid,
                        "gbit_per_s": median([j["gbit_per_s"] for j in js]),
                        "gbit_per_s_during_probe": median([j["gbit_per_s_during_probe"] for j in js]),
                        "final_windows": [rk["window"] for j in js for rk in j["ranks"]],
                        "final_alphas": [rk["alpha"] for j in js for rk in j["ranks"]],
                        "ece_results": [rk["ece_results"] for j in js for rk in j["ranks"]],
                        "chunks_resent": [rk["chunks_resent"] for j in js for rk in j["ranks"]],
                        "chunks_sent": [rk["chunks_sent"] for j in js for rk in j["ranks"]],
                    }
                )
        q0 = [r["queues"].get("leaf0 up-s0", {}) for r in rs]
        sent = sum((lf[j].get("partials_sent") or 0) for r in rs for lf in r["leaves"] for j in lf)
        resent = sum((lf[j].get("partials_resent") or 0) for r in rs for lf in r["leaves"] for j in lf)
        out.append(
            {
                "name": kind,
                "repeats": len(rs),
                "latency_us": lat,
                "samples": sum((r["latency_us"] or {}).get("samples") or 0 for r in rs),
                "jobs": jobs,
                "jain": median([r["jain"] for r in rs]),
                "jain_during_probe": median([r["jain_during_probe"] for r in rs]),
                "leaf0_uplink": {
                    "ce_fraction": median([q.get("ce_fraction") for q in q0]),
                    "mean_backlog_probe_bytes": median([q.get("mean_backlog_other_bytes") for q in q0]),
                    "mean_backlog_data_bytes": median([q.get("mean_backlog_ect_bytes") for q in q0]),
                },
                "leaf_partials_resent_fraction": resent / sent if sent else None,
                "cpu_busy": median([r["cpu_busy"] for r in rs]),
                "all_workers_ok": all(e == "0" for r in rs for e in r["worker_exits"]),
            }
        )
    return out


# --- output ------------------------------------------------------------------------


def f(x, n=2, scale=1.0):
    return "-" if x is None else f"{x * scale:.{n}f}"


def pct(x, n):
    return "-" if x is None else f"{x * 100:.{n}f}%"


def table(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def print_tables(doc):
    s = doc["settings"]
    t = doc.get("trees")
    if t:
        print(
            f"\n=== trees: 2 leaves x 2 workers, {s['mib']} MiB x {s['iterations']}, "
            f"leaf-spine links {s['rate_mbit']} Mbit/s each way"
            f"{', CE-marking' if s['trees_ce_marking'] else ', plain FIFOs (no CE marks)'}, median of {s['repeat']} ==="
        )
        rows = [["links", "trees", "runs", "s/all-reduce", "each", "spine split", "worker resent", "leaf partials resent", "CPU busy", "verified"]]
        for key in ("unshaped", "shaped"):
            for tr in ("1tree", "2tree"):
                r = t["summary"].get(key, {}).get(tr)
                if not r:
                    continue
                rows.append(
                    [
                        key,
                        tr[0],
                        r["runs"],
                        f(r["seconds_per_allreduce"], 3),
                        "/".join(f(x, 2) for x in r["seconds_each"]),
                        "/".join(pct(x, 1) for x in r["spine_share"]),
                        pct(r["worker_resent_fraction"], 1),
                        pct(r["leaf_partials_resent_fraction"], 1),
                        pct(r["cpu_busy"], 0),
                        "yes" if r["all_verified"] else "NO",
                    ]
                )
        for line in table(rows):
            print(line)
        sh = t["summary"].get("shaped", {})
        un = t["summary"].get("unshaped", {})
        b = t["summary"]["line_rate_bound_s"]
        print(
            f"\nratio 2 trees / 1 tree, shaped: {f(sh.get('ratio_2_over_1'), 3)} "
            f"(each repeat: {', '.join(f(x, 3) for x in sh.get('ratio_each_repeat', []))}; goal <= {GOAL}: "
            f"{'met' if t['summary']['goal_met'] else 'NOT met'})"
        )
        if un.get("ratio_2_over_1") is not None:
            print(f"ratio 2 trees / 1 tree, unshaped: {f(un['ratio_2_over_1'], 3)}")
        if t["summary"].get("shaped_1tree_over_unshaped_1tree") is not None:
            print(f"shaped 1 tree / unshaped 1 tree: {f(t['summary']['shaped_1tree_over_unshaped_1tree'], 2)}")
        print(f"line-rate bound per all-reduce: 1 tree {f(b['1tree'], 3)} s, 2 trees {f(b['2tree'], 3)} s")
    fr = doc.get("fairness")
    if fr:
        print(
            f"\n=== fairness: 1 spine, jobs 1 (l0w0+l1w0) and 2 (l0w1+l1w1), probe l0h0 -> l1h0 "
            f"({s['mps']} msg/s, {s['seconds']} s), links {s['rate_mbit']} Mbit/s, CE {s['mark_min']}-{s['mark_max']} B "
            f"({fr['marker']}), median of {s['repeat']} ==="
        )
        rows = [["run", "p50_us", "p99_us", "p99.9_us", "job1_Mbps", "job2_Mbps", "Jain", "job1_Mbps_w", "job2_Mbps_w", "CE%_leaf0", "probe_queue_B", "leaf_resent", "CPU", "windows"]]
        for r in fr["summary"]:
            j = r["jobs"]
            rows.append(
                [
                    r["name"],
                    f(r["latency_us"]["p50"], 0),
                    f(r["latency_us"]["p99"], 0),
                    f(r["latency_us"]["p999"], 0),
                    f(j[0]["gbit_per_s_during_probe"], 1, 1000) if j else "-",
                    f(j[1]["gbit_per_s_during_probe"], 1, 1000) if j else "-",
                    f(r["jain_during_probe"], 3),
                    f(j[0]["gbit_per_s"], 1, 1000) if j else "-",
                    f(j[1]["gbit_per_s"], 1, 1000) if j else "-",
                    f(r["leaf0_uplink"]["ce_fraction"], 1, 100),
                    f(r["leaf0_uplink"]["mean_backlog_probe_bytes"], 0),
                    pct(r["leaf_partials_resent_fraction"], 0),
                    pct(r["cpu_busy"], 0),
                    ",".join(str(w) for x in j for w in x["final_windows"]) if j else "-",
                ]
            )
        for line in table(rows):
            print(line)
        by = {r["name"]: r for r in fr["summary"]}
        if "no_cc" in by and "cc" in by and by["cc"]["latency_us"]["p99"]:
            print(
                f"\nprobe p99 without / with congestion control: "
                f"{f(by['no_cc']['latency_us']['p99'] / by['cc']['latency_us']['p99'], 1)} x"
            )
    print()


def plot(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = doc.get("trees")
    fr = doc.get("fairness")
    n = (1 if t else 0) + (2 if fr else 0)
    fig, axes = plt.subplots(1, max(n, 1), figsize=(5.2 * max(n, 1), 4.4))
    if n <= 1:
        axes = [axes]
    k = 0
    if t:
        ax = axes[k]
        k += 1
        labels, vals, cols, dots = [], [], [], []
        for key, col in (("unshaped", "#7f7f7f"), ("shaped", "#1f77b4")):
            for tr in ("1tree", "2tree"):
                r = t["summary"].get(key, {}).get(tr)
                if not r:
                    continue
                labels.append(f"{key}\n{tr[0]} tree{'s' if tr[0] == '2' else ''}")
                vals.append(r["seconds_per_allreduce"] or 0)
                cols.append(col if tr == "1tree" else ("#aec7e8" if key == "shaped" else "#c7c7c7"))
                dots.append(r["seconds_each"])
        xs = range(len(vals))
        ax.bar(xs, vals, color=cols, edgecolor="black")
        for x, ds in zip(xs, dots):
            ax.plot([x] * len(ds), ds, "k.", ms=5)
        b = t["summary"]["line_rate_bound_s"]
        ax.axhline(b["1tree"], ls="--", color="#d62728", lw=1, label="1-tree link bound")
        ax.axhline(b["2tree"], ls=":", color="#d62728", lw=1, label="2-tree link bound")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("seconds per all-reduce (slowest rank)")
        ratio = t["summary"].get("shaped", {}).get("ratio_2_over_1")
        ax.set_title(
            f"{doc['settings']['mib']} MiB, links {doc['settings']['rate_mbit']} Mbit/s"
            f"{' CE-marking' if doc['settings']['trees_ce_marking'] else ' no CE marks'}\n"
            f"2 trees / 1 tree = {f(ratio, 3)} (goal <= {GOAL})",
            fontsize=10,
        )
        ax.legend(fontsize=8)
    if fr:
        runs = fr["summary"]
        colors = {"idle": "#7f7f7f", "no_cc": "#d62728", "cc": "#1f77b4"}
        ax = axes[k]
        k += 1
        pcts = [("p50", "p50"), ("p99", "p99"), ("p999", "p99.9")]
        w = 0.8 / max(len(runs), 1)
        for i, r in enumerate(runs):
            ys = [r["latency_us"][p] or 0 for p, _ in pcts]
            ax.bar([x + i * w for x in range(len(pcts))], ys, w, label=r["name"], color=colors.get(r["name"]))
        ax.set_xticks([x + w * (len(runs) - 1) / 2 for x in range(len(pcts))])
        ax.set_xticklabels([n for _, n in pcts])
        ax.set_yscale("log")
        ax.set_ylabel("probe round trip (µs)")
        ax.set_title("latency probe across the shared spine link", fontsize=10)
        ax.legend(fontsize=8)
        ax = axes[k]
        loaded = [r for r in runs if r["jobs"]]
        bound = doc["settings"]["rate_mbit"] * 1432 / 1512 / 2
        for i, r in enumerate(loaded):
            ys = [(j["gbit_per_s_during_probe"] or 0) * 1000 for j in r["jobs"]]
            ax.bar([i - 0.2, i + 0.2], ys, 0.4, color=[colors.get(r["name"]), "#ff9896" if r["name"] == "no_cc" else "#aec7e8"], edgecolor="black")
            ax.text(i, max(ys + [0]) + bound * 0.03, f"Jain {f(r['jain_during_probe'], 3)}", ha="center", fontsize=8)
        ax.axhline(bound, ls="--", color="black", lw=1, label="fair share of the link's payload")
        ax.set_ylim(0, bound * 1.25)
        ax.set_xticks(range(len(loaded)))
        ax.set_xticklabels([f"{r['name']}\njob 1 | job 2" for r in loaded], fontsize=8)
        ax.set_ylabel("all-reduce rate per rank during the probe (Mbit/s)")
        ax.set_title("the two jobs", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results")
    p.add_argument("--json", required=True)
    p.add_argument("--png", required=True)
    for a in ("rate", "mib", "iterations", "repeat", "seconds", "fair-mib", "mps", "mark-min", "mark-max"):
        p.add_argument(f"--{a}", type=int, required=True)
    p.add_argument("--prefix", default="tbch")
    p.add_argument("--command", default="")
    p.add_argument("--commit", default="unknown")
    a = p.parse_args()
    res = a.results
    doc = {
        "generated": os.path.basename(os.path.normpath(res)).replace("bench-tree-", ""),
        "commit": a.commit,
        "command": a.command,
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "settings": {
            "rate_mbit": a.rate,
            "mib": a.mib,
            "iterations": a.iterations,
            "repeat": a.repeat,
            "seconds": a.seconds,
            "fair_mib": a.fair_mib,
            "fair_iterations": int(read(os.path.join(res, "fair-iterations"), "0") or 0) or None,
            "mps": a.mps,
            "mark_min": a.mark_min,
            "mark_max": a.mark_max,
            "prefix": a.prefix,
            "leaves": 2,
            "workers_per_leaf": 2,
            "shaping": "HTB at rate on each leaf's up-sJ egress (leaf->spine) and on an ifb "
            "carrying up-sJ's ingress (spine->leaf)",
            "trees_ce_marking": read(os.path.join(res, "trees-ecn"), "?") == "1",
        },
    }
    tdir = os.path.join(res, "trees")
    if os.path.isdir(tdir):
        runs = [trees_run(os.path.join(tdir, n), n) for n in sorted(os.listdir(tdir)) if RUN_RE.match(n)]
        doc["trees"] = {"summary": trees_summary(runs, a.rate, a.mib), "runs": runs}
    fdir = os.path.join(res, "fairness")
    if os.path.isdir(fdir):
        runs = [fair_run(os.path.join(fdir, n), n) for n in sorted(os.listdir(fdir)) if FAIR_RE.match(n)]
        runs.sort(key=lambda r: (r["repeat"], ["idle", "no_cc", "cc"].index(r["name"])))
        doc["fairness"] = {
            "marker": read(os.path.join(res, "marker"), "?"),
            "summary": fair_summary(runs),
            "runs": runs,
        }
    with open(a.json, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    print_tables(doc)
    plot(doc, a.png)
    bad = doc.get("trees") and not all(r["ok"] for r in doc["trees"]["runs"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
