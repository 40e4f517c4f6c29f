#!/usr/bin/env python3
"""The report of `scripts/bench fsdp`: medians, ratios, checks, table, JSON, PNG.

Reads RUN/LINK-MODE-COMM/rank*.json (bench/fsdp_bench.py; LINK unlimited or
1gbit, MODE collectives or fsdp, COMM gloo or switch) and RUN/LINK-MODE-COMM/
{before,after}.jsonl (CPU and shaper snapshots). Every rank's JSON already
holds the slowest rank's time of each call or step, so any rank's file
gives the configuration's times; rank 0's is used and the others must agree.

Statistic: the median of the timed calls (collectives) or steps (FSDP2).
Ratios switch / gloo per link and measurement; goals at 1 Gbit/s:
reduce-scatter <= 0.5, FSDP2 step <= 0.8. The bytes-on-the-wire bound:
reduce-scatter then all-gather of S bytes at n ranks moves, per worker,
S (n-1)/n + S/n = S each way through the switch (the reduce-scatter's own
shard stays home, docs/PROTOCOL.md "Collective kinds") against 2 S (n-1)/n
each way for a bandwidth-optimal ring (S against 1.5 S at n = 4).

Checks (exit status 3 when one fails, after writing everything): every rank
of an FSDP2 run ended with the same parameter digest; the switch run's final
loss is within 1e-3 (relative) of gloo's: both sum the same gradients, the
switch in rank order and gloo in its own order, so the float32 rounding of
the sums differs and the runs drift apart by rounding only.
"""
import argparse, glob, json, os, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import busy_seconds  # noqa: E402

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("run")
p.add_argument("--json", required=True)
p.add_argument("--table", required=True)
p.add_argument("--png", required=True)
p.add_argument("--stamp", required=True)
p.add_argument("--mib", type=int, required=True)
p.add_argument("--mtu", type=int, required=True)
p.add_argument("--repeats", type=int, required=True)
p.add_argument("--warmup", type=int, required=True)
p.add_argument("--steps", type=int, required=True)
p.add_argument("--hidden", type=int, required=True)
p.add_argument("--tbf", required=True)
p.add_argument("--bench-seconds", type=int, required=True)
a = p.parse_args()

LINKS = ("unlimited", "1gbit")
GOALS = {"reduce_scatter": 0.5, "fsdp_step": 0.8}
failures = []


def load(link, mode, comm):
    files = sorted(glob.glob(os.path.join(a.run, f"{link}-{mode}-{comm}", "rank*.json")))
    ranks = [json.load(open(f)) for f in files]
    if not ranks:
        failures.append(f"{link} {mode} {comm}: no rank JSON")
    return ranks


def cpu_busy_seconds(link, mode, comm):
    """Whole-machine busy CPU-seconds over the configuration (benchkit's
    definition)."""
    d = os.path.join(a.run, f"{link}-{mode}-{comm}")
    try:
        snaps = [json.loads(open(os.path.join(d, f)).readline()) for f in ("before.jsonl", "after.jsonl")]
    except (OSError, ValueError):
        return None
    return busy_seconds(snaps[0]["stat"], snaps[1]["stat"])


results = {}
for link in LINKS:
    row = results.setdefault(link, {})
    for comm in ("gloo", "switch"):
        ranks = load(link, "collectives", comm)
        if ranks:
            for op in ("reduce_scatter", "all_gather"):
                s = ranks[0][op]["seconds"]
                row.setdefault(op, {})[comm] = dict(median_s=statistics.median(s), best_s=min(s), runs_s=s)
            row.setdefault("collectives_cpu_s", {})[comm] = cpu_busy_seconds(link, "collectives", comm)
        ranks = load(link, "fsdp", comm)
        if ranks:
            digests = {r["digest"] for r in ranks}
            if len(digests) != 1:
                failures.append(f"{link} fsdp {comm}: ranks ended with {len(digests)} different parameter digests")
            s = ranks[0]["step_seconds"]
            row.setdefault("fsdp_step", {})[comm] = dict(
                median_s=statistics.median(s), best_s=min(s), runs_s=s, loss=ranks[0]["loss"],
                params=ranks[0]["params"], digest=ranks[0]["digest"],
                cpu_s=cpu_busy_seconds(link, "fsdp", comm))
    for key in ("reduce_scatter", "all_gather", "fsdp_step"):
        m = row.get(key, {})
        if "gloo" in m and "switch" in m:
            m["switch_over_gloo"] = m["switch"]["median_s"] / m["gloo"]["median_s"]
    f = row.get("fsdp_step", {})
    if "gloo" in f and "switch" in f:
        rel = abs(f["switch"]["loss"] - f["gloo"]["loss"]) / abs(f["gloo"]["loss"])
        f["loss_rel_diff"] = rel
        if rel > 1e-3:
            failures.append(f"{link}: FSDP2 loss through the switch {f['switch']['loss']:.6f} vs gloo {f['gloo']['loss']:.6f}")

n = 4
# Up: the reduce-scatter's other shards, then the own shard for the
# all-gather; down: the own shard's sum, then the other shards.
bound = {"switch_busier_direction_bytes_over_S": (n - 1) / n + 1 / n, "ring_each_direction_bytes_over_S": 2 * (n - 1) / n}
lim = results.get("1gbit", {})
headline = {
    "reduce_scatter_switch_over_gloo_1gbit": lim.get("reduce_scatter", {}).get("switch_over_gloo"),
    "all_gather_switch_over_gloo_1gbit": lim.get("all_gather", {}).get("switch_over_gloo"),
    "fsdp_step_switch_over_gloo_1gbit": lim.get("fsdp_step", {}).get("switch_over_gloo"),
    "goals_1gbit": GOALS,
}
out = dict(stamp=a.stamp, setup=dict(workers=n, mib=a.mib, mtu=a.mtu, repeats=a.repeats, warmup=a.warmup, steps=a.steps,
                                     hidden=a.hidden, shaping=a.tbf, statistic="median of the slowest rank's times",
                                     bench_seconds=a.bench_seconds,
                                     cpu_definition="whole machine: user+nice+system+irq+softirq+steal from /proc/stat"),
           wire_bound=bound, results=results, headline=headline, failures=failures)
with open(a.json, "w") as fh:
    json.dump(out, fh, indent=1)


def f3(x):
    return "-" if x is None else f"{x:.3f}"


lines = ["| link | measurement | gloo median s | switch median s | switch / gloo | goal (1 Gbit/s) |",
         "|---|---|---:|---:|---:|---|"]
names = {"reduce_scatter": f"reduce-scatter {a.mib} MiB", "all_gather": f"all-gather to {a.mib} MiB",
         "fsdp_step": f"FSDP2 step ({a.hidden}-wide MLP)"}
for link in LINKS:
    for key, name in names.items():
        m = results.get(link, {}).get(key, {})
        g, s = m.get("gloo", {}).get("median_s"), m.get("switch", {}).get("median_s")
        goal = GOALS.get(key)
        met = "" if link != "1gbit" or goal is None or m.get("switch_over_gloo") is None else (
            f"<= {goal}: {'met' if m['switch_over_gloo'] <= goal else 'NOT met'}")
        lines.append(f"| {link} | {name} | {f3(g)} | {f3(s)} | {f3(m.get('switch_over_gloo'))} | {met} |")
lines.append("")
lines.append(f"MTU {a.mtu}; shaping at 1 Gbit/s: {a.tbf}")
lines.append(f"bytes on the busier direction per worker, reduce-scatter + all-gather of S at n = {n}: "
             f"switch {bound['switch_busier_direction_bytes_over_S']:.2f} S, bandwidth-optimal ring "
             f"{bound['ring_each_direction_bytes_over_S']:.2f} S")
for link in LINKS:
    f = results.get(link, {}).get("fsdp_step", {})
    if "loss_rel_diff" in f:
        lines.append(f"{link}: FSDP2 final loss gloo {f['gloo']['loss']:.6f}, switch {f['switch']['loss']:.6f} "
                     f"(relative difference {f['loss_rel_diff']:.2e}); {f['switch']['params'] / 1e6:.2f} M parameters")
lines += [f"CHECK FAILED: {x}" for x in failures]
with open(a.table, "w") as fh:
    fh.write("\n".join(lines) + "\n")

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, (key, name) in zip(axes, names.items()):
        xs, gl, sw = [], [], []
        for link in LINKS:
            m = results.get(link, {}).get(key, {})
            xs.append(link)
            gl.append(m.get("gloo", {}).get("median_s", 0))
            sw.append(m.get("switch", {}).get("median_s", 0))
        idx = range(len(xs))
        ax.bar([i - 0.2 for i in idx], gl, 0.4, label="gloo")
        ax.bar([i + 0.2 for i in idx], sw, 0.4, label="switch")
        ax.set_xticks(list(idx), xs)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("seconds (median)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
except Exception as e:  # the plot is optional; the JSON and table are the record
    print(f"bench_fsdp_report.py: no plot ({e})", file=sys.stderr)
sys.exit(3 if failures else 0)
