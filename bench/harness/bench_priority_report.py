#!/usr/bin/env python3
"""The report of `scripts/bench priority`: table, JSON and PNG.

Reads RUN/meta.json, and per window W (short_alone, long_alone, short_equal,
short_priority, long_after): W.short.w{0,1}.json (the short job's worker reports, in the
short windows), W.switch-{start,end}.json (`switchctl stats --json`),
W.t0/W.t1 (the window's wall-clock bounds) and W.sockperf.txt (the probe).

Numbers:
* short job completion time: the slower rank's `seconds` (its all-reduces,
  back to back, without the join); p99 per all-reduce: per iteration the
  slower rank's time, then the 99th percentile (bench/harness/benchkit.py's
  quantile, as every report: linear between order statistics).
* long job throughput: job 1's `bytes_aggregated` over the window (every
  rank's payload), per rank, in Gbit/s of gradient reduced.
* probe: sockperf's own p50/p99/p99.9 round trip (µs).
Ratios: short_job_with_priority_over_alone = short_priority / short_alone
completion time (goal <= 1.3); long_job_throughput_kept = the long job's
throughput in short_priority over its baseline, the mean of long_alone and
long_after (goal >= 0.8). The same two for short_equal, for comparison, and
long_job_priority_over_equal: what the priority itself costs the long job
beyond sharing with the short job at all. A window with a short job lasts
--window seconds or until the short job is done; the long job cannot keep
more than about 1 - (the short job's time alone) / (the window) while the
short job has the links to itself.

Usage: bench_priority_report.py RUN OUT.json OUT.png
"""
import json, os, re, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import median, quantile  # noqa: E402

WINDOWS = ("short_alone", "long_alone", "short_equal", "short_priority", "long_after")
LABELS = {
    "short_alone": "short job alone",
    "long_alone": "long job alone",
    "short_equal": "short job beside the long one, equal priority",
    "short_priority": "short job beside the long one, priority high",
    "long_after": "long job alone again",
}
GOALS = {"short_job_with_priority_over_alone": ("<=", 1.3), "long_job_throughput_kept": (">=", 0.8)}


def read_json(path):
    with open(path) as f:
        text = f.read().strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # A worker prints its JSON report as its last line starting with '{'.
        lines = [l for l in text.splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if lines else {}


def job(stats, jid):
    for j in stats.get("jobs", []):
        if j.get("id") == jid:
            return j
    return {}


def short_job(run, w):
    reps = []
    for r in (0, 1):
        path = os.path.join(run, f"{w}.short.w{r}.json")
        if not os.path.exists(path):
            return None
        reps.append(read_json(path))
    for rep in reps:
        if not rep.get("verified"):
            sys.exit(f"{w}: a short-job rank did not verify its sums: {rep}")
    per_iter = [max(t) for t in zip(*(rep["iteration_seconds"] for rep in reps))]
    return {
        "completion_s": max(rep["seconds"] for rep in reps),
        "p99_allreduce_ms": quantile(per_iter, 0.99) * 1e3,
        "median_allreduce_ms": median(per_iter) * 1e3,
        "allreduces": len(per_iter),
    }


def long_job(run, w):
    a = job(read_json(os.path.join(run, f"{w}.switch-start.json")), 1)
    b = job(read_json(os.path.join(run, f"{w}.switch-end.json")), 1)
    t0 = float(open(os.path.join(run, f"{w}.t0")).read())
    t1 = float(open(os.path.join(run, f"{w}.t1")).read())
    if not a or not b or b.get("state") != "active":
        return None
    n = b.get("n_workers", 2)
    bits = (b["bytes_aggregated"] - a["bytes_aggregated"]) * 8 / n
    return {
        "gbit_per_s_per_rank": bits / (t1 - t0) / 1e9,
        "priority_marked": b.get("priority_marked", 0) - a.get("priority_marked", 0),
        "ece_marked": b.get("ece_marked", 0) - a.get("ece_marked", 0),
        "beyond_window_drops": b["drops"].get("beyond_window", 0) - a["drops"].get("beyond_window", 0),
    }


def probe(run, w):
    text = open(os.path.join(run, f"{w}.sockperf.txt")).read()
    out = {}
    for key, pat in (("p50_us", r"percentile 50\.000 =\s*([0-9.]+)"),
                     ("p99_us", r"percentile 99\.000 =\s*([0-9.]+)"),
                     ("p999_us", r"percentile 99\.900 =\s*([0-9.]+)")):
        m = re.search(pat, text)
        out[key] = float(m.group(1)) if m else None
    return out


def fmt(v, spec):
    return "–" if v is None else format(v, spec)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    run, out_json, out_png = sys.argv[1:]
    meta = read_json(os.path.join(run, "meta.json"))
    rows = {w: {"short": short_job(run, w), "long": long_job(run, w), "probe": probe(run, w)} for w in WINDOWS}
    alone = rows["short_alone"]["short"]["completion_s"]
    long_alone = (rows["long_alone"]["long"]["gbit_per_s_per_rank"]
                  + rows["long_after"]["long"]["gbit_per_s_per_rank"]) / 2
    res = {
        "meta": meta,
        "windows": rows,
        "short_job_with_priority_over_alone": rows["short_priority"]["short"]["completion_s"] / alone,
        "long_job_throughput_kept": rows["short_priority"]["long"]["gbit_per_s_per_rank"] / long_alone,
        "short_job_equal_over_alone": rows["short_equal"]["short"]["completion_s"] / alone,
        "long_job_throughput_kept_equal": rows["short_equal"]["long"]["gbit_per_s_per_rank"] / long_alone,
        "long_job_baseline_gbit_per_s_per_rank": long_alone,
    }
    res["long_job_priority_over_equal"] = res["long_job_throughput_kept"] / res["long_job_throughput_kept_equal"]
    res["goals_met"] = {
        k: (res[k] <= g if op == "<=" else res[k] >= g) for k, (op, g) in GOALS.items()
    }
    with open(out_json, "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")

    print(f"run {meta['stamp']} at {meta['commit']}: worker links {meta['link']}, "
          f"{meta['short_iterations']} all-reduces of {meta['elements'] * 4 / 2**20:g} MiB, "
          f"windows of {meta['window_s']} s, load {meta['loadavg_at_end']} on {meta['cpus']} CPUs\n")
    print("| window | short job: time | ×alone | p99 per all-reduce | long job (Gbit/s per rank) | kept (of baseline) | long job's chunks marked for priority | probe p99 |")
    print("|---|---|---|---|---|---|---|---|")
    for w in WINDOWS:
        s, l, p = rows[w]["short"], rows[w]["long"], rows[w]["probe"]
        print("| {} | {} | {} | {} | {} | {} | {} | {} |".format(
            LABELS[w],
            fmt(s and s["completion_s"], ".2f") + (" s" if s else ""),
            fmt(s and s["completion_s"] / alone, ".2f"),
            fmt(s and s["p99_allreduce_ms"], ".0f") + (" ms" if s else ""),
            fmt(l and l["gbit_per_s_per_rank"], ".3f"),
            fmt(l and l["gbit_per_s_per_rank"] / long_alone, ".2f"),
            fmt(l and l["priority_marked"], "d"),
            fmt(p["p99_us"], ".0f") + (" µs" if p["p99_us"] is not None else ""),
        ))
    print()
    for k, (op, g) in GOALS.items():
        print(f"{k} = {res[k]:.2f} (goal {op} {g}: {'met' if res['goals_met'][k] else 'NOT met'})")
    print(f"for comparison, equal priority: short job ×{res['short_job_equal_over_alone']:.2f}, "
          f"long job kept {res['long_job_throughput_kept_equal']:.2f}; the long job with priority "
          f"over equal: {res['long_job_priority_over_equal']:.2f}")
    print(f"wrote {out_json}")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no PNG (set BENCH_PYTHON to a Python that has it)")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    short_ws = [w for w in WINDOWS if rows[w]["short"]]
    ax1.bar(range(len(short_ws)), [rows[w]["short"]["completion_s"] for w in short_ws],
            color=["grey", "tab:orange", "tab:green"][: len(short_ws)])
    ax1.axhline(1.3 * alone, ls="--", color="k", lw=1, label="goal: 1.3 × alone")
    ax1.set_xticks(range(len(short_ws)), ["alone", "equal", "high"])
    ax1.set_ylabel("short job completion (s)")
    ax1.legend(loc="upper left")
    long_ws = [w for w in WINDOWS if rows[w]["long"]]
    ax2.bar(range(len(long_ws)), [rows[w]["long"]["gbit_per_s_per_rank"] for w in long_ws],
            color=["grey", "tab:orange", "tab:green", "grey"][: len(long_ws)])
    ax2.axhline(0.8 * long_alone, ls="--", color="k", lw=1, label="goal: 0.8 × baseline")
    ax2.set_xticks(range(len(long_ws)), ["alone", "+ short, equal", "+ short, high", "alone again"])
    ax2.set_ylabel("long job over the window (Gbit/s per rank)")
    ax2.legend(loc="upper center")
    fig.suptitle(f"Priorities: short job beside a long one, {meta['link']} ({meta['stamp']})")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    print(f"wrote {out_png}")


if __name__ == "__main__":
    main()
