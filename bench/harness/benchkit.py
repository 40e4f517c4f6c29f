#!/usr/bin/env python3
"""Shared benchmark arithmetic: the one definition of busy CPU, quantiles,
tables and JSON, used by every scripts/*_report.py and by the shell scripts
(through the command line below), so that a published figure does not
depend on which script made it.

CPU accounting (docs/BENCHMARKS.md, "How CPU is counted"):
* Whole machine, from /proc/stat's aggregate "cpu" line: busy = user + nice
  + system + irq + softirq + steal; idle = idle + iowait; total = busy +
  idle. guest and guest_nice are not added: the kernel already counts them
  in user and nice, and adding them counted a VM's guest time twice.
* One process, from /proc/PID/stat: utime + stime (its own threads; the
  softirq work the kernel does while the process runs is in it, work in
  ksoftirqd or on another CPU is not: on veth a sender's transmit runs the
  receiver's softirq in the sender's context).
* Jiffies are USER_HZ ticks (os.sysconf("SC_CLK_TCK"), 100 on Linux).

Quantiles interpolate linearly between the two nearest order statistics
(numpy's default); the median is the 0.5 quantile.

Command line (for shell scripts):
    benchkit.py cpu-ticks                 prints "BUSY TOTAL" jiffies so far
    benchkit.py busy-fraction BUSY TOTAL  busy share of all CPUs since then
    benchkit.py proc-jiffies PID          utime + stime of PID so far
"""

import json
import math
import os
import re
import sys

CLK_TCK = os.sysconf("SC_CLK_TCK")

# Field indices in /proc/stat's "cpu" line, after the label.
_USER, _NICE, _SYSTEM, _IDLE, _IOWAIT, _IRQ, _SOFTIRQ, _STEAL = range(8)
BUSY_FIELDS = (_USER, _NICE, _SYSTEM, _IRQ, _SOFTIRQ, _STEAL)
IDLE_FIELDS = (_IDLE, _IOWAIT)


def cpu_fields(text):
    """The aggregate "cpu" line of /proc/stat text (or that line alone) as ints."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            f = [int(x) for x in parts[1:]]
            # Kernels before 2.6.11 had no steal; pad so the indices hold.
            return f + [0] * (8 - len(f)) if len(f) < 8 else f
    raise ValueError('no "cpu" line in /proc/stat text')


def busy_jiffies(fields):
    return sum(fields[i] for i in BUSY_FIELDS)


def total_jiffies(fields):
    return busy_jiffies(fields) + sum(fields[i] for i in IDLE_FIELDS)


def busy_fraction(before, after):
    """Busy share of all CPUs between two /proc/stat texts (or cpu lines);
    None when no time passed."""
    a, b = cpu_fields(before), cpu_fields(after)
    total = total_jiffies(b) - total_jiffies(a)
    return (busy_jiffies(b) - busy_jiffies(a)) / total if total > 0 else None


def busy_seconds(before, after):
    """Busy CPU-seconds of the whole machine between two /proc/stat texts."""
    return (busy_jiffies(cpu_fields(after)) - busy_jiffies(cpu_fields(before))) / CLK_TCK


def proc_jiffies(stat_text):
    """utime + stime of one /proc/PID/stat text."""
    # Fields after the command's closing parenthesis (the command may hold
    # spaces and parentheses); utime and stime are fields 14 and 15.
    rest = stat_text[stat_text.rindex(")") + 2:].split()
    return int(rest[11]) + int(rest[12])


def proc_seconds(stat_text):
    return proc_jiffies(stat_text) / CLK_TCK


def quantile(xs, q):
    """Linear-interpolation quantile of the values that are not None."""
    s = sorted(x for x in xs if x is not None)
    if not s:
        return None
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs):
    return quantile(xs, 0.5)


def ratio(a, b):
    """a / b, or None when either is missing or b is 0."""
    return a / b if a is not None and b else None


def fmt(x, digits=3):
    """A number for a table: fixed decimals, "–" when missing."""
    if x is None:
        return "–"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def markdown_table(headers, rows):
    """A GitHub-flavoured table; cells are formatted with fmt unless strings;
    columns whose header starts with a space are right-aligned numbers."""
    cells = [[c if isinstance(c, str) else fmt(c) for c in r] for r in rows]
    align = ["---:" if h.startswith(" ") else "---" for h in headers]
    lines = ["| " + " | ".join(h.strip() for h in headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(lines)


def write_json(path, obj):
    """Writes obj as indented JSON (NaN refused: it is not JSON)."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, allow_nan=False)
        f.write("\n")


# --- raw inputs the shell scripts leave in a run folder ---------------------


def load_json(path, default=None):
    """One JSON file, or default when it is missing or not JSON (a phase
    that was skipped or failed leaves no usable file)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def json_lines(path):
    """A JSON-lines file as a list of values; a line that is not JSON is an
    error naming the file and line (a half-written snapshot must not pass
    as zeros)."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError as e:
                    raise ValueError(f"{path}:{n}: not JSON ({e})") from None
    return out


def last_json_line(text):
    """The last line of a program's output that is a JSON object (mpirun,
    gloo and the workers print logs around theirs), or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue  # a log line that happens to start with "{"
    return None


def nproc():
    """The CPUs this process may run on, as `nproc` counts them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


# Shapers: lib.sh's `snapshot FILE` writes JSON lines, one
# {"t", "stat", "loadavg"} line with /proc/stat's cpu line, then one
# {"kind", "rank", "tc"} line per shaped device with `tc -s -j qdisc show`.
SHAPER_KINDS = ("worker_egress", "worker_ingress_ifb", "switch_port_egress")
SHAPER_COUNTERS = ("bytes", "packets", "drops", "overlimits")


def shaper_counters(snapshot):
    """Each kind's root tbf or htb counters, summed over the ranks; every
    kind and counter is present (0 where nothing is shaped)."""
    out = {k: dict.fromkeys(SHAPER_COUNTERS, 0) for k in SHAPER_KINDS}
    for line in snapshot:
        if line.get("kind") not in out:
            continue
        for q in line.get("tc") or []:
            if q.get("root") and q.get("kind") in ("tbf", "htb"):
                for c in SHAPER_COUNTERS:
                    out[line["kind"]][c] += q.get(c, 0)
    return out


def shaper_delta(before, after):
    """after - before, counter by counter, of two snapshots' shapers."""
    a, b = shaper_counters(before), shaper_counters(after)
    return {k: {c: b[k][c] - a[k][c] for c in SHAPER_COUNTERS} for k in SHAPER_KINDS}


def snapshot_stat(snapshot):
    """The /proc/stat cpu line of a snapshot: its last "stat" line (a
    script may append a fresh one after the shaper reads, so that their
    CPU falls outside the phase it measures)."""
    stats = [line["stat"] for line in snapshot if "stat" in line]
    if not stats:
        raise ValueError("snapshot has no /proc/stat line")
    return stats[-1]


def _main(argv):
    if argv[:1] == ["cpu-ticks"] and len(argv) == 1:
        with open("/proc/stat") as f:
            fields = cpu_fields(f.read())
        print(busy_jiffies(fields), total_jiffies(fields))
        return 0
    if argv[:1] == ["busy-fraction"] and len(argv) == 3:
        with open("/proc/stat") as f:
            now = cpu_fields(f.read())
        busy = busy_jiffies(now) - int(argv[1])
        total = total_jiffies(now) - int(argv[2])
        print(f"{busy / total if total > 0 else 0:.3f}")
        return 0
    if argv[:1] == ["proc-jiffies"] and len(argv) == 2:
        with open(f"/proc/{int(argv[1])}/stat") as f:
            print(proc_jiffies(f.read()))
        return 0
    print(__doc__.split("Command line (for shell scripts):")[1].rstrip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))


# --- shared by the latency-probe reports (fairness, bench_tree) -------------------


def jain(xs):
    """Jain's fairness index (sum x)^2 / (n * sum x^2) of the throughputs xs:
    1.0 when all are equal, 1/n when one takes everything. None when xs is
    empty, any is missing, or all are 0."""
    xs = list(xs)
    if not xs or any(x is None for x in xs):
        return None
    s2 = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * s2) if s2 > 0 else None


# sockperf's summary lines, first block only (sockperf repeats the block at
# the end of its output and in the --full-log CSV).
_SOCKPERF = {
    "p50": (r"percentile 50\.000 =\s*([0-9.]+)", float),
    "p99": (r"percentile 99\.000 =\s*([0-9.]+)", float),
    "p999": (r"percentile 99\.900 =\s*([0-9.]+)", float),
    "max": (r"<MAX> observation =\s*([0-9.]+)", float),
    "min": (r"<MIN> observation =\s*([0-9.]+)", float),
    "avg": (r"avg-rtt=([0-9.]+)", float),
    "samples": (r"\[Valid Duration\].*?ReceivedMessages=([0-9]+)", int),
    "dropped": (r"# dropped messages = ([0-9]+)", int),
}


def sockperf_summary(text):
    """sockperf's own round-trip statistics (µs) from its output text: p50,
    p99, p999, max, min, avg, samples (messages received in the valid
    duration) and dropped; a key is None when its line is missing, and the
    whole is None when there is no p50 (sockperf did not finish)."""
    out = {}
    for key, (pattern, conv) in _SOCKPERF.items():
        m = re.search(pattern, text)
        out[key] = conv(m.group(1)) if m else None
    return out if out["p50"] is not None else None


def sockperf_rtts(text):
    """The round trips (µs) of sockperf's --full-log CSV text: the rtt
    column of the rows after the "packet, txTime..." header."""
    rtts, started = [], False
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if cells[0] == "packet" and len(cells) > 3:
            started = True
        elif started and cells[0].isdigit() and len(cells) > 3 and cells[3]:
            try:
                rtts.append(float(cells[3]))
            except ValueError:
                pass
    return rtts
