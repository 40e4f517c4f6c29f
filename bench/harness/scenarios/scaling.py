"""scaling.py: the `scaling` scenario: how the switch's engine scales over
cores with no kernel (issue 21). `engine_scaling`
(bench/src/bin/engine_scaling.rs) runs T threads that feed pre-built DATA
datagrams to the engine in memory, checking sampled RESULTs bit for bit;
bench_scaling_report.py writes the JSON, the table and the PNG. No root.
"""

import os
import subprocess
import tempfile

import bench_scaling_report
from lifecycle import REPO_ROOT, RESULTS_DIR, HarnessError, log, release_binary, stamp, warn
from machine import loadavg, nproc
from options import positive_seconds, uint_list, uint_range
from scenario import Option, Scenario

DESCRIPTION = """\
For each backend that is built (table-lock, lockfree, lanes) and each layout
(rss, rank-blocks, steered, job-per-thread) it reports DATA Mpps, payload
GB/s, RESULTs/s and DATA per CPU-second of the feeding threads, the median
of the repeats, and the lowest share of their CPUs the threads got.
Writes bench/results/scaling-STAMP.json (key engine_2_over_1: median Mpps at
2 threads over 1, rss layout) and scaling-STAMP.png. The threads are pinned
one per CPU: other load on those CPUs is measured too."""


def default_threads(cpus):
    """1, 2, 4, 8, ... up to cpus, and cpus itself when not a power of two."""
    out, t = [1], 2
    while t <= cpus:
        out.append(t)
        t *= 2
    if cpus > 1 and cpus & (cpus - 1):
        out.append(cpus)
    return out


def settings(a, cpus):
    """(seconds, repeats, threads) after --quick and the defaults."""
    seconds = a.seconds if a.seconds is not None else (0.5 if a.quick else 3.0)
    repeats = a.repeats if a.repeats is not None else (1 if a.quick else 3)
    return seconds, repeats, a.threads or default_threads(cpus)


def run(a):
    seconds, repeats, threads = settings(a, nproc())
    if not a.no_build:
        log("building (cargo build --release -p agg-bench --bins)")
        if subprocess.run(["cargo", "build", "--release", "-p", "agg-bench", "--bins"], cwd=REPO_ROOT).returncode:
            raise HarnessError("cargo build --release -p agg-bench --bins failed")
    binary = release_binary("engine_scaling", "cargo build --release -p agg-bench --bins")
    load_start = loadavg()
    if load_start >= 0.5:
        warn(f"the machine is busy (1-min load average {load_start} on {nproc()} CPUs): the threads "
             "share their CPUs with that load, so the numbers are noisy; rerun when it is idle")
    st = stamp()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out_json, out_png = RESULTS_DIR / f"scaling-{st}.json", RESULTS_DIR / f"scaling-{st}.png"
    thread_list = ",".join(map(str, threads))
    log(f"engine_scaling: threads {thread_list}, {seconds:g} s x {repeats} repeats per configuration, "
        "every layout, every built backend")
    with tempfile.TemporaryDirectory(prefix="bench-scaling.") as tmp:
        raw = os.path.join(tmp, "raw.json")
        r = subprocess.run([str(binary), "--threads", thread_list, "--seconds", f"{seconds:g}",
                            "--repeats", str(repeats), "--backend", "all", "--layout", "all",
                            "--json", raw], stdout=subprocess.DEVNULL)
        if r.returncode != 0:
            raise HarnessError("engine_scaling failed (see above): a wrong RESULT or refused DATA is a bug in the engine")
        if bench_scaling_report.main([raw, str(out_json), str(out_png), "--stamp", st,
                                      "--load-start", str(load_start), "--load-end", str(loadavg())]):
            raise HarnessError("bench_scaling_report.py failed (see above)")
    log(f"wrote {out_json}" + (f" and {out_png}" if out_png.exists() else " (no PNG: see the warning above)"))
    return 0


SCENARIO = Scenario(
    name="scaling",
    summary="the engine's DATA rate over 1..N cores, in memory (no root)",
    description=DESCRIPTION,
    run=run,
    options=(
        Option("--seconds", "seconds per measurement (default 3; --quick: 0.5)", type=positive_seconds,
               metavar="S"),
        Option("--repeats", "measurements per configuration, interleaved (default 3; --quick: 1)",
               type=uint_range(1, 100), metavar="N"),
        Option("--threads", "comma-separated thread counts (default: 1, 2, 4, ... and the CPU count)",
               type=uint_list(1, 9999), metavar="LIST"),
        Option("--quick", "a fast check: --seconds 0.5 --repeats 1 (unless given)"),
        Option("--no-build", "do not run cargo build (use target/release as is)"),
    ),
)
