#!/usr/bin/env python3
"""bench_rates_report.py: scripts/bench allreduce's packet-rate section: the rate
of each run, the median over the repeats, the ratios, rates.json and the
table, from the raw files the shell left in the rates folder.

Per repeat K of a measurement TAG the shell leaves in DIR:
  TAG-genK.json             aggblast's JSON (seconds, sent_per_s, ...)
  TAG-stats-beforeK.json    `switchctl --json stats` before the blast
  TAG-stats-afterK.json     the same after it (and 0.3 s of settling)
  TAG-switchd-beforeK.stat  /proc/PID/stat of switchd before the blast
  TAG-switchd-afterK.stat   the same after it

Commands:
  open DIR TAG --repeats R      an open-loop measurement (xdp_drop, echo,
                                echo64): rate = counter delta / generator
                                seconds; writes DIR/TAG-K.json, DIR/TAG.json
                                and prints one line for the log
  agg DIR RANKS THREADS --repeats R
                                a closed-loop aggregation run (tag
                                agg-nRANKS-tTHREADS); the same
  report DIR --threads 1,2 --ranks 2,4,8 ...
                                DIR/rates.json (setup, every measurement,
                                the headline ratios) and the Markdown table
                                on stdout

The counter of each measurement: XDP_DROP the XDP program's dropped counter
of port 0, echo switchd's echoed counter, aggregation switchd's received
frames. switchd's CPU is utime + stime of all its threads (benchkit); a
run's packets per switchd CPU-second is left out (null) when switchd used
under 0.05 CPU-seconds, and the median of those is null when any run's is.
Medians are benchkit's (the mean of the middle two for an even count).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import (  # noqa: E402
    CLK_TCK, fmt, load_json, markdown_table, median, nproc, proc_jiffies, ratio, write_json)

# Each open-loop measurement's counter: the jq path recorded in the JSON
# (as before) and the keys that reach it in switchctl's stats.
OPEN_COUNTERS = {
    "xdp_drop": (".ports[0].xdp_dropped", ("ports", 0, "xdp_dropped")),
    "echo": (".echoed", ("echoed",)),
    "echo64": (".echoed", ("echoed",)),
}
AGG_COUNTER = ("rx_frames",)
MIN_CPU_S = 0.05


class RatesError(Exception):
    pass


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise RatesError(f"cannot read {path}: {e.strerror}") from None


def _json(path):
    v = load_json(path)
    if not isinstance(v, dict):
        raise RatesError(f"{path} is missing or not a JSON object")
    return v


def counter(stats, keys, path):
    v = stats
    for k in keys:
        try:
            v = v[k]
        except (KeyError, IndexError, TypeError):
            raise RatesError(f"{path} has no counter {'.'.join(map(str, keys))}") from None
    return v


def one_run(d, tag, k, keys):
    """Repeat k of TAG: the generator's JSON plus the counter delta, its
    rate and switchd's CPU."""
    gen = _json(os.path.join(d, f"{tag}-gen{k}.json"))
    before_p = os.path.join(d, f"{tag}-stats-before{k}.json")
    after_p = os.path.join(d, f"{tag}-stats-after{k}.json")
    delta = counter(_json(after_p), keys, after_p) - counter(_json(before_p), keys, before_p)
    cpu = (proc_jiffies(_read(os.path.join(d, f"{tag}-switchd-after{k}.stat")))
           - proc_jiffies(_read(os.path.join(d, f"{tag}-switchd-before{k}.stat")))) / CLK_TCK
    secs = gen.get("seconds")
    if not secs:
        raise RatesError(f"{tag}-gen{k}.json has no generator seconds")
    return gen, delta, delta / secs, cpu, delta / cpu if cpu > MIN_CPU_S else None


def _sum(xs):
    """Sum of the values present (jq's add), None when there are none."""
    xs = [x for x in xs if x is not None]
    return sum(xs) if xs else None


def _median_all(xs):
    """Median, or None when any value is missing."""
    return None if any(x is None for x in xs) else median(xs)


def open_measurement(d, tag, repeats):
    jq_path, keys = OPEN_COUNTERS[tag]
    runs = []
    for k in range(1, repeats + 1):
        gen, delta, pps, cpu, per_cpu = one_run(d, tag, k, keys)
        run = {**gen, "counter_delta": delta, "rate_pps": pps, "switchd_cpu_s": cpu,
               "pps_per_switchd_cpu_s": per_cpu}
        write_json(os.path.join(d, f"{tag}-{k}.json"), run)
        runs.append(run)
    pps = [r["rate_pps"] for r in runs]
    return {
        "frame_bytes": runs[0].get("frame_bytes"),
        "counter": jq_path,
        "pps": median(pps),
        "pps_runs": pps,
        "pps_best": max(pps),
        "generator_sent_pps": median([r.get("sent_per_s") for r in runs]),
        "switchd_cpu_s": [r["switchd_cpu_s"] for r in runs],
        "pps_per_switchd_cpu_s": _median_all([r["pps_per_switchd_cpu_s"] for r in runs]),
        "generator_refused": _sum(r.get("frames_refused") for r in runs),
    }


def agg_measurement(d, ranks, threads, repeats):
    tag = f"agg-n{ranks}-t{threads}"
    runs = []
    for k in range(1, repeats + 1):
        gen, delta, pps, cpu, per_cpu = one_run(d, tag, k, AGG_COUNTER)
        run = {**gen, "switch_rx_frames": delta, "switch_rx_pps": pps, "switchd_cpu_s": cpu,
               "pps_per_switchd_cpu_s": per_cpu}
        write_json(os.path.join(d, f"{tag}-{k}.json"), run)
        runs.append(run)

    def med(key):
        return median([r.get(key) for r in runs])

    def total(key):
        return _sum(r.get(key) for r in runs)

    data = [r.get("data_per_s") for r in runs]
    return {
        "ranks": runs[0].get("ranks"),
        "threads": threads,
        "elems_per_chunk": runs[0].get("elems_per_chunk"),
        "window": runs[0].get("window"),
        "data_pps": median(data),
        "data_pps_runs": data,
        "data_pps_best": max((x for x in data if x is not None), default=None),
        "chunks_per_s": med("chunks_per_s"),
        "contributed_elems_per_s": med("contributed_elems_per_s"),
        "result_elems_per_s": med("result_elems_per_s"),
        "switch_rx_pps": med("switch_rx_pps"),
        "switchd_cpu_s": [r["switchd_cpu_s"] for r in runs],
        "pps_per_switchd_cpu_s": _median_all([r["pps_per_switchd_cpu_s"] for r in runs]),
        "seq_resends": total("seq_resends"),
        "data_sent": total("data_sent"),
        "ece_results": total("ece_results"),
        "verify_checked": total("verify_checked"),
        "verify_failed": total("verify_failed"),
    }


def headline(drop, echo, agg):
    """The ratios: aggregation against echo (1 thread), echo against
    XDP_DROP, and T threads against 1 thread per job size."""
    drop, echo = drop or {}, echo or {}
    a1 = [a for a in agg if a["threads"] == 1]
    one = {a["ranks"]: a["data_pps"] for a in a1}

    def by_ranks(rows, f):
        return {str(a["ranks"]): f(a) for a in rows}

    over_one = {}
    for a in agg:
        if a["threads"] > 1:
            over_one.setdefault(str(a["threads"]), {})[str(a["ranks"])] = ratio(
                a["data_pps"], one.get(a["ranks"]))
    return {
        "agg_over_echo_pps": by_ranks(a1, lambda a: ratio(a["data_pps"], echo.get("pps"))),
        "agg_over_echo_pps_4_ranks": ratio(one.get(4), echo.get("pps")),
        "agg_over_echo_goal": 0.9,
        "agg_over_echo_pps_best": by_ranks(a1, lambda a: ratio(a["data_pps_best"], echo.get("pps_best"))),
        "agg_over_echo_per_switchd_cpu_s": by_ranks(
            a1, lambda a: ratio(a["pps_per_switchd_cpu_s"], echo.get("pps_per_switchd_cpu_s"))),
        "echo_over_xdp_drop": ratio(echo.get("pps"), drop.get("pps")),
        "two_over_one_thread": over_one.get("2", {}),
        "over_one_thread": over_one,
    }


def load_average():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def report(a):
    d = a.dir
    drop = load_json(os.path.join(d, "xdp_drop.json"))
    echo = _json(os.path.join(d, "echo.json"))
    echo64 = _json(os.path.join(d, "echo64.json"))
    agg = [_json(os.path.join(d, f"agg-n{n}-t{t}.json")) for t in a.threads for n in a.ranks]
    return {
        "setup": {
            "testbed": f"one generator namespace, veth with {a.queues} queues to switch port sw-w0",
            "seconds_per_run": a.seconds, "repeats": a.repeats, "statistic": "median of the repeats",
            "generator": "aggblast --spread-queues (AF_PACKET raw frames, sendmmsg, no PACKET_QDISC_BYPASS so "
                         f"that the flow hash picks the veth queue); {a.flows} flows (source ports) in open loop, "
                         "one per rank in aggregation",
            "pinning": f"switchd dataplane thread 0 on CPU 0, generator on CPU {a.gen_cpu}; a 2nd dataplane "
                       "thread is pinned to CPU 1 and shares it with the generator",
            "nproc": nproc(),
            "loadavg_1min": {"start": a.load_start, "end": load_average()},
            "closed_loop_window": f"seqs in flight = min(switch window 256, {a.inflight} / ranks): at most "
                                  f"{a.inflight} DATA frames in flight",
            "elements_per_s_definition": "contributed = chunks completed/s x elements per chunk x ranks "
                                         "(float32 inputs summed); result = chunks/s x elements per chunk",
        },
        "xdp_drop": drop,
        "echo": echo,
        "echo_64": echo64,
        "aggregate": agg,
        "headline": headline(drop, echo, agg),
    }


def _r0(x):
    return fmt(round(x)) if x is not None else fmt(None)


def _f2(x):
    return fmt(x, 2)


def _ranks(m):
    return ", ".join(f"{k} ranks {_f2(v)}" for k, v in m.items())


def table(r):
    """The rate section as Markdown: one row per measurement, then the ratios."""
    rows = []
    d = r["xdp_drop"]
    if d:
        rows.append(["XDP_DROP (in the XDP program)", str(d["frame_bytes"]), "–",
                     f"{_r0(d['pps'])} ({_r0(d['pps_best'])})", "–", "", "", ""])
    else:
        rows.append(["XDP_DROP", "–", "–", "not measured", "", "", "", ""])
    for e in (r["echo"], r["echo_64"]):
        rows.append(["AF_XDP echo", str(e["frame_bytes"]), "1", f"{_r0(e['pps'])} ({_r0(e['pps_best'])})",
                     _r0(e["pps_per_switchd_cpu_s"]), "", "", ""])
    for a in r["aggregate"]:
        m = a["contributed_elems_per_s"]
        rows.append([f"aggregate, {a['ranks']} ranks", "1512", str(a["threads"]),
                     f"{_r0(a['data_pps'])} ({_r0(a['data_pps_best'])})", _r0(a["pps_per_switchd_cpu_s"]),
                     _r0(a["chunks_per_s"]), fmt(m / 1e6 if m is not None else None),
                     fmt(a["seq_resends"])])
    h, s = r["headline"], r["setup"]
    lines = [
        markdown_table(["measurement", " frame B", " threads", " pps median (best)", " pps per switchd CPU-s",
                        " chunks/s", " float32 contributed/s (M)", " resends"], rows),
        "",
        f"aggregation DATA pps / echo pps (1 thread): {_ranks(h['agg_over_echo_pps'])}; goal >= 0.9",
        f"the same, best runs: {_ranks(h['agg_over_echo_pps_best'])}",
        "the same per switchd CPU-second (less disturbed by other load): "
        f"{_ranks(h['agg_over_echo_per_switchd_cpu_s'])}",
        f"echo / XDP_DROP: {_f2(h['echo_over_xdp_drop'])}",
    ]
    lines += [f"{t} threads / 1 thread: {_ranks(m)}" for t, m in h["over_one_thread"].items()]
    lines.append(f"1-min load average {s['loadavg_1min']['start']} at start, {s['loadavg_1min']['end']} at end "
                 f"of the rate section ({s['nproc']} cores)")
    return "\n".join(lines) + "\n"


def _ints(text):
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want comma-separated counts like 1,2, got '{text}'") from None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("open", help="one open-loop measurement")
    o.add_argument("dir")
    o.add_argument("tag", choices=sorted(OPEN_COUNTERS))
    o.add_argument("--repeats", type=int, required=True)
    g = sub.add_parser("agg", help="one aggregation measurement")
    g.add_argument("dir")
    g.add_argument("ranks", type=int)
    g.add_argument("threads", type=int)
    g.add_argument("--repeats", type=int, required=True)
    r = sub.add_parser("report", help="rates.json and the table")
    r.add_argument("dir")
    r.add_argument("--threads", type=_ints, required=True)
    r.add_argument("--ranks", type=_ints, required=True)
    r.add_argument("--seconds", type=int, required=True)
    r.add_argument("--repeats", type=int, required=True)
    r.add_argument("--queues", type=int, required=True)
    r.add_argument("--flows", type=int, required=True)
    r.add_argument("--inflight", type=int, required=True)
    r.add_argument("--gen-cpu", required=True, help='the generator\'s CPU, or "none"')
    r.add_argument("--load-start", type=float, required=True)
    a = p.parse_args(argv)
    try:
        if a.cmd == "open":
            m = open_measurement(a.dir, a.tag, a.repeats)
            write_json(os.path.join(a.dir, f"{a.tag}.json"), m)
            print(f"{a.tag}: {_r0(m['pps'])} pps (generator sent {_r0(m['generator_sent_pps'])} pps)")
        elif a.cmd == "agg":
            m = agg_measurement(a.dir, a.ranks, a.threads, a.repeats)
            write_json(os.path.join(a.dir, f"agg-n{a.ranks}-t{a.threads}.json"), m)
            print(f"aggregate, {a.ranks} ranks, {a.threads} thread(s): {_r0(m['data_pps'])} DATA/s, "
                  f"{_r0(m['chunks_per_s'])} chunks/s")
        else:
            r = report(a)
            write_json(os.path.join(a.dir, "rates.json"), r)
            sys.stdout.write(table(r))
    except RatesError as e:
        print(f"bench_rates_report.py {a.cmd}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
