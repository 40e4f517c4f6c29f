#!/usr/bin/env python3
"""bench_plot.py: draw the all-reduce comparison that scripts/bench.sh measured.

Usage: scripts/bench_plot.py BENCH_JSON OUT_PNG

Bars: the time of one all-reduce (seconds, lower is better) through the
switch and with OpenMPI's MPI_Allreduce (with the testbed's offloads, and
with transmit offload/TSO on), on unlimited links and on 1 Gbit/s links; the bar is the mean, the whiskers span best..worst of the separate
runs. A dashed line marks the line-rate bound on the 1 Gbit/s links.
Renders with matplotlib's Agg backend (no display needed).
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        bench = json.load(f)

    links = bench["links"]
    labels = {"unlimited": "unlimited veth", "1gbit": "1 Gbit/s links"}
    methods = [("switch", "switch (AF_XDP)", "#1f77b4"),
               ("openmpi", "OpenMPI MPI_Allreduce (TCP, testbed offloads)", "#ff7f0e"),
               ("openmpi_tso", "OpenMPI, worker tx offload on (TSO)", "#ffbb78")]
    methods = [m for m in methods if all(m[0] in link for link in links)]
    width = 0.8 / len(methods)

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for j, (key, name, color) in enumerate(methods):
        xs, means, lo, hi = [], [], [], []
        for i, link in enumerate(links):
            m = link[key]
            xs.append(i + (j - (len(methods) - 1) / 2) * width)
            means.append(m["mean_s"])
            lo.append(max(0.0, m["mean_s"] - m["best_s"]))
            hi.append(max(0.0, m["worst_s"] - m["mean_s"]))
        bars = ax.bar(xs, means, width, color=color, label=name,
                      yerr=[lo, hi], capsize=4, ecolor="#333333")
        for b, v, top in zip(bars, means, hi):
            ax.annotate(f"{v:.3f} s", (b.get_x() + b.get_width() / 2, v + top),
                        xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8)

    lr = bench["line_rate_1gbit"]
    for i, link in enumerate(links):
        if link["link"] == "1gbit":
            ax.hlines(lr["bound_l2_s"], i - 0.45, i + 0.45, colors="#2ca02c",
                      linestyles="dashed",
                      label=f"line-rate bound at 1 Gbit/s ({lr['bound_l2_s']:.3f} s)")

    ax.set_xticks(range(len(links)))
    ax.set_xticklabels([labels.get(link["link"], link["link"]) for link in links])
    ax.set_ylabel("seconds per all-reduce (lower is better)")
    s = bench["setup"]
    m = bench["machine"]
    h = bench["headline"]
    ax.set_title(
        f"{s['workers']} workers, {s['mib']} MiB float32 all-reduce, {s['repeats']} repeats\n"
        f"switch/OpenMPI: {h['switch_over_openmpi_unlimited']:.2f} unlimited, "
        f"{h['switch_over_openmpi_1gbit']:.2f} at 1 Gbit/s; "
        f"switch/line rate {h['switch_over_line_rate_1gbit']:.2f}",
        fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
    ax.grid(axis="y", alpha=0.3)
    fig.text(0.99, 0.01,
             f"{m['nproc']} cores {m['cpu_model']}, kernel {m['kernel']}, {bench['stamp']}",
             ha="right", va="bottom", fontsize=7, color="#555555")
    fig.tight_layout()
    fig.savefig(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
