#!/usr/bin/env python3
"""bench_threads_report.py: the switch's all-reduce time with 1, 2, ...
dataplane threads, as scripts/bench allreduce measured it (its "threads" section).

Usage: bench/harness/bench_threads_report.py DIR THREADS OUT_JSON

THREADS is a comma-separated list (e.g. 1,2). For each T, DIR/tT/ holds
switch.result.json (the allreduce scenario's run_switch summary: mean/best/median seconds
of the slowest rank) and ethtool-sw-wI.txt (`ethtool -S` of switch port I
after the runs: veth's per-queue counters rx_queue_N_xdp_redirect, the
frames the XDP program handed to the socket on queue N). Thread T owns
queue T of every port when queues = threads (switchd deals its sockets
port by port, round-robin), so the frames per queue are the frames per
thread.

Writes OUT_JSON:
  {"allreduce_threads": {"T": mean s, ...},
   "time_over_1_thread": {"T": mean s with T / mean s with 1, ...},
   "runs": [{threads, queues, mean_s, best_s, median_s, worst_s,
             gbit_per_s_slowest_rank, chunks_resent_multi_run,
             frames_per_queue}, ...]}
and prints the same as a Markdown table.
"""

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import fmt, markdown_table  # noqa: E402

QUEUE_COUNTER = re.compile(r"^\s*rx_queue_(\d+)_xdp_redirect:\s*(\d+)\s*$")


def frames_per_queue(run_dir: Path) -> list:
    """Sum over the switch ports of each receive queue's XDP redirects."""
    per_queue = {}
    for f in sorted(run_dir.glob("ethtool-sw-w*.txt")):
        for line in f.read_text().splitlines():
            m = QUEUE_COUNTER.match(line)
            if m:
                q = int(m.group(1))
                per_queue[q] = per_queue.get(q, 0) + int(m.group(2))
    return [per_queue[q] for q in sorted(per_queue)]


def load_run(run_dir: Path, threads: int) -> dict:
    path = run_dir / "switch.result.json"
    try:
        sw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench_threads_report.py: cannot read {path}: {e}")
    return {
        "threads": threads,
        "queues": threads,
        "mean_s": sw["mean_s"],
        "best_s": sw["best_s"],
        "median_s": sw["median_s"],
        "worst_s": sw["worst_s"],
        "gbit_per_s_slowest_rank": sw["gbit_per_s_slowest_rank"],
        "chunks_resent_multi_run": sw.get("chunks_resent_multi_run"),
        "frames_per_queue": frames_per_queue(run_dir),
    }


def main(argv) -> int:
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    top, out = Path(argv[1]), Path(argv[3])
    try:
        threads = [int(t) for t in argv[2].split(",")]
    except ValueError:
        print(f"bench_threads_report.py: THREADS must be like 1,2,4; got {argv[2]!r}",
              file=sys.stderr)
        return 2
    runs = [load_run(top / f"t{t}", t) for t in threads]
    base = next((r["mean_s"] for r in runs if r["threads"] == 1), None)
    over = {str(r["threads"]): (r["mean_s"] / base if base else None) for r in runs}
    report = {
        "allreduce_threads": {str(r["threads"]): r["mean_s"] for r in runs},
        "time_over_1_thread": over,
        "runs": runs,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")

    print(markdown_table(
        [" dataplane threads (= queues)", " mean s", " best s", " median s", " slowest rank Gbit/s",
         " time / 1 thread", "frames per queue (thread)"],
        [[str(r["threads"]), fmt(r["mean_s"]), fmt(r["best_s"]), fmt(r["median_s"]),
          fmt(r["gbit_per_s_slowest_rank"], 2), fmt(over[str(r["threads"])], 2),
          " / ".join(str(n) for n in r["frames_per_queue"])] for r in runs]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
