#!/usr/bin/env python3
"""bench_transports_report.py: `scripts/bench transports`'s arithmetic:
each run's JSON line from the raw files the scenario left, and the medians per
transport.

Commands:
  run DIR TRANSPORT RUN --workers W
      reads DIR/TRANSPORT-RUN-rankR.json (each worker's --json report) and
      DIR/TRANSPORT-RUN.before, .after (the window's edges: "wall SECONDS",
      "stat <the cpu line of /proc/stat>", "switchd </proc/PID/stat>" and
      "children <the children's line of bash's `times`>", one a line); prints
      the run's JSON line.
  summary RUNS_JSONL
      one JSON line per transport (sorted by name): the medians over its runs.

A run's figures: seconds = the slowest rank's; cpu_s = busy CPU-seconds of
the whole machine over the window (benchkit's definition); wall_s = the
window; workers_cpu_s = user + system of the workers (the shell's waited-for
children, with the softirq work their sends run inline); switchd_cpu_s =
switchd's utime + stime; the coalescing and resend counters summed over the
ranks. Medians are benchkit's (the mean of the middle two for an even count).
"""

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import CLK_TCK, busy_seconds, median, proc_jiffies  # noqa: E402

TIMES = re.compile(r"^(\d+)m([0-9.]+)s$")


class TransportsError(Exception):
    pass


def times_seconds(line):
    """User + system seconds of one line of bash's `times` ("0m1.250s 0m0.030s")."""
    parts = line.split()
    if len(parts) != 2:
        raise TransportsError(f"not a line of `times`: {line!r}")
    total = 0.0
    for p in parts:
        m = TIMES.match(p)
        if not m:
            raise TransportsError(f"not a line of `times`: {line!r}")
        total += int(m.group(1)) * 60 + float(m.group(2))
    return total


def edge(path):
    """One edge of a run's window: {"wall": ..., "stat": ..., ...}."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise TransportsError(f"cannot read {path}: {e.strerror}") from None
    out = {}
    for line in lines:
        key, _, value = line.partition(" ")
        out[key] = value
    missing = {"wall", "stat", "switchd", "children"} - out.keys()
    if missing:
        raise TransportsError(f"{path} lacks {', '.join(sorted(missing))}")
    return out


def _sum(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) if xs else None


def one_run(d, transport, run, workers):
    ranks = []
    for r in range(workers):
        p = os.path.join(d, f"{transport}-{run}-rank{r}.json")
        try:
            with open(p) as f:
                ranks.append(json.loads(f.read().strip().splitlines()[-1]))
        except (OSError, ValueError, IndexError):
            raise TransportsError(f"rank {r} left no JSON report in {p}") from None
    a = edge(os.path.join(d, f"{transport}-{run}.before"))
    b = edge(os.path.join(d, f"{transport}-{run}.after"))

    def stat_sum(key):
        return _sum((x.get("stats") or {}).get(key) for x in ranks)

    return {
        "transport": transport,
        "ran": sorted({x.get("transport") for x in ranks if x.get("transport") is not None}),
        "run": run,
        "seconds": max(x["seconds"] for x in ranks),
        "cpu_s": busy_seconds(a["stat"], b["stat"]),
        "wall_s": round(float(b["wall"]) - float(a["wall"]), 3),
        # `times` has millisecond resolution; the round drops float noise.
        "workers_cpu_s": round(times_seconds(b["children"]) - times_seconds(a["children"]), 3),
        "switchd_cpu_s": (proc_jiffies(b["switchd"]) - proc_jiffies(a["switchd"])) / CLK_TCK,
        "tx_coalesced": stat_sum("tx_coalesced"),
        "rx_coalesced": stat_sum("rx_coalesced"),
        "chunks_sent": stat_sum("chunks_sent"),
        "resent": stat_sum("chunks_resent"),
        # The straggler hold's (None from a worker without it).
        "held_timeouts": stat_sum("held_timeouts"),
        "hold_probes": stat_sum("hold_probes"),
    }


def summary(runs):
    """The medians per transport, sorted by its name."""
    groups = {}
    for r in runs:
        groups.setdefault(r["transport"], []).append(r)
    return [
        {"transport": t,
         "runs": len(rs),
         "median_seconds": median([r["seconds"] for r in rs]),
         "median_cpu_s": median([r["cpu_s"] for r in rs]),
         "median_workers_cpu_s": median([r["workers_cpu_s"] for r in rs]),
         "median_switchd_cpu_s": median([r["switchd_cpu_s"] for r in rs])}
        for t, rs in sorted(groups.items())
    ]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("run", help="one run's JSON line")
    o.add_argument("dir")
    o.add_argument("transport")
    o.add_argument("run", type=int)
    o.add_argument("--workers", type=int, required=True)
    s = sub.add_parser("summary", help="medians per transport")
    s.add_argument("runs_jsonl")
    a = p.parse_args(argv)
    try:
        if a.cmd == "run":
            print(json.dumps(one_run(a.dir, a.transport, a.run, a.workers), separators=(",", ":")))
        else:
            with open(a.runs_jsonl) as f:
                runs = [json.loads(line) for line in f if line.strip()]
            if not runs:
                raise TransportsError(f"no runs in {a.runs_jsonl}")
            for line in summary(runs):
                print(json.dumps(line, separators=(",", ":")))
    except (TransportsError, OSError, ValueError) as e:
        print(f"bench_transports_report.py {a.cmd}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
