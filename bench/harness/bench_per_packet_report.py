#!/usr/bin/env python3
"""bench_per_packet_report.py: `scripts/bench per-packet`'s result and
table from criterion's estimates.

Usage: bench_per_packet_report.py CRITERION_DIR --secs S --cpu N [--json FILE]

CRITERION_DIR is target/criterion/data_packet; for each size E in 64, 256,
362 and 870 floats it holds KIND/E/new/estimates.json for the kinds engine,
copy and sum_only. Each row takes criterion's median (ns per packet) of
each kind, engine / copy (the goal is <= 1.5), sum_only / copy, and the
protocol work, engine - sum_only. Writes the JSON to FILE when given and
prints the Markdown table.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import fmt, load_json, markdown_table, write_json  # noqa: E402

SIZES = (64, 256, 362, 870)
KINDS = ("engine", "copy", "sum_only")
GOAL = 1.5


class PerPacketError(Exception):
    pass


def criterion_median(d, kind, elems):
    path = os.path.join(d, kind, str(elems), "new", "estimates.json")
    est = load_json(path)
    try:
        return float(est["median"]["point_estimate"])
    except (TypeError, KeyError, ValueError):
        raise PerPacketError(f"criterion wrote no median in {path}") from None


def result(d, secs, cpu):
    sizes = []
    for e in SIZES:
        eng, cp, so = (criterion_median(d, k, e) for k in KINDS)
        if cp <= 0:
            raise PerPacketError(f"criterion's copy median for {e} floats is {cp} ns")
        sizes.append({"elems": e, "engine_ns": eng, "copy_ns": cp, "sum_only_ns": so,
                      "engine_over_copy": eng / cp, "sum_only_over_copy": so / cp,
                      "protocol_ns": eng - so})
    return {"measurement_secs": secs, "cpu": cpu, "statistic": "criterion median, ns per packet",
            "goal_engine_over_copy": GOAL, "sizes": sizes}


def table(r):
    return markdown_table(
        [" floats per packet", " engine ns", " copy ns", " sum only ns", " engine / copy", " sum only / copy",
         " protocol work ns"],
        [[str(s["elems"]), fmt(s["engine_ns"], 1), fmt(s["copy_ns"], 1), fmt(s["sum_only_ns"], 1),
          fmt(s["engine_over_copy"], 2), fmt(s["sum_only_over_copy"], 2), fmt(s["protocol_ns"], 1)]
         for s in r["sizes"]]) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("criterion_dir")
    p.add_argument("--secs", type=int, required=True)
    p.add_argument("--cpu", type=int, required=True)
    p.add_argument("--json")
    a = p.parse_args(argv)
    try:
        r = result(a.criterion_dir, a.secs, a.cpu)
    except PerPacketError as e:
        print(f"bench_per_packet_report.py: {e}", file=sys.stderr)
        return 1
    if a.json:
        write_json(a.json, r)
    sys.stdout.write(table(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
