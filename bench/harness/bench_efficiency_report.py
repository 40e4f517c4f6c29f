#!/usr/bin/env python3
"""bench_efficiency_report.py: turn `scripts/bench efficiency`'s runs into
its table (markdown), its JSON (every measurement plus the goals' ratios)
and its PNG (time per all-reduce and CPU-seconds per GiB, per setting).

A measurement is K all-reduces of one tensor by every worker. Its time is
the slowest rank's, per all-reduce; its CPU is the whole machine's busy CPU
time over the all-reduces (/proc/stat), per all-reduce, and per GiB of
float32 gradient reduced (a bfloat16 run reduces the same elements).

Goals (issue "Per-byte efficiency"), each taken within one run:
  * unlimited links: switch float32 / OpenMPI with TSO, time, <= 1.0
  * 1 Gbit/s links: switch float32 / line-rate bound, <= 1.10 (MTU 9000)
  * switch bfloat16 time / float32 time <= 0.55
  * CPU-seconds per GiB: switch float32 / OpenMPI with TSO <= 0.67
"""

import argparse
import json
import math
import sys
from pathlib import Path

GOALS = {
    "switch_over_openmpi_tso_unlimited": 1.0,
    "switch_over_line_rate_1gbit": 1.10,
    "bf16_over_f32_time": 0.55,
    "cpu_per_gib_switch_over_openmpi_tso": 0.67,
}
# Ethernet + IPv4 + UDP + the aggregation header, per frame.
FRAME_HEADER_BYTES = 14 + 20 + 8 + 22
ELEMENT_BYTES = {"f32": 4, "bf16": 2, "f16": 2}
LINE_RATE_BPS = 1e9
GIB = float(1 << 30)


def load_switch(d: Path, repeats: int) -> dict:
    ranks = [json.loads(p.read_text()) for p in sorted(d.glob("rank*.json"))]
    if not ranks:
        raise SystemExit(f"no rank reports in {d}")
    if not all(r.get("machine_busy_cpu_s") for r in ranks):
        raise SystemExit(f"{d}: a rank report lacks machine_busy_cpu_s (worker --machine-cpu)")
    start = min(r["machine_busy_cpu_s"][0] for r in ranks)
    end = max(r["machine_busy_cpu_s"][1] for r in ranks)
    own = [r.get("process_cpu_s") for r in ranks]
    return {
        "time_s": max(r["seconds"] for r in ranks) / repeats,
        "cpu_s": (end - start) / repeats,
        # The worker processes' own CPU (each over its own timed all-reduces).
        "workers_cpu_s": (sum(o[1] - o[0] for o in own) / repeats) if all(own) else None,
        "elems_per_chunk": ranks[0]["elems_per_chunk"],
        "transport_used": ranks[0].get("transport"),
        "chunks_resent": sum(r["stats"].get("chunks_resent", 0) for r in ranks),
    }


def load_peer(d: Path) -> dict:
    p = json.loads((d / "peer.json").read_text())
    k = p["iterations"]
    return {
        "time_s": p["mean_s"],
        "median_s": p["median_s"],
        "best_s": p["best_s"],
        "cpu_s": p["machine_busy_cpu_s"] / k,
        "workers_cpu_s": p["workers_cpu_s"] / k if p.get("workers_cpu_s") is not None else None,
        "verified": p["verified"],
    }


def line_rate_bound_s(elements: int, dtype: str, elems_per_chunk: int) -> float:
    """Seconds for the bytes one link carries one way (frames as tc counts
    them, without FCS, preamble and gap) at 1 Gbit/s."""
    chunks = math.ceil(elements / elems_per_chunk)
    return (chunks * FRAME_HEADER_BYTES + elements * ELEMENT_BYTES[dtype]) * 8 / LINE_RATE_BPS


def label(r: dict) -> str:
    if r["method"] == "switch":
        t = r["transport_used"] or r["transport"]
        return f"switch {r['dtype']} ({t})"
    name = {"openmpi_tso": "OpenMPI, TSO", "gloo_tso": "gloo, TSO"}[r["method"]]
    return name if r["dtype"] == "f32" else f"{name}, {r['dtype']} (compress hook)"


def ratio(a, b):
    return a / b if a is not None and b else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, type=Path)
    ap.add_argument("--stamp", required=True)
    ap.add_argument("--mib", required=True, type=int)
    ap.add_argument("--repeats", required=True, type=int)
    ap.add_argument("--workers", required=True, type=int)
    ap.add_argument("--json", required=True, type=Path)
    ap.add_argument("--png", required=True, type=Path)
    ap.add_argument("--table", required=True, type=Path)
    a = ap.parse_args()
    elements = a.mib * 1024 * 1024 // 4
    gib = elements * 4 / GIB

    runs = []
    for line in a.runs.read_text().splitlines():
        r = json.loads(line)
        d = Path(r.pop("dir"))
        r.update(load_switch(d, a.repeats) if r["method"] == "switch" else load_peer(d))
        r["cpu_s_per_gib"] = r["cpu_s"] / gib
        r["workers_cpu_s_per_gib"] = r["workers_cpu_s"] / gib if r.get("workers_cpu_s") is not None else None
        r["label"] = label(r)
        runs.append(r)

    settings = []
    for r in runs:
        if (r["mtu"], r["link"]) not in settings:
            settings.append((r["mtu"], r["link"]))

    def find(mtu, link, method, dtype="f32"):
        return [r for r in runs if (r["mtu"], r["link"], r["method"], r["dtype"]) == (mtu, link, method, dtype)]

    ratios = []
    for mtu, link in settings:
        f32 = find(mtu, link, "switch")
        best = min(f32, key=lambda r: r["time_s"]) if f32 else None
        mpi = next(iter(find(mtu, link, "openmpi_tso")), None)
        gloo = next(iter(find(mtu, link, "gloo_tso")), None)
        row = {"mtu": mtu, "link": link, "switch_f32": best and best["label"]}
        if best:
            row["switch_over_openmpi_tso_time"] = ratio(best["time_s"], mpi and mpi["time_s"])
            row["switch_over_gloo_time"] = ratio(best["time_s"], gloo and gloo["time_s"])
            row["cpu_per_gib_switch_over_openmpi_tso"] = ratio(
                best["cpu_s_per_gib"], mpi and mpi["cpu_s_per_gib"])
            row["cpu_per_gib_switch_over_gloo"] = ratio(best["cpu_s_per_gib"], gloo and gloo["cpu_s_per_gib"])
            row["workers_cpu_per_gib_switch_over_gloo"] = ratio(
                best.get("workers_cpu_s_per_gib"), gloo and gloo.get("workers_cpu_s_per_gib"))
            if link == "1gbit":
                bound = line_rate_bound_s(elements, "f32", best["elems_per_chunk"])
                row["line_rate_bound_s"] = bound
                row["switch_over_line_rate"] = best["time_s"] / bound
        half_gloo = next(iter(find(mtu, link, "gloo_tso", "bf16")), None)
        half_sw = next(iter(find(mtu, link, "switch", "bf16")), None)
        if half_gloo and half_sw:
            # Like for like: bf16 through the switch against gloo with
            # PyTorch's bf16 compression.
            row["bf16_switch_over_gloo_bf16_time"] = half_sw["time_s"] / half_gloo["time_s"]
            row["bf16_cpu_per_gib_switch_over_gloo_bf16"] = ratio(
                half_sw["cpu_s_per_gib"], half_gloo["cpu_s_per_gib"])
        for dt in ("bf16", "f16"):
            half = next(iter(find(mtu, link, "switch", dt)), None)
            same = next((r for r in f32 if r["transport"] == (half or {}).get("transport")), None)
            if half and same:
                row[f"{dt}_over_f32_time"] = half["time_s"] / same["time_s"]
                row[f"{dt}_over_f32_cpu"] = half["cpu_s"] / same["cpu_s"]
                if link == "1gbit":
                    b = line_rate_bound_s(elements, dt, half["elems_per_chunk"])
                    row[f"{dt}_over_its_line_rate"] = half["time_s"] / b
        ratios.append(row)

    top = max(m for m, _ in settings)

    def pick(link, key):
        row = next((r for r in ratios if r["mtu"] == top and r["link"] == link), {})
        return row.get(key)

    headline = {
        "mtu": top,
        "switch_over_openmpi_tso_unlimited": pick("unlimited", "switch_over_openmpi_tso_time"),
        "switch_over_line_rate_1gbit": pick("1gbit", "switch_over_line_rate"),
        "bf16_over_f32_time": pick("1gbit", "bf16_over_f32_time"),
        "bf16_over_f32_time_unlimited": pick("unlimited", "bf16_over_f32_time"),
        "switch_over_gloo_1gbit": pick("1gbit", "switch_over_gloo_time"),
        "switch_over_gloo_unlimited": pick("unlimited", "switch_over_gloo_time"),
        "bf16_switch_over_gloo_bf16_1gbit": pick("1gbit", "bf16_switch_over_gloo_bf16_time"),
        "bf16_switch_over_gloo_bf16_unlimited": pick("unlimited", "bf16_switch_over_gloo_bf16_time"),
        "cpu_per_gib_switch_over_openmpi_tso": pick("unlimited", "cpu_per_gib_switch_over_openmpi_tso"),
        "cpu_per_gib_switch_over_openmpi_tso_1gbit": pick("1gbit", "cpu_per_gib_switch_over_openmpi_tso"),
    }
    met = {k: (headline[k] is not None and headline[k] <= g) for k, g in GOALS.items()}

    out = {
        "stamp": a.stamp,
        "setup": {"workers": a.workers, "mib": a.mib, "elements": elements, "repeats": a.repeats,
                  "time": "slowest rank, per all-reduce (mean of K in one run)",
                  "cpu": "whole machine busy CPU (/proc/stat, bench/harness/benchkit.py's definition) over the all-reduces, per all-reduce",
                  "workers_cpu": "the worker processes' own CPU (user + system, summed over ranks) over the same all-reduces: what a training host pays when the switch is another box; on veth a sender's transmit runs the receiver's softirq in the sender's context, so this also holds part of the switch's and the peers' receive work",
                  "cpu_s_per_gib": "per GiB of float32 gradient (elements x 4 bytes)"},
        "runs": runs,
        "ratios": ratios,
        "headline": headline,
        "goals": GOALS,
        "goals_met": met,
    }
    a.json.write_text(json.dumps(out, indent=1) + "\n")

    def f(x, d=3):
        return "-" if x is None else f"{x:.{d}f}"

    lines = ["| MTU | link | method | s per all-reduce | CPU-s per all-reduce | CPU-s per GiB "
             "| workers' CPU-s per GiB | chunks resent |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in runs:
        lines.append(f"| {r['mtu']} | {r['link']} | {r['label']} | {f(r['time_s'])} | {f(r['cpu_s'], 2)} "
                     f"| {f(r['cpu_s_per_gib'], 2)} | {f(r.get('workers_cpu_s_per_gib'), 2)} "
                     f"| {r.get('chunks_resent', '')} |")
    lines += ["", "| MTU | link | switch/gloo time | bf16 switch/gloo-bf16 time | switch/OpenMPI-TSO time "
              "| switch/line rate | bf16/f32 time | CPU/GiB switch/OpenMPI-TSO | CPU/GiB switch/gloo "
              "| workers' CPU/GiB switch/gloo |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ratios:
        lines.append(f"| {r['mtu']} | {r['link']} | {f(r.get('switch_over_gloo_time'), 2)} "
                     f"| {f(r.get('bf16_switch_over_gloo_bf16_time'), 2)} "
                     f"| {f(r.get('switch_over_openmpi_tso_time'), 2)} | {f(r.get('switch_over_line_rate'), 2)} "
                     f"| {f(r.get('bf16_over_f32_time'), 2)} | {f(r.get('cpu_per_gib_switch_over_openmpi_tso'), 2)} "
                     f"| {f(r.get('cpu_per_gib_switch_over_gloo'), 2)} "
                     f"| {f(r.get('workers_cpu_per_gib_switch_over_gloo'), 2)} |")
    lines.append("")
    lines.append(f"goals at MTU {top}:")
    for k, g in GOALS.items():
        v = headline[k]
        lines.append(f"  {k} = {f(v, 3)} (goal <= {g}): {'met' if met[k] else 'NOT met'}")
    a.table.write_text("\n".join(lines) + "\n")
    plot(runs, settings, a.png, a.stamp, a.mib)
    return 0


def plot(runs, settings, png: Path, stamp: str, mib: int) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG", file=sys.stderr)
        return
    labels = []
    for r in runs:
        if r["label"] not in labels:
            labels.append(r["label"])
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / max(1, len(labels))
    for ax, key, title in ((axes[0], "time_s", "seconds per all-reduce"),
                           (axes[1], "cpu_s_per_gib", "machine CPU-seconds per GiB reduced")):
        for i, lab in enumerate(labels):
            xs, ys = [], []
            for j, s in enumerate(settings):
                r = next((r for r in runs if (r["mtu"], r["link"]) == s and r["label"] == lab), None)
                if r:
                    xs.append(j + (i - (len(labels) - 1) / 2) * width)
                    ys.append(r[key])
            ax.bar(xs, ys, width, label=lab)
        ax.set_xticks(range(len(settings)), [f"MTU {m}\n{l}" for m, l in settings])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"4 workers, {mib} MiB float32 gradient; run {stamp} (lower is better)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
