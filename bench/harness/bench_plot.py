#!/usr/bin/env python3
"""bench_plot.py: draw the all-reduce comparison that scripts/bench allreduce measured.

Usage: bench/harness/bench_plot.py BENCH_JSON OUT_PNG

Bars: the time of one all-reduce (seconds, lower is better) through the
switch and with OpenMPI's MPI_Allreduce (with the testbed's offloads, and
with transmit offload/TSO on), on unlimited links and on 1 Gbit/s links; the bar is the mean, the whiskers span best..worst of the separate
runs. A dashed line marks the line-rate bound on the 1 Gbit/s links.
When the JSON has the "threads" section, the switch's all-reduce on
unlimited links with each dataplane thread count follows as more bars.
When the JSON has packet rates ("rates", from the allreduce scenario's rate section), a
second panel shows them as bars (packets/s, median of the repeats): XDP_DROP,
AF_XDP echo, and aggregation DATA frames/s for 2, 4, 8 ranks with 1 and 2
dataplane threads; a --rates-only JSON gets that panel alone.
Renders with matplotlib's Agg backend (no display needed).
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def footer(fig, bench):
    m = bench["machine"]
    fig.text(0.99, 0.01,
             f"{m['nproc']} cores {m['cpu_model']}, kernel {m['kernel']}, {bench['stamp']}",
             ha="right", va="bottom", fontsize=7, color="#555555")


def rates_panel(ax, rates):
    """Packet rates: baselines and aggregation, packets/s (median)."""
    bars = []
    if rates.get("xdp_drop"):
        d = rates["xdp_drop"]
        bars.append(("XDP_DROP\n1512 B", d["pps"], "#7f7f7f", d.get("pps_best")))
    bars.append(("echo\n1512 B", rates["echo"]["pps"], "#2ca02c", rates["echo"].get("pps_best")))
    if rates.get("echo_64"):
        bars.append(("echo\n64 B", rates["echo_64"]["pps"], "#98df8a",
                     rates["echo_64"].get("pps_best")))
    for a in sorted(rates["aggregate"], key=lambda a: (a["threads"], a["ranks"])):
        color = "#1f77b4" if a["threads"] == 1 else "#aec7e8"
        bars.append((f"agg {a['ranks']}r\n{a['threads']} thr", a["data_pps"], color,
                     a.get("data_pps_best")))
    xs = range(len(bars))
    rects = ax.bar(xs, [b[1] / 1e3 for b in bars], 0.7, color=[b[2] for b in bars])
    for r, b in zip(rects, bars):
        ax.annotate(f"{b[1] / 1e3:.0f}", (r.get_x() + r.get_width() / 2, r.get_height()),
                    xytext=(0, 2), textcoords="offset points", ha="center",
                    va="bottom", fontsize=7)
    best = [(x, b[3] / 1e3) for x, b in zip(xs, bars) if b[3] is not None]
    if best:
        ax.scatter([p[0] for p in best], [p[1] for p in best], marker="_", s=300,
                   color="black", zorder=3, label="best run")
        ax.legend(fontsize=8, loc="upper center")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([b[0] for b in bars], fontsize=7)
    ax.set_ylabel("thousand packets/s (higher is better)")
    h = rates["headline"]
    ed = h.get("echo_over_xdp_drop")

    def ratios(key):
        d = h.get(key) or {}
        return " / ".join(f"{d[k]:.2f}" if d.get(k) is not None else "-"
                          for k in sorted(d, key=int))

    ax.set_title(
        "packet rates, 1 generator core (AF_PACKET) + 1 switch core; bars: median of runs\n"
        f"aggregation/echo, 1 thread, 2/4/8 ranks: {ratios('agg_over_echo_pps')} (median), "
        f"{ratios('agg_over_echo_pps_best')} (best run)",
        fontsize=9)
    notes = []
    if ed is not None:
        notes.append(f"echo / XDP_DROP: {ed:.2f}")
    per_cpu = (h.get("agg_over_echo_per_switchd_cpu_s") or {}).get("4")
    if per_cpu is not None:
        notes.append(f"aggregation/echo per switchd CPU-s (4 ranks): {per_cpu:.2f}")
    if notes:
        ax.text(0.99, 0.97, "\n".join(notes), transform=ax.transAxes,
                ha="right", va="top", fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        bench = json.load(f)

    rates = bench.get("rates")
    if "links" not in bench:
        fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
        rates_panel(ax, rates)
        footer(fig, bench)
        fig.tight_layout()
        fig.savefig(argv[2])
        return 0
    links = bench["links"]
    labels = {"unlimited": "unlimited veth", "1gbit": "1 Gbit/s links"}
    methods = [("switch", "switch (AF_XDP)", "#1f77b4"),
               ("gloo", "gloo (PyTorch, TCP with TSO)", "#9467bd"),
               ("openmpi", "OpenMPI MPI_Allreduce (TCP, testbed offloads)", "#ff7f0e"),
               ("openmpi_tso", "OpenMPI, worker tx offload on (TSO)", "#ffbb78")]
    methods = [m for m in methods if all(link.get(m[0]) for link in links)]
    width = 0.8 / len(methods)

    if rates:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 4.8), dpi=120,
                                      gridspec_kw={"width_ratios": [1, 1.2]})
        rates_panel(ax2, rates)
    else:
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

    # The threads section: the switch alone, unlimited links, by thread count.
    runs = (bench.get("threads") or {}).get("runs") or []
    for k, r in enumerate(runs):
        x = len(links) + k
        lo = max(0.0, r["mean_s"] - r["best_s"])
        hi = max(0.0, r["worst_s"] - r["mean_s"])
        ax.bar([x], [r["mean_s"]], 0.8 / len(methods), color="#1f77b4", alpha=0.6,
               yerr=[[lo], [hi]], capsize=4, ecolor="#333333")
        ax.annotate(f"{r['mean_s']:.3f} s", (x, r["mean_s"] + hi), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)

    lr = bench["line_rate_1gbit"]
    for i, link in enumerate(links):
        if link["link"] == "1gbit":
            ax.hlines(lr["bound_l2_s"], i - 0.45, i + 0.45, colors="#2ca02c",
                      linestyles="dashed",
                      label=f"line-rate bound at 1 Gbit/s ({lr['bound_l2_s']:.3f} s)")

    ax.set_xticks(range(len(links) + len(runs)))
    ax.set_xticklabels([labels.get(link["link"], link["link"]) for link in links]
                       + [f"switch, unlimited\n{r['threads']} thread(s)" for r in runs],
                       fontsize=8)
    ax.set_ylabel("seconds per all-reduce (lower is better)")
    s = bench["setup"]
    h = bench["headline"]
    ax.set_title(
        f"{s['workers']} workers, {s['mib']} MiB float32 all-reduce, {s['repeats']} repeats, "
        f"MTU {s.get('mtu', 1500)}\n"
        + (f"switch/gloo: {h['switch_over_gloo_unlimited']:.2f} unlimited, "
           f"{h['switch_over_gloo_1gbit']:.2f} at 1 Gbit/s; "
           if h.get("switch_over_gloo_1gbit") is not None else "")
        + f"switch/OpenMPI: {h['switch_over_openmpi_unlimited']:.2f} unlimited, "
        f"{h['switch_over_openmpi_1gbit']:.2f} at 1 Gbit/s; "
        f"switch/line rate {h['switch_over_line_rate_1gbit']:.2f}",
        fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
    ax.grid(axis="y", alpha=0.3)
    footer(fig, bench)
    fig.tight_layout()
    fig.savefig(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
