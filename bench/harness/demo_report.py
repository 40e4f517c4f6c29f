#!/usr/bin/env python3
"""demo_report.py: the closing tables of scripts/demo (modes single and
tree, bench/harness/demos/), and its full JSON.

Usage: bench/harness/demo_report.py WORK_DIR --workers N --status S0,S1,..
           --switchd-status RC --ping TEXT --json OUT.json
           [--stats STATS.json] [--mib S] [--iterations K] [--job J]

WORK_DIR is the demo's run folder: workerI.json (the last JSON line of
`worker allreduce --json`) and workerI.log (its stderr). STATS.json
(default WORK_DIR/stats.json) is switchd's --stats-file, written on exit.
--status holds each rank's exit
status (a number, or "timeout"), --switchd-status switchd's.

Prints one table row per rank (exit status, time, Gbit/s, chunks/s, chunks
resent, verified), a total row, then the switch's counters (frames received
and sent, chunks aggregated, retransmits served, drops and malformed frames
by kind, when any), the ping result and where the full JSON went. Times and
rates have 3 significant digits (k, M, G prefixes for chunks/s); counters
are exact. Writes OUT.json: the
run's parameters, every worker's full report and switchd's full stats.

Exit status: 0 when every rank exited 0 and reported "verified": true, 1
otherwise (the tables are printed either way), 2 on bad usage.
Standard library only.
"""

import argparse
import json
import math
import os
import sys


def last_json(path):
    """The last line of `path` that parses as a JSON object, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def tail(path, n):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()[-n:]
    except OSError:
        return []


def sig(x, digits=3):
    """`x` with `digits` significant digits, no exponent: 2.17, 21.7, 217,
    0.00217; from 10**digits on, all the integer digits (2171)."""
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    decimals = max(digits - 1 - math.floor(math.log10(abs(x))), 0)
    return f"{x:.{decimals}f}"


def si(x, digits=3):
    """`x` with 3 significant digits and a k, M or G prefix: 12.3 k."""
    if isinstance(x, (int, float)) and math.isfinite(x):
        for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(x) >= scale:
                return f"{sig(x / scale, digits)} {prefix}"
    return sig(x, digits)


def with_unit(x, unit, digits=3):
    s = sig(x, digits)
    return s if s == "-" else f"{s} {unit}"


def count(x):
    """An exact counter with thousands separators, or '-' when missing."""
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else "-"


def table(rows, right):
    """Rows of strings as aligned columns; columns in `right` right-aligned."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [
            r[c].rjust(widths[c]) if c in right else r[c].ljust(widths[c])
            for c in range(len(r))
        ]
        out.append("  ".join(cells).rstrip())
    return out


def nonzero(mapping):
    """'a 3, b 1' for the non-zero entries of a {name: count} map."""
    if not isinstance(mapping, dict):
        return ""
    items = [(k, v) for k, v in mapping.items() if isinstance(v, int) and v]
    items.sort(key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{k} {v:,}" for k, v in items)


def worker_rows(args, statuses):
    """(table rows, reports, all ok)."""
    header = ["rank", "exit", "time", "throughput", "chunks/s", "resent", "verified"]
    rows = [header]
    reports = []
    all_ok = True
    for i in range(args.workers):
        st = statuses[i] if i < len(statuses) else "?"
        rep = last_json(os.path.join(args.work, f"worker{i}.json"))
        reports.append(rep)
        if rep is None:
            rows.append([str(i), st, "-", "-", "-", "-", "no report"])
            all_ok = False
            continue
        verified = rep.get("verified")
        ok = st == "0" and verified is True
        all_ok = all_ok and ok
        mism = rep.get("mismatches")
        vtext = (
            "yes"
            if verified is True
            else (f"NO ({mism:,} differ)" if isinstance(mism, int) and mism else "NO")
        )
        stats = rep.get("stats") if isinstance(rep.get("stats"), dict) else {}
        rows.append(
            [
                str(i),
                st,
                with_unit(rep.get("seconds"), "s"),
                with_unit(rep.get("gbit_per_s"), "Gbit/s"),
                si(rep.get("chunks_per_s")),
                count(stats.get("chunks_resent")),
                vtext,
            ]
        )
    return rows, reports, all_ok


def total_row(reports):
    got = [r for r in reports if r is not None]
    if not got:
        return None

    def nums(key):
        return [r[key] for r in got if isinstance(r.get(key), (int, float))]

    secs, gbps, cps = nums("seconds"), nums("gbit_per_s"), nums("chunks_per_s")
    resent = [
        r["stats"]["chunks_resent"]
        for r in got
        if isinstance(r.get("stats"), dict)
        and isinstance(r["stats"].get("chunks_resent"), int)
    ]
    return [
        "all",
        "",
        "max " + with_unit(max(secs), "s") if secs else "-",
        "sum " + with_unit(sum(gbps), "Gbit/s") if gbps else "-",
        "sum " + si(sum(cps)) if cps else "-",
        count(sum(resent)) if resent else "-",
        "",
    ]


def switch_lines(stats, job_id):
    if not isinstance(stats, dict):
        return ["  none: switchd wrote no stats file"]
    jobs = stats.get("jobs") if isinstance(stats.get("jobs"), list) else []
    job = next((j for j in jobs if isinstance(j, dict) and j.get("id") == job_id), None)
    rows = [
        ["frames received", count(stats.get("rx_frames")), ""],
        ["frames sent", count(stats.get("tx_frames")), ""],
    ]
    if job is None:
        rows.append(["chunks aggregated", "-", f"job {job_id} missing from the stats"])
    else:
        agg = job.get("bytes_aggregated")
        note = f"{with_unit(agg / 2**20, 'MiB')} aggregated" if isinstance(agg, int) else ""
        rows.append(["chunks aggregated", count(job.get("chunks_completed")), note])
        rows.append(["retransmits served", count(job.get("retransmits_served")), ""])
        drops = job.get("drops") if isinstance(job.get("drops"), dict) else {}
        total = sum(v for v in drops.values() if isinstance(v, int))
        rows.append(["drops", count(total) if drops else "-", nonzero(drops)])
    malformed = stats.get("malformed")
    rows.append(
        ["malformed frames", count(stats.get("malformed_total")), nonzero(malformed)]
    )
    rows.append(["unknown-job frames", count(stats.get("unknown_job")), ""])
    rows.append(["tx ring full", count(stats.get("tx_ring_full")), ""])
    return ["  " + line for line in table(rows, right={1})]


def print_spines(spines, job_id):
    """One row per spine: chunks it summed and their share."""
    chunks = []
    for st in spines:
        jobs = st.get("jobs") if isinstance(st, dict) else None
        job = next((j for j in jobs or [] if j.get("id") == job_id), None)
        chunks.append(job.get("chunks_completed") if isinstance(job, dict) else None)
    total = sum(c for c in chunks if isinstance(c, int))
    rows = []
    for k, c in enumerate(chunks):
        if isinstance(c, int):
            share = f"{100 * c / total:.1f} %" if total else "-"
            rows.append([f"spine {k}", count(c), share])
        else:
            rows.append([f"spine {k}", "-", "no stats file"])
    for line in table(rows, right={1, 2}):
        print("  " + line)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--status", required=True, help="comma-separated exit statuses")
    p.add_argument("--switchd-status", required=True)
    p.add_argument("--ping", required=True)
    p.add_argument("--json", required=True, dest="json_out")
    p.add_argument("--stats", help="switchd's stats file (default WORK/stats.json)")
    p.add_argument("--mib", type=int)
    p.add_argument("--iterations", type=int)
    p.add_argument("--job", type=int, default=1)
    p.add_argument(
        "--spine-stats",
        action="append",
        default=[],
        help="a spine's stats file, in tree order (repeat; aggregation trees)",
    )
    args = p.parse_args()
    if args.workers < 1:
        p.error("--workers must be >= 1")
    statuses = args.status.split(",") if args.status else []

    rows, reports, all_ok = worker_rows(args, statuses)
    total = total_row(reports)
    if total is not None:
        rows.append(total)
    stats_path = args.stats or os.path.join(args.work, "stats.json")
    try:
        with open(stats_path, encoding="utf-8") as f:
            stats = json.load(f)
    except (OSError, ValueError):
        stats = None

    title = f"demo: {args.workers} workers"
    if args.mib is not None:
        title += f", {args.mib} MiB float32 each"
    if args.iterations is not None:
        title += f", {args.iterations} iterations"
    title += f", job {args.job}"
    print()
    print(f"=== {title} ===")
    print()
    print("workers (time: inside all_reduce, summed over the iterations)")
    for line in table(rows, right={2, 3, 4, 5}):
        print("  " + line)
    for i, rep in enumerate(reports):
        st = statuses[i] if i < len(statuses) else "?"
        if st != "0" or rep is None or rep.get("verified") is not True:
            lines = tail(os.path.join(args.work, f"worker{i}.log"), 5)
            if lines:
                print(f"  rank {i} stderr (last lines):")
                for line in lines:
                    print("    " + line)
    print()
    up = stats.get("uptime_secs") if isinstance(stats, dict) else None
    head = f"switch (switchd exit status {args.switchd_status}"
    head += f", up {with_unit(up, 's')})" if up is not None else ")"
    print(head)
    for line in switch_lines(stats, args.job):
        print(line)
    spines = []
    for path in args.spine_stats:
        try:
            with open(path, encoding="utf-8") as f:
                spines.append(json.load(f))
        except (OSError, ValueError):
            spines.append(None)
    if spines:
        print()
        print("spines (chunks summed at each: seq mod K)")
        print_spines(spines, args.job)
        if any(s is None for s in spines):
            all_ok = False
    print()
    print(f"ordinary traffic crossed the switch: {args.ping}")

    full = {
        "workers": args.workers,
        "mib": args.mib,
        "iterations": args.iterations,
        "job": args.job,
        "worker_status": statuses,
        "worker_reports": reports,
        "switchd_status": args.switchd_status,
        "switch_stats": stats,
        "spine_stats": spines,
        "ping": args.ping,
        "passed": all_ok,
    }
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(full, f, indent=2)
            f.write("\n")
        print(f"full JSON (worker reports, switch counters): {args.json_out}")
    except OSError as e:
        print(f"demo_report.py: could not write {args.json_out}: {e}", file=sys.stderr)
        all_ok = False
    print()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
