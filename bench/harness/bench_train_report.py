#!/usr/bin/env python3
"""bench_train_report.py: the JSON, table and plot of `scripts/bench train`.

Usage: bench/harness/bench_train_report.py RUN_DIR --json OUT.json --table OUT.md
           [--png OUT.png] --stamp STAMP --warmup W --steps N --batch B
           --hidden H --layers L --seed S [--links unlimited,1gbit]
           [--comms gloo,switch] [--tbf LINK="TBF ARGS"]... [--device cpu|cuda]
           [--stall-timeout S] [--bench-seconds T] [--measure-seconds T]

RUN_DIR holds one folder per configuration, LINK-COMM (LINK one of --links:
unlimited or a rate such as 1gbit, COMM one of --comms: gloo, switch,
switch-nofallback, hosts or switch-killed), each with rankI.json
(examples/train_ddp.py --out), rankI.time (GNU time: max RSS KiB, elapsed,
user, system seconds) and before.jsonl / after.jsonl (the train scenario's
snapshot: /proc/stat's cpu line, load average, tc -s -j counters of every
shaper); a switch-killed folder also killed.json (kill_s: when switchd was
killed, fallback_seen_s: when rank 0's log first showed the fallback
warning, Unix seconds or null; stall_timeout_s: the ranks'
AGGSWITCH_STALL_TIMEOUT; kill_after_step, poll_interval_s).

Per configuration: the first W step times of every rank are dropped; the
step time is the slowest rank's median over the N timed steps (rank 0's and
every rank's medians are kept beside it); samples/s = world x B / step
time. Ratios per link setting, each when both its configurations ran:
switch / gloo (goal at 1 Gbit/s <= 0.75, issue 24); hosts / gloo, the host
path against gloo's own all-reduce (goal at 1 Gbit/s <= 1.05); switch /
switch-nofallback, the cost of the fallback's agreement with nothing
failing (goal <= 1.02). A switch-killed run's step time is compared with
nothing; its kill to host path (fallback_seen_s - kill_s: from switchd's
SIGKILL to rank 0's log saying its first collective was done on the host
path, read every poll_interval_s) has the goal stall timeout + 1 s.

Sanity (exit status 3 when one fails, after writing everything): the switch
run's final loss within 2 % of the gloo run's on the same links (without a
switch run, the switch-nofallback or else the hosts run's); every rank of a
run ends with the same weights; all switch runs (same seed, the switch sums
in rank order) end with bit-identical weights, and every switch-nofallback
hosts and switch-killed run with the switch run's weights on the same
links; every run whose ranks report their path counters (train_ddp.py's
"path") ran as configured: switch and switch-nofallback entirely on the
switch (no fallback), with the fallback on and off, hosts entirely on the
hosts, switch-killed on the switch first, then every rank fell back exactly
once, never came back, and ran collectives on the hosts.

Worker threads (--worker-threads 1,2): switch and switch-nofallback ran
once per T (folders LINK-COMM-tT for T > 1), switch-killed at the first T;
every other figure above is of the first T's runs (the base T), the
bit-identity checks cover every T's. Per T and link setting: switch / gloo
step time and the CPU per step of the ranks (GNU time's user + system of
each rank's whole process, summed: start-up, the model's compute and the
all-reduces) and of switchd (its whole life in that configuration); the
T that ran is the ranks' path counters' "threads" (aggswitch's stats), "-"
where the package does not report it.

The plot (matplotlib, Agg) is skipped with a warning when matplotlib is
missing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import busy_fraction as cpu_busy, json_lines, quantile, shaper_counters, shaper_delta  # noqa: E402

COMMS = ["gloo", "switch", "switch-nofallback", "hosts", "switch-killed"]  # every configuration the train scenario runs
DEFAULT_COMMS = "gloo,switch"
SWITCH_BITS = ["switch", "switch-nofallback", "hosts", "switch-killed"]  # the switch's arithmetic: the same weights
GOAL_1GBIT = 0.75  # switch / gloo
GOAL_HOSTS_1GBIT = 1.05  # hosts / gloo
GOAL_AGREEMENT = 1.02  # switch / switch-nofallback
GOAL_KILL_OVER_STALL_S = 1.0  # switch-killed: kill to host path <= stall timeout + this
LOSS_TOLERANCE = 0.02  # relative
# Table, legend and colour of each configuration.
TABLE_LABEL = {"gloo": "gloo (DDP default)", "switch": "**switch**",
               "switch-nofallback": "switch, fallback off", "hosts": "hosts (host path over gloo)",
               "switch-killed": "switch, switchd killed mid-run"}
PLOT_LABEL = {"gloo": "gloo (DDP default all-reduce)", "switch": "switch (aggswitch.torch hook)",
              "switch-nofallback": "switch, AGGSWITCH_FALLBACK=off (no agreement)",
              "hosts": "hosts (AGGSWITCH_MODE=hosts, over gloo)",
              "switch-killed": "switch, switchd killed mid-run (then the host path)"}
COLORS = {"gloo": "#ff7f0e", "switch": "#1f77b4", "switch-nofallback": "#9467bd", "hosts": "#2ca02c",
          "switch-killed": "#d62728"}
ON_SWITCH = ("switch", "switch-nofallback")  # entirely on the switch, as configured
WITH_SWITCHD = ON_SWITCH + ("switch-killed",)  # the configurations switchd runs for (switch-killed: until the kill)
THREADED = ("switch", "switch-nofallback")  # run once per worker thread count (switch-killed: the first)


def config_dir(link, comm, threads):
    """A configuration's folder: LINK-COMM, with -tT for T > 1 (the train
    scenario's naming)."""
    return f"{link}-{comm}" + ("" if threads in (None, 1) else f"-t{threads}")


def thread_counts_of(comm, threads):
    """The worker thread counts COMM ran with: every one for THREADED, the
    first for switch-killed, None for gloo and hosts."""
    if comm in THREADED:
        return list(threads)
    return threads[:1] if comm == "switch-killed" else [None]


def link_bits_per_s(link):
    """'1gbit' -> 1e9, '500mbit' -> 5e8; None for 'unlimited'."""
    if link == "unlimited":
        return None
    return float(link[:-4]) * {"g": 1e9, "m": 1e6}[link[-4]]


def fallback_breakdown(k, timing, world, link):
    """Where a switch-killed run's kill-to-host-path time went, from rank
    0's last_fallback_timing (aggswitch's state stats): until the failing
    collective started (the ranks were computing; the rest of the measured
    time), on the switch (the stall timeout), the agreement, and the
    collective redone on the host path, beside what a ring of its bytes
    needs at the link's rate (None on unlimited links). None without a
    timing (an older aggswitch) or without a measured time."""
    if not timing or k.get("kill_to_host_path_s") is None:
        return None
    parts = timing["on_switch_s"] + timing["agreement_s"] + timing["host_collective_s"]
    rate = link_bits_per_s(link)
    ring = 2 * (world - 1) / world * timing["bytes"] * 8 / rate if rate else None
    return {"before_collective_s": max(0.0, k["kill_to_host_path_s"] - parts),
            "on_switch_s": timing["on_switch_s"], "agreement_s": timing["agreement_s"],
            "host_collective_s": timing["host_collective_s"], "host_collective_bytes": timing["bytes"],
            "host_collective_line_rate_s": ring}


def link_label(link):
    """'unlimited' -> 'unlimited links', '1gbit' -> '1 Gbit/s links', '500mbit' -> '500 Mbit/s links'."""
    if link == "unlimited":
        return "unlimited links"
    return f"{link[:-4]} {link[-4].upper()}bit/s links"


def shapers(before, after):
    """benchkit's shaper differences, or None for a configuration nothing
    shaped (no root qdisc in the after snapshot)."""
    if not any(any(v.values()) for v in shaper_counters(after).values()):
        return None
    return shaper_delta(before, after)


def load_config(run_dir, link, comm, warmup, threads=None, show_threads=False):
    d = os.path.join(run_dir, config_dir(link, comm, threads))
    ranks = []
    r = 0
    while os.path.exists(os.path.join(d, f"rank{r}.json")):
        with open(os.path.join(d, f"rank{r}.json")) as f:
            j = json.load(f)
        timed = j["step_times"][warmup:]
        if not timed:
            raise SystemExit(f"{d}/rank{r}.json: no step left after {warmup} warm-up steps")
        rss = wall = user = system = None
        try:
            with open(os.path.join(d, f"rank{r}.time")) as f:
                fields = f.read().split()
            rss, wall, user, system = int(fields[-4]), float(fields[-3]), float(fields[-2]), float(fields[-1])
        except (OSError, ValueError, IndexError):
            pass
        ranks.append({
            "rank": j["rank"], "median_s": statistics.median(timed), "mean_s": statistics.fmean(timed),
            "p25_s": quantile(timed, 0.25), "p75_s": quantile(timed, 0.75),
            "min_s": min(timed), "max_s": max(timed),
            "loss": j["loss"], "digest": j["digest"], "params": j["params"], "world": j["world"],
            "warmup_step_times_s": j["step_times"][:warmup], "timed_step_times_s": timed,
            "max_rss_kib": rss, "process_wall_s": wall, "process_user_s": user, "process_system_s": system,
            "path": j.get("path"),
        })
        r += 1
    if not ranks:
        raise SystemExit(f"{d}: no rank*.json")
    slowest = max(ranks, key=lambda x: x["median_s"])
    # Per step, the slowest rank's time: what the job as a whole paid.
    per_step_max = [max(x["timed_step_times_s"][k] for x in ranks)
                    for k in range(min(len(x["timed_step_times_s"]) for x in ranks))]
    before = json_lines(os.path.join(d, "before.jsonl"))
    after = json_lines(os.path.join(d, "after.jsonl"))
    world = ranks[0]["world"]
    switchd_cpu = None
    try:
        with open(os.path.join(d, "switchd-cpu-seconds")) as f:
            switchd_cpu = float(f.read())
    except (OSError, ValueError):
        pass
    ran = [(x["path"] or {}).get("threads") for x in ranks]
    steps = len(ranks[0]["warmup_step_times_s"]) + len(ranks[0]["timed_step_times_s"])
    ranks_cpu = (sum(x["process_user_s"] + x["process_system_s"] for x in ranks)
                 if all(x["process_user_s"] is not None for x in ranks) else None)
    c = {
        "link": link, "comm": comm,
        "name": comm + (f" T={threads}" if show_threads and threads is not None else ""),
        "threads": threads,
        # The T that carried the collectives (the smallest over the ranks),
        # where aggswitch reports it.
        "threads_ran": min(ran) if ran and all(t is not None for t in ran) else None,
        "step_s": slowest["median_s"],
        "step_rank": slowest["rank"],
        "step_p25_s": slowest["p25_s"], "step_p75_s": slowest["p75_s"],
        "rank0_median_s": ranks[0]["median_s"],
        "median_of_per_step_max_s": statistics.median(per_step_max),
        "mean_of_per_step_max_s": statistics.fmean(per_step_max),
        "per_step_max_s": per_step_max,
        "loss": ranks[0]["loss"],
        "digest": ranks[0]["digest"],
        "digests_equal_across_ranks": len({x["digest"] for x in ranks}) == 1,
        "ran_as_configured": ran_as_configured(comm, [x["path"] for x in ranks]),
        "path": ranks[0]["path"],
        "max_rss_mib_per_rank": (max(x["max_rss_kib"] for x in ranks) / 1024
                                 if all(x["max_rss_kib"] for x in ranks) else None),
        "wall_s": after[0]["t"] - before[0]["t"],
        "cpu_busy_fraction": cpu_busy(before[0]["stat"], after[0]["stat"]),
        "ranks_cpu_s": ranks_cpu,
        "switchd_cpu_s": switchd_cpu,
        # Per step run (warm-up included): the ranks' whole processes, and
        # switchd's whole life in this configuration.
        "ranks_cpu_s_per_step": ranks_cpu / steps if ranks_cpu is not None else None,
        "switchd_cpu_s_per_step": switchd_cpu / steps if switchd_cpu is not None else None,
        "loadavg": {"before": before[0]["loadavg"], "after": after[0]["loadavg"]},
        "shapers": shapers(before, after),
        "world": world, "params": ranks[0]["params"],
        "ranks": ranks,
    }
    if comm == "switch-killed":
        c["killed"] = load_killed(d)
        c["killed"]["breakdown"] = fallback_breakdown(
            c["killed"], (ranks[0].get("path") or {}).get("last_fallback_timing"), world, link)
    return c


def load_killed(d):
    """A switch-killed folder's killed.json (the train scenario's
    kill_switchd_mid_run) with kill_to_host_path_s (None when switchd was
    not killed or rank 0 never logged the fallback) and its goal."""
    path = os.path.join(d, "killed.json")
    try:
        with open(path) as fh:
            k = json.load(fh)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: {e}") from None
    kill, seen = k.get("kill_s"), k.get("fallback_seen_s")
    k["kill_to_host_path_s"] = seen - kill if kill is not None and seen is not None else None
    k["goal_s"] = k["stall_timeout_s"] + GOAL_KILL_OVER_STALL_S
    k["goal_met"] = k["kill_to_host_path_s"] is not None and k["kill_to_host_path_s"] <= k["goal_s"]
    return k


def ran_as_configured(comm, paths):
    """Whether every rank's path counters (train_ddp.py's "path": the
    state's mode, fallback and stats()) match COMM: switch and
    switch-nofallback all collectives on the switch with the fallback on
    resp. off and none moved to the hosts, hosts all on the hosts,
    switch-killed (fallback on) some on the switch, then exactly one
    fallback, no return (switchd stays dead) and some on the hosts. None
    for gloo, or when a rank reported no counters (an older train_ddp.py)."""
    if comm == "gloo" or any(p is None for p in paths):
        return None
    for p in paths:
        if comm == "switch-killed":
            if (p["mode"] != "switch" or not p["fallback"] or p["fallbacks"] != 1 or p["returns"]
                    or not p["host_collectives"] or not p["switch_collectives"]):
                return False
        elif comm in ON_SWITCH:
            if (p["mode"] != "switch" or p["fallback"] != (comm == "switch") or p["fallbacks"]
                    or p["host_collectives"] or not p["switch_collectives"]):
                return False
        elif p["mode"] != "hosts" or p["switch_collectives"] or not p["host_collectives"]:
            return False
    return True


def analyse(configs, links, comms, threads=(1,)):
    """Ratios, checks and headline of the loaded configurations (each
    with samples_per_s), for the links and comms that ran; everything but
    the per-T figures and the bit-identity checks is of the base T's runs
    (threads[0])."""
    base = threads[0]
    by = {(c["link"], c["comm"]): c for c in configs if c["threads"] in (None, base)}
    ratios, loss = {}, {}
    for link in links:
        r = ratios[link] = {}
        gl = by.get((link, "gloo"))
        sw = by.get((link, "switch"))
        if sw and gl:
            r.update({
                "step": sw["step_s"] / gl["step_s"],
                "rank0_median": sw["rank0_median_s"] / gl["rank0_median_s"],
                "per_step_max_median": sw["median_of_per_step_max_s"] / gl["median_of_per_step_max_s"],
                "per_step_max_mean": sw["mean_of_per_step_max_s"] / gl["mean_of_per_step_max_s"],
                "samples_per_s_gain": sw["samples_per_s"] / gl["samples_per_s"],
            })
        per_t = {}
        for t in threads:
            st = next((c for c in configs if (c["link"], c["comm"], c["threads"]) == (link, "switch", t)), None)
            if st:
                per_t[str(t)] = {"threads_ran": st["threads_ran"], "step_s": st["step_s"],
                                 "switch_over_gloo": st["step_s"] / gl["step_s"] if gl else None,
                                 "ranks_cpu_s_per_step": st["ranks_cpu_s_per_step"],
                                 "switchd_cpu_s_per_step": st["switchd_cpu_s_per_step"]}
        if per_t:
            r["threads"] = per_t
            if gl:
                r["gloo_ranks_cpu_s_per_step"] = gl["ranks_cpu_s_per_step"]
        ho = by.get((link, "hosts"))
        if ho and gl:
            r["hosts_over_gloo"] = ho["step_s"] / gl["step_s"]
            r["hosts_over_gloo_per_step_max_median"] = ho["median_of_per_step_max_s"] / gl["median_of_per_step_max_s"]
        nf = by.get((link, "switch-nofallback"))
        if sw and nf:
            r["agreement_cost"] = sw["step_s"] / nf["step_s"]
            r["agreement_cost_per_step_max_median"] = sw["median_of_per_step_max_s"] / nf["median_of_per_step_max_s"]
        # switch-killed: not a step-time ratio; the time from the kill to
        # the host path, beside its goal.
        ki = by.get((link, "switch-killed"))
        if ki:
            k = ki["killed"]
            r["kill_to_host_path_s"] = k["kill_to_host_path_s"]
            r["kill_to_host_path_goal_s"] = k["goal_s"]
            r["kill_to_host_path_goal_met"] = k["goal_met"]
            r["kill_to_host_path_breakdown"] = k.get("breakdown")
        # The loss against gloo's: the switch run's, else the first other
        # run with the switch's arithmetic (all of them end the same).
        compared = next((c for c in SWITCH_BITS if (link, c) in by), None)
        if gl and compared:
            v = by[(link, compared)]["loss"]
            rel = abs(v - gl["loss"]) / abs(gl["loss"])
            loss[link] = {compared: v, "gloo": gl["loss"], "compared": compared,
                          "relative_difference": rel, "ok": rel <= LOSS_TOLERANCE}

    def identical(comm):
        digests = {c["digest"] for c in configs if c["comm"] == comm}
        return len(digests) == 1 if digests else None

    # Every switch-nofallback, hosts and switch-killed run ends with the
    # weights of the switch run on the same links (without a switch run:
    # of the first run with the switch's arithmetic).
    bits = [c for c in configs if c["comm"] in SWITCH_BITS]
    same_as_switch = {}
    for c in bits:
        ref = by.get((c["link"], "switch")) or bits[0]
        if ref is not c and (c["comm"] != "switch" or c["threads"] != base):
            same_as_switch[f"{c['link']} {c['name']}"] = c["digest"] == ref["digest"]
    as_configured = {f"{c['link']} {c['name']}": c["ran_as_configured"] for c in configs if c["comm"] != "gloo"}
    checks = {
        "loss": loss,
        "loss_tolerance_relative": LOSS_TOLERANCE,
        "digests_equal_across_ranks": all(c["digests_equal_across_ranks"] for c in configs),
        "switch_runs_identical": identical("switch"),
        "gloo_runs_identical": identical("gloo"),
        "same_weights_as_switch": same_as_switch,
        "same_weights_as_switch_ok": all(same_as_switch.values()),
        "ran_as_configured": as_configured,
        "ran_as_configured_ok": all(v is not False for v in as_configured.values()),
    }
    checks["ok"] = (all(x["ok"] for x in loss.values()) and checks["digests_equal_across_ranks"]
                    and checks["switch_runs_identical"] is not False and checks["same_weights_as_switch_ok"]
                    and checks["ran_as_configured_ok"])
    headline = {f"switch_over_gloo_{link}": ratios[link]["step"] for link in links if "step" in ratios[link]}
    if "step" in ratios.get("1gbit", {}):
        headline["switch_over_gloo_1gbit_goal"] = GOAL_1GBIT
        headline["switch_over_gloo_1gbit_goal_met"] = ratios["1gbit"]["step"] <= GOAL_1GBIT
    headline.update({f"hosts_over_gloo_{link}": ratios[link]["hosts_over_gloo"]
                     for link in links if "hosts_over_gloo" in ratios[link]})
    if "hosts_over_gloo" in ratios.get("1gbit", {}):
        headline["hosts_over_gloo_1gbit_goal"] = GOAL_HOSTS_1GBIT
        headline["hosts_over_gloo_1gbit_goal_met"] = ratios["1gbit"]["hosts_over_gloo"] <= GOAL_HOSTS_1GBIT
    cost = {link: ratios[link]["agreement_cost"] for link in links if "agreement_cost" in ratios[link]}
    for link, x in cost.items():
        headline[f"agreement_cost_{link}"] = x
        headline[f"agreement_cost_{link}_goal_met"] = x <= GOAL_AGREEMENT
    if cost:
        headline["agreement_cost_goal"] = GOAL_AGREEMENT
        headline["agreement_cost_goal_met"] = all(x <= GOAL_AGREEMENT for x in cost.values())
    killed = {link: ratios[link] for link in links if "kill_to_host_path_s" in ratios[link]}
    for link, r in killed.items():
        headline[f"kill_to_host_path_s_{link}"] = r["kill_to_host_path_s"]
    if killed:
        headline["kill_to_host_path_goal_s"] = max(r["kill_to_host_path_goal_s"] for r in killed.values())
        headline["kill_to_host_path_goal_met"] = all(r["kill_to_host_path_goal_met"] for r in killed.values())
    headline["sanity_ok"] = checks["ok"]
    return ratios, checks, headline


def machine():
    def cpu_model():
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        return "unknown"
    with open("/proc/meminfo") as f:
        mem = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return {"nproc": os.cpu_count(), "cpu_model": cpu_model(), "mem_total_kib": mem,
            "kernel": os.uname().release}


def git(*args):
    try:
        return subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), *args],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def versions():
    out = {}
    try:
        import torch
        out["torch"] = torch.__version__
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return out


def f(x, d=3):
    return "-" if x is None else f"{x:.{d}f}"


def threads_label(c, setup):
    """", T=2 (ran 2)" after a switch configuration's label when more than
    one worker thread count ran (or the one is not 1); "" otherwise."""
    if c.get("threads") is None or setup.get("worker_threads", [1]) == [1]:
        return ""
    ran = "-" if c["threads_ran"] is None else c["threads_ran"]
    return f", T={c['threads']} (ran {ran})"


def table(res):
    s = res["setup"]
    rows = [
        "| link | comm | step s (slowest rank's median) | p25–p75 s | rank 0 median s | samples/s | final loss | peak RSS / rank MiB | CPU busy | CPU-s ranks / switchd |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in res["configs"]:
        busy = "-" if c["cpu_busy_fraction"] is None else f"{c['cpu_busy_fraction'] * 100:.0f} %"
        rows.append(
            f"| {link_label(c['link'])} | {TABLE_LABEL[c['comm']]}{threads_label(c, s)} "
            f"| **{f(c['step_s'])}** | {f(c['step_p25_s'])}–{f(c['step_p75_s'])} | {f(c['rank0_median_s'])} "
            f"| {f(c['samples_per_s'], 1)} | {f(c['loss'], 4)} "
            f"| {f(c['max_rss_mib_per_rank'], 0)} | {busy} "
            f"| {f(c['ranks_cpu_s'], 0)} / {f(c['switchd_cpu_s'], 1) if c['comm'] in WITH_SWITCHD else '-'} |")
    h = res["headline"]
    links = res["setup"]["links"]
    rows.append("")

    def met(ok):
        return "met" if ok else "NOT met"
    for link in links:
        r = res["ratios"][link]
        if "step" not in r:
            continue
        goal = ""
        if link == "1gbit":
            goal = f"; goal <= {GOAL_1GBIT}: {met(h['switch_over_gloo_1gbit_goal_met'])}"
        rows.append(f"switch / gloo step time, {link_label(link)}: **{f(r['step'], 2)}** "
                    f"(rank 0's medians {f(r['rank0_median'], 2)}, medians of per-step slowest "
                    f"{f(r['per_step_max_median'], 2)}){goal}")
    if s.get("worker_threads", [1]) != [1]:
        for link in links:
            r = res["ratios"][link]
            if "threads" not in r:
                continue
            rows.append(f"per worker thread count, {link_label(link)} (switch / gloo step time; CPU-s per step of "
                        f"the ranks / of switchd; gloo's ranks {f(r.get('gloo_ranks_cpu_s_per_step'), 2)}): " + ", ".join(
                            f"T={t} (ran {'-' if v['threads_ran'] is None else v['threads_ran']}) "
                            f"**{f(v['switch_over_gloo'], 2)}**; {f(v['ranks_cpu_s_per_step'], 2)} / "
                            f"{f(v['switchd_cpu_s_per_step'], 3)}" for t, v in r["threads"].items()))
        for t in s.get("worker_threads_skipped", []):
            rows.append(f"worker threads T = {t} skipped: more than the machine's {s.get('cpus')} CPUs")
    for link in links:
        r = res["ratios"][link]
        if "hosts_over_gloo" not in r:
            continue
        goal = ""
        if link == "1gbit":
            goal = f"; goal <= {GOAL_HOSTS_1GBIT}: {met(h['hosts_over_gloo_1gbit_goal_met'])}"
        rows.append(f"hosts / gloo step time (host path against gloo's all-reduce), {link_label(link)}: "
                    f"**{f(r['hosts_over_gloo'], 3)}** (medians of per-step slowest "
                    f"{f(r['hosts_over_gloo_per_step_max_median'], 3)}){goal}")
    for link in links:
        r = res["ratios"][link]
        if "agreement_cost" not in r:
            continue
        rows.append(f"agreement cost, switch / switch-nofallback step time, {link_label(link)}: "
                    f"**{f(r['agreement_cost'], 3)}** (medians of per-step slowest "
                    f"{f(r['agreement_cost_per_step_max_median'], 3)}); goal <= {GOAL_AGREEMENT}: "
                    f"{met(h[f'agreement_cost_{link}_goal_met'])}")
    by = {(c["link"], c["comm"]): c for c in res["configs"]}
    for link in links:
        r = res["ratios"][link]
        if "kill_to_host_path_s" not in r:
            continue
        k = by[(link, "switch-killed")]["killed"]
        if k["kill_s"] is None:
            what = f"switchd NOT killed (the ranks ended before rank 0 printed step {k['kill_after_step']})"
        elif k["fallback_seen_s"] is None:
            what = (f"switchd killed after rank 0's step {k['step_seen']}, rank 0 NEVER logged that it "
                    "runs on the hosts")
        else:
            what = (f"from switchd's kill (SIGKILL, after rank 0's step {k['step_seen']}) to rank 0's first "
                    f"collective done on the host path **{f(r['kill_to_host_path_s'], 2)} s** (rank 0's log "
                    f"read every {k['poll_interval_s'] * 1e3:.0f} ms)")
        rows.append(f"switch killed mid-run, {link_label(link)}: {what}; goal <= stall timeout "
                    f"{k['stall_timeout_s']:g} s + {GOAL_KILL_OVER_STALL_S:g} s = {r['kill_to_host_path_goal_s']:g} s: "
                    f"{met(r['kill_to_host_path_goal_met'])}")
        b = k.get("breakdown")
        if b:
            ring = (f"; a ring needs {f(b['host_collective_line_rate_s'], 2)} s for these bytes at the link's rate"
                    if b["host_collective_line_rate_s"] is not None else "")
            rows.append(f"  of which: {f(b['before_collective_s'], 2)} s until the failing collective started "
                        f"(the ranks were computing), {f(b['on_switch_s'], 2)} s on the switch (the stall), "
                        f"{f(b['agreement_s'], 2)} s agreeing to fall back, {f(b['host_collective_s'], 2)} s "
                        f"redoing it on the host path ({b['host_collective_bytes'] / 1e6:.1f} MB{ring})")
    for link in links:
        chk = res["checks"]["loss"].get(link)
        if chk is None:
            continue
        cmp = chk.get("compared", "switch")
        rows.append(f"loss, {link_label(link)}: {cmp} {chk[cmp]:.4f}, gloo {chk['gloo']:.4f} "
                    f"(relative difference {chk['relative_difference']:.1e}, within {LOSS_TOLERANCE:.0%}: "
                    f"{'ok' if chk['ok'] else 'NOT ok'})")
    ch = res["checks"]

    def yes(x, no="NO"):
        return "-" if x is None else "yes" if x else no
    line = "same weights on every rank: " + ", ".join(
        f"{c['link']} {c.get('name', c['comm'])} {'yes' if c['digests_equal_across_ranks'] else 'NO'}" for c in res["configs"])
    if ch["switch_runs_identical"] is not None:
        line += f"; switch runs bit-identical across link settings: {yes(ch['switch_runs_identical'])}"
    if ch["gloo_runs_identical"] is not None:
        line += f"; gloo runs: {yes(ch['gloo_runs_identical'], 'no')}"
    rows.append(line)
    if ch["same_weights_as_switch"]:
        rows.append("the switch's weights (bit-identical): " + ", ".join(
            f"{k} {yes(v)}" for k, v in ch["same_weights_as_switch"].items()))
    if ch["ran_as_configured"]:
        rows.append("ran as configured (switch runs never fell back to the hosts, hosts runs never used the "
                    "switch" + ("; switch-killed: on the switch, then every rank fell back once and stayed on the hosts"
                                if any(c["comm"] == "switch-killed" for c in res["configs"]) else "")
                    + "; - where train_ddp.py reported no path counters): " + ", ".join(
                        f"{k} {yes(v)}" for k, v in ch["ran_as_configured"].items()))
    for c in res["configs"]:
        sh = c["shapers"]
        if c["link"] != "unlimited" and sh and "worker_ingress_ifb" in sh:
            rows.append(
                f"{link_label(c['link'])[:-6]} shapers, {c.get('name', c['comm'])}: worker egress {sh['worker_egress']['bytes'] / 1e9:.2f} GB "
                f"({sh['worker_egress']['overlimits']} overlimits), worker ingress (ifb) "
                f"{sh['worker_ingress_ifb']['bytes'] / 1e9:.2f} GB ({sh['worker_ingress_ifb']['overlimits']} overlimits), "
                f"switch ports {sh['switch_port_egress']['bytes'] / 1e9:.2f} GB")
    m = res["machine"]
    rows.append(
        f"model: {s['params'] / 1e6:.2f} M float32 parameters ({s['params'] * 4 / 1e6:.1f} MB of gradient a step), "
        f"{s['world']} ranks on {s['device']} x batch {s['batch_per_rank']}, switchd {s['switch_threads']} thread(s), {s['warmup_steps']} warm-up + {s['timed_steps']} timed steps "
        f"per configuration; measuring took {f(res['measure_seconds'], 0)} s "
        f"(whole command {f(res['bench_seconds'], 0)} s before the report)")
    rows.append(f"machine: {m['nproc']} cores ({m['cpu_model']}), {m['mem_total_kib'] / 1048576:.1f} GiB, "
                f"kernel {m['kernel']}; 1-min load {res['configs'][0]['loadavg']['before'].split()[0]} before "
                f"the first configuration"
                + (f"; GPU {res['versions']['gpu']}" if res["versions"].get("gpu") else ""))
    return "\n".join(rows) + "\n"


def plot(res, path):
    try:
        import matplotlib
    except ImportError:
        print("bench_train_report.py: warning: no matplotlib; plot skipped", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    links = res["setup"]["links"]
    # A bar per configuration whose step time means something: not
    # switch-killed's (it stalls once and ends on the host path); its steps
    # are in the second panel.
    comms = [c for c in res["setup"].get("comms", ["gloo", "switch"]) if c != "switch-killed"]
    # One series per configuration and worker thread count (T > base hatched).
    series = sorted({(c["comm"], c.get("threads")) for c in res["configs"] if c["comm"] in comms},
                    key=lambda x: (comms.index(x[0]), x[1] or 0))
    # One line under each link setting per ratio that ran.
    ratio_lines = {link: [f"{name}: {res['ratios'][link][key]:.{d}f}"
                          for key, name, d in (("step", "switch / gloo", 2), ("hosts_over_gloo", "hosts / gloo", 3),
                                               ("agreement_cost", "switch / no fallback", 3))
                          if key in res["ratios"][link]] for link in links}
    for link in links:
        if "kill_to_host_path_s" in res["ratios"][link]:
            x = res["ratios"][link]["kill_to_host_path_s"]
            ratio_lines[link].append("kill to host path: " + ("never" if x is None else f"{x:.2f} s"))
    extra = max((len(v) for v in ratio_lines.values()), default=0)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12 if len(comms) <= 2 else 13.5, 4.8 + 0.15 * max(0, extra - 1)),
                                  gridspec_kw={"width_ratios": [1, 1.4]})
    by = {(c["link"], c["comm"], c.get("threads")): c for c in res["configs"]}
    base = res["setup"].get("worker_threads", [1])[0]
    n = len(series)
    w = 0.36 if n <= 2 else 0.84 / n
    for i, (comm, t) in enumerate(series):
        xs = [k + (i - (n - 1) / 2) * w for k in range(len(links))]
        cs = [by[(link, comm, t)] for link in links]
        ys = [c["step_s"] for c in cs]
        err = [[c["step_s"] - c["step_p25_s"] for c in cs], [c["step_p75_s"] - c["step_s"] for c in cs]]
        rects = ax.bar(xs, ys, w, color=COLORS[comm], label=PLOT_LABEL[comm] + threads_label(cs[0], res["setup"]),
                       yerr=err, capsize=4 if n <= 2 else 2, hatch=None if t in (None, base) else "//",
                       edgecolor="white" if t not in (None, base) else None)
        for r, c in zip(rects, cs):
            ax.annotate(f"{c['step_s']:.{2 if c['step_s'] >= 0.1 else 3}f}" + (" s" if n <= 2 else ""),
                        (r.get_x() + r.get_width() / 2, c["step_p75_s"]), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8 if n <= 2 else 7)
    for k, link in enumerate(links):
        lines = ratio_lines[link]
        if len(lines) == 1 and "step" in res["ratios"][link]:
            lines = [f"switch / gloo\n{res['ratios'][link]['step']:.2f}"]  # gloo,switch: the figure as before
        if lines:
            ax.annotate("\n".join(lines), (k, 0), xytext=(0, -26),
                        textcoords="offset points", ha="center", va="top", fontsize=8, fontweight="bold")
    ax.set_xticks(range(len(links)))
    ax.set_xticklabels([link_label(link) for link in links])
    ax.set_ylabel("seconds per training step (lower is better)")
    # Room above the bars for the legend, one line per configuration.
    ax.set_ylim(0, max((c["step_p75_s"] for c in res["configs"] if c["comm"] in comms), default=1.0)
                * (1.3 + 0.12 * max(0, n - 2)))
    ax.set_title("DDP step: median of the slowest rank (bars p25–p75)", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")

    styles = dict(zip(links, ["-", "--", ":", "-."] * len(links)))
    for c in res["configs"]:
        w0 = res["setup"]["warmup_steps"]
        ax2.plot(range(w0, w0 + len(c["per_step_max_s"])), c["per_step_max_s"], styles[c["link"]],
                 color=COLORS[c["comm"]], marker="." if c.get("threads") in (None, base) else "x",
                 label=f"{c['name']}, {link_label(c['link'])}")
    ax2.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax2.set_xlabel("step (warm-up steps left out)")
    ax2.set_ylabel("seconds, slowest of the 4 ranks")
    ax2.set_ylim(bottom=0)
    ax2.set_title("every timed step", fontsize=10)
    ax2.legend(fontsize=8 if len(res["configs"]) <= 4 else 7, ncol=1 if len(res["configs"]) <= 4 else 2)
    s = res["setup"]
    fig.suptitle(f"PyTorch DDP, MLP of {s['params'] / 1e6:.1f} M float32 parameters, "
                 f"{s['world']} ranks ({s['device']}) x batch {s['batch_per_rank']}, gradients as {s['dtype']}, "
                 f"switchd {s.get('switch_threads', 1)} thread(s), veth testbed", fontsize=11)
    m = res["machine"]
    fig.text(0.99, 0.01, f"{m['nproc']} cores {m['cpu_model']}, kernel {m['kernel']}, {res['stamp']}",
             ha="right", va="bottom", fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.05 + 0.035 * max(0, extra - 1), 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--json", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--png")
    p.add_argument("--stamp", required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument("--dtype", default="f32")
    p.add_argument("--transport", default="auto")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--links", default="unlimited,1gbit", help="the link settings, in the order run")
    p.add_argument("--comms", default=DEFAULT_COMMS,
                   help=f"the configurations run on each link setting, in the order run ({', '.join(COMMS)})")
    p.add_argument("--tbf", action="append", default=[], metavar="LINK=ARGS",
                   help="the tbf arguments of a rate setting (repeat per setting)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--switch-threads", type=int, default=1)
    p.add_argument("--worker-threads", default="1",
                   help="the worker thread counts asked (scripts/bench train --worker-threads), e.g. 1,2")
    p.add_argument("--cpus", type=int, help="the machine's CPUs (nproc): a T above them was skipped")
    p.add_argument("--stall-timeout", type=float, default=2.0,
                   help="switch-killed: the ranks' AGGSWITCH_STALL_TIMEOUT (scripts/bench train --stall-timeout)")
    p.add_argument("--bench-seconds", type=float)
    p.add_argument("--measure-seconds", type=float)
    a = p.parse_args()

    links = a.links.split(",")
    comms = a.comms.split(",")
    for comm in comms:
        if comm not in COMMS:
            p.error(f"--comms: {comm!r} is none of {', '.join(COMMS)}")
    if len(set(comms)) != len(comms):
        p.error(f"--comms: {a.comms!r} names a configuration twice")
    tbf = dict(t.split("=", 1) for t in a.tbf)
    asked = [int(t) for t in a.worker_threads.split(",")]
    threads = [t for t in asked if a.cpus is None or t <= a.cpus]
    if not threads:
        p.error(f"--worker-threads {a.worker_threads}: none is within --cpus {a.cpus}")
    show = threads != [1]
    configs = [load_config(a.run_dir, link, comm, a.warmup, t, show) for link in links for comm in comms
               for t in thread_counts_of(comm, threads)]
    for c in configs:
        c["samples_per_s"] = c["world"] * a.batch / c["step_s"]
    ratios, checks, headline = analyse(configs, links, comms, threads)
    world, params = configs[0]["world"], configs[0]["params"]
    res = {
        "stamp": a.stamp,
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted_changes_in_tracked_files": len((git("status", "--porcelain", "--untracked-files=no") or "").splitlines()),
        "machine": machine(),
        "versions": versions(),
        "setup": {
            "world": world, "params": params, "gradient_bytes_per_step": params * 4,
            "model": f"MLP 64-{'-'.join([str(a.hidden)] * a.layers)}-10, ReLU (examples/train_ddp.py)",
            "hidden": a.hidden, "layers": a.layers, "batch_per_rank": a.batch, "seed": a.seed, "mtu": a.mtu,
            "dtype": a.dtype, "transport": a.transport, "device": a.device, "links": links, "comms": comms,
            "switch_threads": a.switch_threads,
            "worker_threads": threads, "worker_threads_skipped": [t for t in asked if t not in threads],
            "cpus": a.cpus,
            "worker_threads_note": "switch and switch-nofallback ran once per T (AGGSWITCH_THREADS=T, switchd "
                                   "seq_lanes >= T), switch-killed at the first; the other figures are of the first "
                                   "T's runs. CPU per step: the ranks' whole processes (GNU time user + system: "
                                   "start-up, compute and all-reduces) and switchd's whole life in the configuration, "
                                   "over every step run (warm-up included)",
            "warmup_steps": a.warmup, "timed_steps": a.steps,
            "optimizer": "SGD lr 0.05 momentum 0.9 (train_ddp.py defaults)",
            "ranks": "one process per worker namespace, torch.set_num_threads(1), OMP_NUM_THREADS=1, gloo process group on eth0"
                     + ("; model and data on the GPU, DDP buckets staged through host memory for the switch's hook"
                        if a.device == "cuda" else ""),
            # (The dtype's two descriptions, then the others for every dtype.)
            "comm": {k: v for k, v in (({
                "gloo": "DDP's default all-reduce hook over the gloo process group (TCP through the bridge)",
                "switch": "aggswitch.torch.allreduce_hook: every bucket summed in switchd (job 1 of 4, pool_slots 256, "
                          f"{a.switch_threads} dataplane thread(s) and queue(s)), mean over ranks"}
                if a.dtype == "f32" else {
                "gloo": f"PyTorch's {a.dtype} compression hook (default_hooks.{'bf16' if a.dtype == 'bf16' else 'fp16'}_compress_hook) over gloo",
                "switch": f"aggswitch.torch's {a.dtype} compress hook: buckets sent as {a.dtype}, summed in switchd (job dtype {a.dtype}), mean over ranks"}) | {
                "switch-nofallback": "as switch, with AGGSWITCH_FALLBACK=off: no agreement (one gloo all-reduce of "
                                     "world int32) after each collective, fail-fast",
                "hosts": "the same aggswitch.torch hook with AGGSWITCH_MODE=hosts: every bucket summed on the host path "
                         "over gloo (all-to-all, the switch's sum, all-gather) with the switch's bits; no switchd",
                "switch-killed": f"as switch (a fresh switchd, fallback on) with AGGSWITCH_STALL_TIMEOUT={a.stall_timeout:g}; "
                                 "switchd killed by its PID (SIGKILL) once rank 0 printed step K (about a third of the "
                                 "steps, a multiple of 10, at least 10) and not restarted: the ranks stall, vote and finish "
                                 "on the host path. Its step time is compared with nothing"}).items()
                if k in comms},
            **({"fallback": "switch: AGGSWITCH_FALLBACK=on (the default): after each collective the ranks agree in one "
                            "gloo all-reduce of world int32 on a dedicated group that every rank succeeded"}
               if "switch" in comms else {}),
            **({"stall_timeout_s": a.stall_timeout,
                "kill_to_host_path": "switch-killed: from switchd's SIGKILL (bash EPOCHREALTIME right after kill) to "
                                     "the moment rank 0's log (stdout and stderr) first holds aggswitch.torch's warning "
                                     "'... run on the hosts over the process group', which it logs once its first "
                                     "collective is done on the host path; the log is read every poll_interval_s "
                                     "(killed.json) from the kill. Goal: <= the stall timeout + "
                                     f"{GOAL_KILL_OVER_STALL_S:g} s"}
               if "switch-killed" in comms else {}),
            "step_time": "train_ddp.py's per-step time (sample, forward, backward incl. the all-reduce, optimizer step); "
                         "warm-up steps dropped; a configuration's step time = the slowest rank's median over the timed steps",
            "samples_per_s": "world x batch per rank / step time",
            "shaping": {link: f"tbf {args} on worker eth0 egress, switch port sw-wI egress, and worker eth0 ingress via ifb0"
                        for link, args in tbf.items()},
        },
        "configs": configs,
        "ratios": ratios,
        "checks": checks,
        "headline": headline,
        "bench_seconds": a.bench_seconds,
        "measure_seconds": a.measure_seconds,
    }
    with open(a.json, "w") as fh:
        json.dump(res, fh, indent=1)
        fh.write("\n")
    with open(a.table, "w") as fh:
        fh.write(table(res))
    if a.png:
        plot(res, a.png)
    return 0 if checks["ok"] else 3


if __name__ == "__main__":
    sys.exit(main())
