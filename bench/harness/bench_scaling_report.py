#!/usr/bin/env python3
"""bench_scaling_report.py: the report of `scripts/bench scaling`.

Usage: bench/harness/bench_scaling_report.py RAW_JSON OUT_JSON OUT_PNG --stamp STAMP
           --load-start L --load-end L

RAW_JSON is what `engine_scaling --json` wrote. Writes OUT_JSON: the raw
report plus the stamp, the machine, the 1-min load average around the run,
each configuration's speedup over 1 thread (median Mpps at T / at T=1, same
backend and layout; the table also shows DATA per CPU-second of the feeding
threads and the lowest share of their CPUs they got, below 1 when other load
ran there or a thread slept on a lock) and the headline `engine_2_over_1`: Mpps at 2 threads
over 1, rss layout, of the lockfree backend when it was measured, else of
table-lock (`engine_2_over_1_backend` names it; null when T=1 or T=2 was not
run; `engine_2_over_1_seq_lanes`: the same for the steered layout, what
switchd's seq lanes with a NIC rule per lane make of one job), with
`core_round_trip_ns`, the CPU-to-CPU cache-line round trip
measured around that configuration's runs (per run the larger of before
and after, median): on a virtual machine it moves as the hypervisor moves
the CPUs, and the layouts that share a job between threads follow it. So
each 2-over-1 ratio also comes as `…_near`: from the repeats whose round
trips, before and after, were both under NEAR_NS (the CPUs shared a cache),
null when none was. Prints the table as Markdown (for docs/BENCHMARKS.md). Draws OUT_PNG
(matplotlib, Agg backend): Mpps over threads per backend and layout (median,
whiskers best..worst repeat), and the speedup over 1 thread against the
ideal line and the issue's goal at 2 threads. Without matplotlib it warns
and writes no PNG (exit status 0: the JSON and table are the results).
"""

import argparse
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import median  # noqa: E402

GOAL_2_OVER_1 = 1.8
# Between the two placements the 2-vCPU VM shows: about 55-70 ns when its
# two CPUs share a cache, 320-360 ns when they do not.
NEAR_NS = 150.0


def machine():
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu_model": model, "kernel": platform.release()}


def find(runs, backend, layout, threads):
    for r in runs:
        if (r["backend"], r["layout"], r["threads"]) == (backend, layout, threads):
            return r
    return None


def headline(report):
    runs = report["runs"]
    measured = {r["backend"] for r in runs}
    backend = "lockfree" if "lockfree" in measured else "table-lock"
    return backend, ratio_2_over_1(runs, backend, "rss")


def ratio_2_over_1(runs, backend, layout):
    one, two = find(runs, backend, layout, 1), find(runs, backend, layout, 2)
    return two["mpps"] / one["mpps"] if one and two and one["mpps"] > 0 else None


def near(repeat):
    probes = (repeat.get("core_round_trip_ns"), repeat.get("core_round_trip_after_ns"))
    return all(p is not None and p < NEAR_NS for p in probes)


def ratio_2_over_1_near(runs, backend, layout):
    """2 over 1 from the 2-thread repeats run with the CPUs near; and how
    many of them there were."""
    one, two = find(runs, backend, layout, 1), find(runs, backend, layout, 2)
    if not one or not two or one["mpps"] <= 0:
        return None, 0
    close = [p["mpps"] for p in two["repeats"] if near(p)]
    m = median(close)
    return (m / one["mpps"] if m is not None else None), len(close)


def add_speedups(report):
    for r in report["runs"]:
        one = find(report["runs"], r["backend"], r["layout"], 1)
        r["over_1"] = r["mpps"] / one["mpps"] if one and one["mpps"] > 0 else None


def table(report):
    rows = [
        "| backend | layout | threads | DATA Mpps | GB/s summed | RESULT M/s | × 1 thread "
        "| DATA M per CPU-s | CPU share (min) | pinned | CPU round trip ns |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in report["runs"]:
        over = f"{r['over_1']:.2f}" if r["over_1"] is not None else "-"
        c2c = r.get("core_round_trip_ns")
        c2c = f"{c2c:.0f}" if c2c is not None else "-"
        rows.append(
            f"| {r['backend']} | {r['layout']} | {r['threads']} | {r['mpps']:.3f} | "
            f"{r['gbps']:.2f} | {r['results_mps']:.3f} | {over} | "
            f"{r['mpps_per_cpu_s']:.3f} | {r['cpu_share_min']:.2f} | "
            f"{'yes' if r['pinned'] else 'no'} | {c2c} |")
    return "\n".join(rows)


def plot(report, path):
    try:
        import matplotlib
    except ImportError:
        print("bench_scaling_report.py: warning: no matplotlib in this Python "
              f"({sys.executable}); no PNG (run scripts/setup.sh for the project venv)",
              file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.6), dpi=120)
    colors = {"table-lock": "#d62728", "lockfree": "#1f77b4", "lanes": "#2ca02c"}
    styles = {"rss": "-", "rank-blocks": "-.", "steered": ":", "job-per-thread": "--"}
    series = sorted({(r["backend"], r["layout"]) for r in report["runs"]})
    threads = sorted({r["threads"] for r in report["runs"]})
    for backend, layout in series:
        rs = sorted((r for r in report["runs"]
                     if r["backend"] == backend and r["layout"] == layout),
                    key=lambda r: r["threads"])
        xs = [r["threads"] for r in rs]
        ys = [r["mpps"] for r in rs]
        lo = [r["mpps"] - min(p["mpps"] for p in r["repeats"]) for r in rs]
        hi = [max(p["mpps"] for p in r["repeats"]) - r["mpps"] for r in rs]
        label = f"{backend}, {layout}"
        color = colors.get(backend, "#7f7f7f")
        ax.errorbar(xs, ys, yerr=[lo, hi], color=color, linestyle=styles.get(layout, ":"),
                    marker="o", capsize=3, label=label)
        sp = [(r["threads"], r["over_1"]) for r in rs if r["over_1"] is not None]
        if sp:
            ax2.plot([p[0] for p in sp], [p[1] for p in sp], color=color,
                     linestyle=styles.get(layout, ":"), marker="o", label=label)
    ax2.plot(threads, threads, color="#999999", linestyle=":", label="ideal (× threads)")
    if 2 in threads:
        ax2.scatter([2], [GOAL_2_OVER_1], marker="*", s=120, color="#2ca02c", zorder=3,
                    label=f"goal at 2 threads (× {GOAL_2_OVER_1})")
    for a in (ax, ax2):
        a.set_xticks(threads)
        a.set_xlabel("dataplane threads (T)")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    ax.set_ylabel("million DATA/s taken (median; whiskers: repeats)")
    ax.set_ylim(bottom=0)
    ax2.set_ylabel("speedup over 1 thread (median Mpps)")
    ax2.set_ylim(bottom=0)
    p = report["params"]
    ax.set_title(f"engine, in memory: {p['ranks']} ranks, {p['elems']} float32/DATA, "
                 f"{p['slots']} slots, {p['seconds']} s × {p['repeats']}", fontsize=9)
    h = report["engine_2_over_1"]
    hs = f"{h:.2f}" if h is not None else "-"
    ax2.set_title(f"engine_2_over_1 = {hs} ({report['engine_2_over_1_backend']}, rss)",
                  fontsize=9)
    m = report["machine"]
    load = report["loadavg_1min"]
    fig.text(0.99, 0.01,
             f"{m['nproc']} cores {m['cpu_model']}, kernel {m['kernel']}, {report['stamp']}, "
             f"1-min load {load['start']:.2f} → {load['end']:.2f}",
             ha="right", va="bottom", fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("raw_json")
    ap.add_argument("out_json")
    ap.add_argument("out_png")
    ap.add_argument("--stamp", required=True)
    ap.add_argument("--load-start", type=float, required=True)
    ap.add_argument("--load-end", type=float, required=True)
    a = ap.parse_args(argv)
    with open(a.raw_json, encoding="utf-8") as f:
        report = json.load(f)
    if not report.get("runs"):
        print(f"bench_scaling_report.py: error: {a.raw_json} has no runs", file=sys.stderr)
        return 1
    add_speedups(report)
    backend, ratio = headline(report)
    two = find(report["runs"], backend, "rss", 2)
    c2c = two.get("core_round_trip_ns") if two else None
    layouts = ["rss", "rank-blocks", "steered", "job-per-thread"]
    near_ratios = {lay: ratio_2_over_1_near(report["runs"], backend, lay) for lay in layouts}
    report = {
        "engine_2_over_1": ratio,
        "core_round_trip_ns": c2c,
        "near_ns": NEAR_NS,
        "engine_2_over_1_near": {
            lay: {"ratio": r, "repeats": k} for lay, (r, k) in near_ratios.items()},
        "engine_2_over_1_backend": backend,
        "engine_2_over_1_layout": "rss",
        "engine_2_over_1_rank_blocks": ratio_2_over_1(report["runs"], backend, "rank-blocks"),
        "engine_2_over_1_steered": ratio_2_over_1(report["runs"], backend, "steered"),
        # What switchd's seq lanes with a NIC rule per lane give one job:
        # every contribution of a chunk on one thread (the steered layout).
        "engine_2_over_1_seq_lanes": ratio_2_over_1(report["runs"], backend, "steered"),
        "engine_2_over_1_job_per_thread": ratio_2_over_1(report["runs"], backend, "job-per-thread"),
        # Software seq lanes in front of the same engine, DATA arriving as rss.
        "engine_2_over_1_lanes_rss": ratio_2_over_1(report["runs"], "lanes", "rss"),
        "goal_2_over_1": GOAL_2_OVER_1,
        "stamp": a.stamp,
        "machine": machine(),
        "loadavg_1min": {"start": a.load_start, "end": a.load_end},
        **report,
    }
    with open(a.out_json, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(table(report))
    print()
    if ratio is None:
        print(f"engine_2_over_1: - ({backend}, rss: needs T=1 and T=2 in --threads)")
    else:
        at = f", CPU round trip {c2c:.0f} ns" if c2c is not None else ""
        print(f"engine_2_over_1: {ratio:.2f} ({backend}, rss layout; goal {GOAL_2_OVER_1}{at})")
    for lay, (r, k) in near_ratios.items():
        if r is not None:
            print(f"  2 over 1 with the CPUs near (round trip < {NEAR_NS:.0f} ns before and "
                  f"after; {k} repeat(s)): {lay} {r:.2f}")
    sl = report["engine_2_over_1_seq_lanes"]
    if sl is not None:
        print(f"engine_2_over_1_seq_lanes: {sl:.2f} (one job with switchd's seq lanes steered "
              f"by NIC rules: the steered layout; goal {GOAL_2_OVER_1})")
    lanes = report["engine_2_over_1_lanes_rss"]
    if lanes is not None:
        print(f"  lanes (software seq lanes), DATA arriving as rss: 2 over 1 {lanes:.2f}")
    for nb in report.get("not_built", []):
        print(f"not measured: {nb['backend']}: {nb['error']}")
    plot(report, a.out_png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
