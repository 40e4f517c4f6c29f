#!/usr/bin/env python3
"""Plot the results of scripts/fairness.sh.

Usage: fairness_plot.py RESULTS.json OUT.png

Three panels from the JSON that fairness.sh writes (docs/fairness.json):
  1. the latency probe's round-trip percentiles (p50, p99, p99.9) for each
     run (idle, load without congestion control, load with it), grouped
     bars on a log scale;
  2. each job's all-reduce throughput per run, with Jain's fairness index
     between the two jobs written above each pair;
  3. the probe's round-trip distribution as a complementary CDF (log-log),
     from the quantiles stored in the JSON.
Needs matplotlib only (Agg backend, no display).
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"idle": "#7f7f7f", "no_cc": "#d62728", "cc": "#1f77b4"}
NAMES = {
    "idle": "idle (probe alone)",
    "no_cc": "load, no CC",
    "cc": "load, DCTCP CC",
}
PCTS = [("p50", "p50"), ("p99", "p99"), ("p999", "p99.9")]


def label(run):
    return NAMES.get(run["name"], run["name"])


def fmt_us(v):
    if v >= 1000:
        return f"{v / 1000:.1f} ms"
    return f"{v:.0f} µs"


def latency_panel(ax, runs, probe):
    width = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        lat = run.get("latency_us") or {}
        vals = [lat.get(k) for k, _ in PCTS]
        xs = [g + (i - (len(runs) - 1) / 2) * width for g in range(len(PCTS))]
        pairs = [(x, v) for x, v in zip(xs, vals) if v is not None]
        if not pairs:
            continue
        bars = ax.bar(
            [x for x, _ in pairs],
            [v for _, v in pairs],
            width * 0.95,
            label=label(run),
            color=COLORS.get(run["name"]),
        )
        for b, (_, v) in zip(bars, pairs):
            ax.annotate(
                fmt_us(v),
                (b.get_x() + b.get_width() / 2, v),
                ha="center",
                va="bottom",
                fontsize=7,
                rotation=90,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_yscale("log")
    ax.set_xticks(range(len(PCTS)))
    ax.set_xticklabels([name for _, name in PCTS])
    ax.set_ylabel("round trip (µs, log scale)")
    ax.set_title(f"latency probe ({probe}, fair-w0 → fair-h0)")
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * 8)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", which="both", alpha=0.3)


def throughput_panel(ax, runs, rate_mbit):
    loaded = [r for r in runs if r.get("jobs")]
    width = 0.35
    for ji, job_id in enumerate([1, 2]):
        xs, ys = [], []
        for ri, run in enumerate(loaded):
            job = next((j for j in run["jobs"] if j["id"] == job_id), None)
            if job and job.get("gbit_per_s") is not None:
                xs.append(ri + (ji - 0.5) * width)
                ys.append(job["gbit_per_s"])
        bars = ax.bar(
            xs,
            ys,
            width * 0.95,
            label=f"job {job_id} ({'fair-w0+w1' if job_id == 1 else 'fair-w2+w3'})",
            color=["#2ca02c", "#9467bd"][ji],
        )
        for b, v in zip(bars, ys):
            ax.annotate(
                f"{v:.3f}",
                (b.get_x() + b.get_width() / 2, v),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 2),
                textcoords="offset points",
            )
    top = 0.0
    for run in loaded:
        for j in run["jobs"]:
            top = max(top, j.get("gbit_per_s") or 0.0)
    if rate_mbit:
        line = rate_mbit / 1000 * 1448 / 1512
        ax.axhline(line, color="k", ls="--", lw=0.8)
        ax.annotate(
            "shaper's goodput limit",
            (len(loaded) - 0.5, line),
            ha="right",
            va="bottom",
            fontsize=7,
        )
        top = max(top, line)
    for ri, run in enumerate(loaded):
        if run.get("jain") is not None:
            ax.annotate(
                f"Jain {run['jain']:.3f}",
                (ri, top * 1.12),
                ha="center",
                fontsize=9,
                fontweight="bold",
            )
    ax.set_ylim(0, top * 1.45 if top > 0 else 1)
    ax.set_xticks(range(len(loaded)))
    ax.set_xticklabels([label(r) for r in loaded])
    ax.set_ylabel("all-reduce throughput per rank (Gbit/s)")
    ax.set_title("aggregation jobs")
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax.grid(axis="y", alpha=0.3)


def ccdf_panel(ax, runs):
    for run in runs:
        cdf = run.get("cdf") or {}
        qs, rtts = cdf.get("q") or [], cdf.get("rtt_us") or []
        pts = [(r, 1 - q / 100) for q, r in zip(qs, rtts) if q < 100 and r > 0]
        if not pts:
            continue
        ax.plot(
            [r for r, _ in pts],
            [p for _, p in pts],
            label=label(run),
            color=COLORS.get(run["name"]),
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("round trip (µs)")
    ax.set_ylabel("fraction of messages slower")
    ax.set_title("probe round-trip tail (CCDF)")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8)


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        data = json.load(f)
    # One entry per kind of run: the median over repeats when there are any.
    runs = data.get("summary") or data["runs"]
    setup = data.get("setup", {})
    bn = setup.get("bottleneck", {})
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    latency_panel(axes[0], runs, setup.get("probe", {}).get("tool", "sockperf"))
    throughput_panel(axes[1], runs, bn.get("rate_mbit"))
    ccdf_panel(axes[2], runs)
    fig.suptitle(
        f"Two all-reduce jobs and a latency probe sharing fair-w0's egress queue: "
        f"{bn.get('rate_mbit', '?')} Mbit/s, CE marks at "
        f"{bn.get('mark_min_bytes', '?')}–{bn.get('mark_max_bytes', '?')} B "
        f"({bn.get('marker', '?')}), {setup.get('seconds_per_run', '?')} s per run"
        + (
            f", median of {setup['repeats']} repeats"
            if (setup.get("repeats") or 1) > 1
            else ""
        ),
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
