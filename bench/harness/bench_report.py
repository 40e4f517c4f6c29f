#!/usr/bin/env python3
"""bench_report.py: scripts/bench allreduce's statistics, JSON and table, from the
raw results its phases left in the run directory (the shell only runs
things and records what they printed).

Each phase of a link setting leaves in its folder DIR two snapshots
(lib.sh's `snapshot`: /proc/stat's cpu line and every shaper's `tc -s -j`
counters), DIR/snap-TAG-before.jsonl and DIR/snap-TAG-after.jsonl; a
phase's shapers are the counters' differences and its CPU the busy share of
all CPUs between the two (benchkit: the last "stat" line of each).

Commands:
  peer DIR TAG --output FILE
      an OpenMPI or gloo phase: the last JSON line of FILE (what rank 0
      printed; it must say verified) plus the phase's shapers and CPU, to
      DIR/TAG.result.json;
  switch DIR --repeats K --elements N --workers W
      the switch's K-iteration run and K single runs: the slowest rank's
      seconds of each (DIR/multi-rankR.json, DIR/singleI-rankR.json: the
      workers' JSON), the multi run's ranks, switchd's stats file, the
      phase's shapers and CPU (snapshots tagged "switch") to
      DIR/switch.raw.json, and their statistics (below) to
      DIR/switch.result.json, after each run_switch;
  report RUN ...
      the whole run: reads RUN/{unlimited,1gbit}/: switch.result.json,
      mpi.result.json, mpi_tso.result.json, gloo.result.json,
      iperf-{up,down,w2w}.json (iperf3 -J), loadavg-{start,end}.txt; and,
      when present, rates/rates.json, forward.json, per-packet.json,
      efficiency.json, threads/threads.json. Writes the JSON (bench/results/bench-STAMP.json)
      (the schema bench/results/bench.json has had since issue 3, plus `gloo` per
      link and the switch/gloo ratios) and RUN/table.md. The headline ratios
      are taken against gloo (PyTorch's all-reduce with TSO on: what a
      PyTorch user runs; issue 24), OpenMPI's beside them;
  rates-only --json OUT --rates FILE ...
      the JSON of a --rates-only run (machine, commit, rates);
  cores-only --json OUT --rates FILE --threads-json FILE ...
      the JSON of a --cores-only run (packet rates and the all-reduce by
      dataplane thread count).

Statistics (benchkit): a configuration's "mean" is the K-iteration run's
slowest rank / K; "best", "median" and "worst" are over K single runs (the
median interpolates between the middle two when K is even).
"""

import argparse
import os
import platform
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import (  # noqa: E402
    busy_fraction, fmt, json_lines, last_json_line, load_json, markdown_table, median, nproc, ratio,
    shaper_delta, snapshot_stat, write_json)

HEADER_BYTES = 14 + 20 + 8 + 22
# After a RESULT's values: its 16-byte token (auth = "port", the bench's
# jobs) or tag ("mac"); a port job's DATA carries none.
RESULT_TAIL = 16
# The largest float32 chunk a job can have: MTU 9000's (9000 - 50) / 4 less
# the RESULT's tail.
MAX_F32_CHUNK = (9000 - 50) // 4 - RESULT_TAIL // 4
L1_EXTRA = 24  # FCS 4, preamble 8, inter-frame gap 12


load = load_json


class ReportError(Exception):
    pass


def phase(d, tag):
    """The shapers' counter differences and the busy share of all CPUs
    between DIR/snap-TAG-before.jsonl and DIR/snap-TAG-after.jsonl."""
    snaps = []
    for edge in ("before", "after"):
        path = os.path.join(d, f"snap-{tag}-{edge}.jsonl")
        try:
            snaps.append(json_lines(path))
            snapshot_stat(snaps[-1])
        except OSError as e:
            raise ReportError(f"cannot read {path}: {e.strerror}") from None
        except ValueError as e:
            raise ReportError(f"{path}: {e}") from None
    a, b = snaps
    busy = busy_fraction(snapshot_stat(a), snapshot_stat(b))
    # Three decimals, as the all-reduce benchmark has always published it.
    return shaper_delta(a, b), round(busy, 3) if busy is not None else None


def program_json(path):
    """The last JSON line a program wrote to PATH, or None."""
    try:
        with open(path) as f:
            return last_json_line(f.read())
    except OSError:
        return None


def peer_result(d, tag, output):
    """An OpenMPI or gloo phase's result: rank 0's JSON plus shapers and CPU."""
    j = program_json(output)
    if j is None:
        raise ReportError(f"{tag} printed no JSON; see {output} and its log")
    if j.get("verified") is not True:
        raise ReportError(f"{tag} gave a wrong sum (verified is {j.get('verified')} in {output})")
    shapers, busy = phase(d, tag)
    return {**j, "shapers": shapers, "cpu_busy_fraction": busy}


def switch_raw(d, k, workers):
    """The switch phase's raw results from the workers' JSON files."""
    def ranks(tag):
        out = []
        for r in range(workers):
            path = os.path.join(d, f"{tag}-rank{r}.json")
            j = program_json(path)
            if j is None or not isinstance(j.get("seconds"), (int, float)):
                raise ReportError(f"rank {r} of switch run '{tag}' left no report with seconds in {path}")
            out.append(j)
        return out

    multi = ranks("multi")
    shapers, busy = phase(d, "switch")
    return {
        "multi_run_slowest_rank_s": max(r["seconds"] for r in multi),
        "single_runs_s": [max(r["seconds"] for r in ranks(f"single{i}")) for i in range(k)],
        "ranks": multi,
        "shapers": shapers,
        "cpu_busy_fraction": busy,
        "switchd_stats": load(os.path.join(d, "switchd-stats.json")),
    }


def switch_stats(raw, k, elements):
    """The switch's row from switch.raw.json."""
    runs = raw["single_runs_s"]
    ranks = raw["ranks"]
    multi = raw["multi_run_slowest_rank_s"]
    return {
        "mean_s": multi / k,
        "best_s": min(runs),
        "median_s": median(runs),
        "worst_s": max(runs),
        "single_runs_s": runs,
        "multi_run_slowest_rank_s": multi,
        "gbit_per_s_slowest_rank": elements * 4 * 8 * k / multi / 1e9,
        "elems_per_chunk": ranks[0].get("elems_per_chunk"),
        "chunks_resent_multi_run": sum((r.get("stats") or {}).get("chunks_resent", 0) for r in ranks),
        "per_rank_multi_run": [
            {"rank": r.get("rank"), "seconds": r.get("seconds"), "gbit_per_s": r.get("gbit_per_s"),
             "chunks_resent": (r.get("stats") or {}).get("chunks_resent")}
            for r in ranks
        ],
        "shapers": raw["shapers"],
        "cpu_busy_fraction": raw["cpu_busy_fraction"],
        "switchd_stats": raw.get("switchd_stats"),
    }


def ratios(sw, peer):
    if not peer:
        return None
    return {s: ratio(sw[f"{s}_s"], peer.get(f"{s}_s")) for s in ("mean", "median", "best")}


def link_report(d, name):
    sw = load(os.path.join(d, "switch.result.json"))
    mpi = load(os.path.join(d, "mpi.result.json"))
    tso = load(os.path.join(d, "mpi_tso.result.json"))
    gloo = load(os.path.join(d, "gloo.result.json"))
    return {
        "link": name,
        "iperf3_gbit_per_s": {key: iperf_gbps(os.path.join(d, f"iperf-{tag}.json"))
                              for key, tag in (("worker_to_switch", "up"), ("switch_to_worker", "down"),
                                               ("worker_to_worker", "w2w"))},
        "openmpi": mpi,
        "openmpi_tso": tso,
        "gloo": gloo,
        "switch": sw,
        "ratio_switch_over_gloo": ratios(sw, gloo),
        "ratio_switch_over_openmpi": ratios(sw, mpi),
        "ratio_switch_over_openmpi_tso": ratios(sw, tso),
        "loadavg_1min": {"start": loadavg_file(os.path.join(d, "loadavg-start.txt")),
                         "end": loadavg_file(os.path.join(d, "loadavg-end.txt"))},
    }


def iperf_gbps(path):
    """Gbit/s received in an iperf3 -J report; None when iperf3 failed."""
    bps = (((load(path) or {}).get("end") or {}).get("sum_received") or {}).get("bits_per_second")
    return bps / 1e9 if isinstance(bps, (int, float)) else None


def loadavg_file(path):
    """The 1-min load average in a copy of /proc/loadavg, or None."""
    try:
        with open(path) as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def machine(load0):
    def first(path, key):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(key):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return None

    def os_name():
        try:
            with open("/etc/os-release") as f:
                for line in f:
                    if line.startswith("PRETTY_NAME="):
                        return line.split("=", 1)[1].strip().strip('"')
        except OSError:
            pass
        return ""

    mem = first("/proc/meminfo", "MemTotal")
    with open("/proc/loadavg") as f:
        load1 = float(f.read().split()[0])
    return {
        "nproc": os.cpu_count(),
        "cpu_model": first("/proc/cpuinfo", "model name") or "unknown",
        "mem_total_kib": int(mem.split()[0]) if mem else 0,
        "kernel": platform.release(),
        "os": os_name(),
        "loadavg_1min": {"start": load0, "end": load1},
    }


def git(repo, *args):
    try:
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def build(a):
    run = a.run
    elements = a.mib * 1024 * 1024 // 4
    links = [link_report(os.path.join(run, n), n) for n in ("unlimited", "1gbit")]
    unl, lim = links
    epc = lim["switch"]["elems_per_chunk"]
    if not isinstance(epc, int) or not 1 <= epc <= MAX_F32_CHUNK:
        raise SystemExit("bench_report.py: no elems_per_chunk in the worker's report")
    chunks = -(-elements // epc)
    # DATA up, RESULTs down: each RESULT is RESULT_TAIL bytes longer, so the
    # RESULTs' way bounds the all-reduce.
    data_l2 = chunks * HEADER_BYTES + elements * 4
    l2 = data_l2 + chunks * RESULT_TAIL
    l1 = l2 + chunks * L1_EXTRA
    bound_l2, bound_l1 = l2 * 8 / a.rate_bps, l1 * 8 / a.rate_bps
    runs = 2 * a.repeats * a.workers
    expected = {"worker_egress": runs * data_l2, "worker_ingress_ifb": runs * l2}
    for l in links:
        sh = l["switch"]["shapers"]
        for k, want in expected.items():
            if k in sh:
                sh[k]["expected_bytes_l2"] = want
                sh[k]["over_expected"] = sh[k]["bytes"] / want
    thr = load(os.path.join(run, "threads", "threads.json"))
    fwd = load(os.path.join(run, "forward.json"))
    pp = load(os.path.join(run, "per-packet.json"))
    eff = load(os.path.join(run, "efficiency.json"))
    if isinstance(eff, dict):
        eff.pop("runs", None)
    rates = load(os.path.join(run, "rates", "rates.json")) if a.rates else None

    def r(l, peer, s="mean"):
        return (l[f"ratio_switch_over_{peer}"] or {}).get(s)

    def pp_ratio(elems):
        for s in (pp or {}).get("sizes") or []:
            if s.get("elems") == elems:
                return s.get("engine_over_copy")
        return None

    def fwd_ratio(mode, key):
        return (((fwd or {}).get("results") or {}).get(mode) or {}).get("ratio_vs_bridge", {}).get(key)

    sw_lr = lim["switch"]["mean_s"] / bound_l2
    headline = {
        "switch_over_gloo_unlimited": r(unl, "gloo"),
        "switch_over_gloo_1gbit": r(lim, "gloo"),
        "switch_over_gloo_1gbit_median": r(lim, "gloo", "median"),
        "switch_over_gloo_1gbit_goal": 0.67,
        "switch_over_gloo_1gbit_goal_met": (r(lim, "gloo") <= 0.67) if r(lim, "gloo") is not None else None,
        "switch_over_openmpi_unlimited": r(unl, "openmpi"),
        "switch_over_openmpi_1gbit": r(lim, "openmpi"),
        "switch_over_openmpi_1gbit_median": r(lim, "openmpi", "median"),
        "switch_over_openmpi_1gbit_goal": 0.67,
        "switch_over_openmpi_1gbit_goal_met": (r(lim, "openmpi") or 1e9) <= 0.67,
        "switch_over_openmpi_tso_unlimited": r(unl, "openmpi_tso"),
        "switch_over_openmpi_tso_1gbit": r(lim, "openmpi_tso"),
        "switch_over_line_rate_1gbit": sw_lr,
        "switch_over_line_rate_1gbit_median": lim["switch"]["median_s"] / bound_l2,
        "switch_over_line_rate_goal": 1.10,
        "switch_over_line_rate_goal_met": sw_lr <= 1.10,
        "allreduce_threads": (thr or {}).get("allreduce_threads"),
        "allreduce_time_over_1_thread": (thr or {}).get("time_over_1_thread"),
        "forwarding_fast_path_tcp_over_bridge": fwd_ratio("xdp-fwd", "tcp_gbps"),
        "forwarding_fast_path_p99_over_bridge": fwd_ratio("xdp-fwd", "rtt_p99"),
        "forwarding_xdp_pass_tcp_over_bridge": fwd_ratio("xdp-pass", "tcp_gbps"),
        "per_packet_engine_over_copy_362": pp_ratio(362),
        "per_packet_engine_over_copy_870": pp_ratio(870),
        "per_packet_goal": 1.5,
    }
    status = git(a.repo, "status", "--porcelain", "--untracked-files=no")
    return {
        "stamp": a.stamp,
        "commit": commit(a.repo),
        "uncommitted_changes_in_tracked_files": len(status.splitlines()) if status else 0,
        "quick": a.quick,
        "machine": machine(a.load_start),
        "setup": {
            "workers": a.workers, "mib": a.mib, "elements": elements, "dtype": "float32",
            "repeats": a.repeats, "mtu": a.mtu, "openmpi": a.openmpi_version,
            "openmpi_args": "--mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 --bind-to none",
            "gloo": "bench/gloo_allreduce.py: torch.distributed gloo on eth0, worker transmit offload (TSO) on, one warm-up then K timed",
            "shaping": "tbf rate 1gbit burst 256kb latency 50ms on worker eth0 egress, switch port sw-wI egress, and worker eth0 ingress via ifb0",
            "switch_time": "slowest rank: seconds / K from one run of K iterations (mean); best/median over K runs of 1 iteration",
            "cpu_definition": "whole machine busy share over each phase (bench/harness/benchkit.py)",
        },
        "line_rate_1gbit": {
            "elems_per_chunk": epc, "chunks": chunks, "header_bytes_per_frame": HEADER_BYTES,
            "frame_bytes": HEADER_BYTES + epc * 4 + RESULT_TAIL, "data_frame_bytes": HEADER_BYTES + epc * 4,
            "bytes_one_way_l2": l2, "bytes_one_way_l1": l1,
            "bound_l2_s": bound_l2, "bound_l1_s": bound_l1,
            "note": "the RESULTs' way (frame_bytes: the values and a 16-byte token; a DATA is data_frame_bytes); l2 = frame without FCS, as tc tbf counts it (the bound on this testbed); l1 adds FCS, preamble and inter-frame gap (24 B a frame)",
        },
        "rates": rates,
        "forwarding": fwd,
        "per_packet": pp,
        "efficiency": eff,
        "threads": thr,
        "links": links,
        "headline": headline,
    }


def small_machine(with_load=None):
    """The machine block of a --rates-only or --cores-only run."""
    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    m = {"nproc": nproc(), "cpu_model": model, "kernel": platform.release()}
    if with_load is not None:
        with open("/proc/loadavg") as f:
            m["loadavg_1min"] = {"start": with_load, "end": float(f.read().split()[0])}
    return m


def commit(repo):
    return (git(repo, "rev-parse", "--short", "HEAD") or "unknown").strip()


def rates_only(a):
    return {"stamp": a.stamp, "commit": commit(a.repo), "rates_only": True, "machine": small_machine(),
            "rates": load(a.rates)}


def cores_only(a):
    rates, thr = load(a.rates), load(a.threads_json)
    return {
        "stamp": a.stamp, "commit": commit(a.repo), "cores_only": True,
        "machine": small_machine(a.load_start),
        "setup": {"workers": a.workers, "mib": a.mib, "dtype": "float32", "repeats": a.repeats, "mtu": a.mtu},
        "rates": rates, "threads": thr,
        "headline": {"allreduce_threads": (thr or {}).get("allreduce_threads"),
                     "allreduce_time_over_1_thread": (thr or {}).get("time_over_1_thread"),
                     "rates_over_one_thread": ((rates or {}).get("headline") or {}).get("over_one_thread")},
    }


def f2(x):
    return fmt(x, 2)


def table(b):
    rows = []
    for l in b["links"]:
        ip = l["iperf3_gbit_per_s"] or {}
        ips = " / ".join(f2(ip.get(k)) for k in ("worker_to_switch", "switch_to_worker", "worker_to_worker"))
        sw = l["switch"]
        rows.append([l["link"], "switch", fmt(sw["best_s"]), fmt(sw["median_s"]), fmt(sw["mean_s"]),
                     f2(sw["gbit_per_s_slowest_rank"]), ips])
        for key, label in (("gloo", "gloo (TSO on)"), ("openmpi", "OpenMPI"),
                           ("openmpi_tso", "OpenMPI, worker tx offload on (TSO)")):
            p = l.get(key)
            if not p:
                continue
            gbps = p["bytes"] * 8 / p["mean_s"] / 1e9 if p.get("bytes") and p.get("mean_s") else None
            rows.append([l["link"], label, fmt(p.get("best_s")), fmt(p.get("median_s")), fmt(p.get("mean_s")),
                         f2(gbps), ""])
    lines = [markdown_table(["link", "method", " best s", " median s", " mean s", " mean Gbit/s",
                             "iperf3 up/down/w2w Gbit/s"], rows)]
    h, lr, lk = b["headline"], b["line_rate_1gbit"], b["links"]

    def met(x):
        return "met" if x else "NOT met"

    def trio(l, peer):
        rr = l[f"ratio_switch_over_{peer}"] or {}
        return f"{f2(rr.get('mean'))} (mean), {f2(rr.get('median'))} (median), {f2(rr.get('best'))} (best)"

    lines += [
        "",
        f"line-rate bound at 1 Gbit/s: {fmt(lr['bound_l2_s'])} s (MTU {b['setup']['mtu']}, L2, "
        f"{lr['frame_bytes']} B RESULT frames of {lr['elems_per_chunk']} floats, as tc counts), {fmt(lr['bound_l1_s'])} s (L1)",
    ]
    if lk[0]["gloo"]:
        lines += [
            f"switch / gloo, unlimited: {trio(lk[0], 'gloo')}",
            f"switch / gloo, 1 Gbit/s:  {trio(lk[1], 'gloo')}; goal <= 0.67: {met(h['switch_over_gloo_1gbit_goal_met'])}",
        ]
    lines += [
        f"switch / OpenMPI, unlimited: {trio(lk[0], 'openmpi')}",
        f"switch / OpenMPI, 1 Gbit/s:  {trio(lk[1], 'openmpi')}; goal <= 0.67: {met(h['switch_over_openmpi_1gbit_goal_met'])}",
        f"switch / OpenMPI with TSO: {f2(h['switch_over_openmpi_tso_unlimited'])} unlimited, "
        f"{f2(h['switch_over_openmpi_tso_1gbit'])} at 1 Gbit/s (mean)",
        f"switch / line rate, 1 Gbit/s: {f2(h['switch_over_line_rate_1gbit'])} (mean), "
        f"{f2(h['switch_over_line_rate_1gbit_median'])} (median); goal <= 1.10: {met(h['switch_over_line_rate_goal_met'])}",
    ]
    if b["per_packet"]:
        sizes = ", ".join(f"{s['elems']} floats {f2(s['engine_over_copy'])}" for s in b["per_packet"]["sizes"])
        lines.append(f"per DATA packet / copy of its payload (criterion medians): {sizes}; goal <= 1.5 at "
                     f"362 floats: {met((h['per_packet_engine_over_copy_362'] or 1e9) <= 1.5)}")
    for l in lk:
        if l["link"] != "1gbit":
            continue
        sh = l["switch"]["shapers"]
        we, wi = sh.get("worker_egress", {}), sh.get("worker_ingress_ifb", {})
        lines.append(f"1 Gbit/s shapers, switch runs: {f2(we.get('over_expected'))}x / {f2(wi.get('over_expected'))}x "
                     f"the frames due crossed worker egress / ingress (ifb); tbf overlimits {we.get('overlimits')} / "
                     f"{wi.get('overlimits')}, drops {we.get('drops')} / {wi.get('drops')}")
        osh = (l["openmpi"] or {}).get("shapers") or {}
        lines.append("1 Gbit/s shapers, OpenMPI: tbf overlimits "
                     f"{osh.get('worker_egress', {}).get('overlimits')} egress / "
                     f"{osh.get('switch_port_egress', {}).get('overlimits')} switch port / "
                     f"{osh.get('worker_ingress_ifb', {}).get('overlimits')} ingress (ifb)")

    def pct(p):
        v = (p or {}).get("cpu_busy_fraction")
        return f"{round(v * 100)}%" if v is not None else "–"

    lines.append("CPU busy (all cores, whole phase incl. start-up): " + ", ".join(
        f"{l['link']} switch {pct(l['switch'])} / gloo {pct(l['gloo'])} / OpenMPI {pct(l['openmpi'])} "
        f"/ with TSO {pct(l['openmpi_tso'])}" for l in lk))
    m = b["machine"]
    lines.append(f"machine: {m['nproc']} cores ({m['cpu_model']}), {f2(m['mem_total_kib'] / 1048576)} GiB, "
                 f"kernel {m['kernel']}; 1-min load {m['loadavg_1min']['start']} at start, "
                 f"{m['loadavg_1min']['end']} at end")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pe = sub.add_parser("peer", help="an OpenMPI or gloo phase to TAG.result.json")
    pe.add_argument("dir")
    pe.add_argument("tag")
    pe.add_argument("--output", required=True, help="the file rank 0's JSON line is in")
    s = sub.add_parser("switch", help="the switch phase to switch.raw.json and switch.result.json")
    s.add_argument("dir")
    s.add_argument("--repeats", type=int, required=True)
    s.add_argument("--elements", type=int, required=True)
    s.add_argument("--workers", type=int, required=True)
    r = sub.add_parser("report", help="the run's JSON and table")
    r.add_argument("run")
    r.add_argument("--json", required=True)
    r.add_argument("--table", required=True)
    r.add_argument("--stamp", required=True)
    r.add_argument("--repo", required=True)
    r.add_argument("--mib", type=int, required=True)
    r.add_argument("--repeats", type=int, required=True)
    r.add_argument("--workers", type=int, required=True)
    r.add_argument("--mtu", type=int, required=True)
    r.add_argument("--rate-bps", type=float, required=True)
    r.add_argument("--load-start", type=float, required=True)
    r.add_argument("--openmpi-version", default="")
    r.add_argument("--quick", action="store_true")
    r.add_argument("--rates", action="store_true", help="the run measured packet rates")
    ro = sub.add_parser("rates-only", help="the JSON of a --rates-only run")
    co = sub.add_parser("cores-only", help="the JSON of a --cores-only run")
    for x in (ro, co):
        x.add_argument("--json", required=True)
        x.add_argument("--stamp", required=True)
        x.add_argument("--repo", required=True)
        x.add_argument("--rates", required=True, help="rates/rates.json")
    co.add_argument("--threads-json", required=True, help="threads/threads.json")
    co.add_argument("--mib", type=int, required=True)
    co.add_argument("--repeats", type=int, required=True)
    co.add_argument("--workers", type=int, required=True)
    co.add_argument("--mtu", type=int, required=True)
    co.add_argument("--load-start", type=float, required=True)
    a = p.parse_args()
    try:
        if a.cmd == "peer":
            write_json(os.path.join(a.dir, f"{a.tag}.result.json"), peer_result(a.dir, a.tag, a.output))
            return 0
        if a.cmd == "switch":
            raw = switch_raw(a.dir, a.repeats, a.workers)
            write_json(os.path.join(a.dir, "switch.raw.json"), raw)
            write_json(os.path.join(a.dir, "switch.result.json"), switch_stats(raw, a.repeats, a.elements))
            return 0
    except ReportError as e:
        print(f"bench_report.py {a.cmd}: {e}", file=sys.stderr)
        return 1
    if a.cmd == "rates-only":
        write_json(a.json, rates_only(a))
        return 0
    if a.cmd == "cores-only":
        write_json(a.json, cores_only(a))
        return 0
    b = build(a)
    write_json(a.json, b)
    with open(a.table, "w") as f:
        f.write(table(b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
