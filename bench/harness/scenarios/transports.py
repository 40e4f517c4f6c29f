"""transports.py: the `transports` scenario: the worker's UDP data paths
compared on one veth testbed, interleaved run by run: all-reduce time and
the whole machine's CPU-seconds per transport (root).

Each run's window is marked by readings on both edges (the wall clock,
/proc/stat, switchd's /proc/PID/stat, the user+system of this process's
waited-for children, i.e. the workers); bench_transports_report.py turns
them into one JSON line per run and the medians per transport.
"""

import json
import tempfile
import time
from pathlib import Path

import bench_transports_report as report
from lifecycle import (HarnessError, Processes, Testbed, log, random_secret, release_binary,
                       start_switchd, write_switchd_config)
from machine import children_times_line, cpu_line, proc_stat
from options import on_off, uint_range, word_list
from scenario import Option, Scenario

DESCRIPTION = """\
Per run it prints one JSON line: the transport, the slowest rank's seconds
for the K all-reduces, the whole machine's busy CPU-seconds over the
workers' window (on a shared machine this counts the others' work too),
that window's wall seconds, the workers' and switchd's CPU-seconds, and the
ranks' coalescing counters; then the medians per transport. The testbed is
removed at the end, also on failure. Needs target/release/{switchd,worker}.
--worker-tx on: a veth puts partial checksums in the frames, which switchd
drops as bad_udp_checksum (the all-reduces stall)."""


def mark(path, parts, switchd_pid):
    """One edge of a run's window: a "PART VALUE" line per part, in order."""
    lines = []
    for p in parts:
        if p == "wall":
            lines.append(f"wall {time.time():.9f}")
        elif p == "stat":
            lines.append(f"stat {cpu_line()}")
        elif p == "switchd":
            lines.append(f"switchd {proc_stat(switchd_pid)}")
        elif p == "children":
            lines.append(f"children {children_times_line()}")
    Path(path).write_text("\n".join(lines) + "\n")


def run(a):
    switchd = release_binary("switchd", "cargo build --release -p switchd -p agg-worker --bins")
    worker = release_binary("worker", "cargo build --release -p switchd -p agg-worker --bins")
    out = Path(tempfile.mkdtemp(prefix="bench-transports."))
    secret = random_secret()
    with Testbed(a.prefix, ["--workers", a.workers], out) as tb, Processes() as procs:
        for r in range(a.workers):
            procs_ok = procs.start(["ethtool", "-K", "eth0", "tx", a.worker_tx], ns=f"{a.prefix}-w{r}",
                                   stdout="/dev/null")
            if procs.wait([procs_ok], 30) != [0]:
                raise HarnessError(f"ethtool -K eth0 tx {a.worker_tx} failed in {a.prefix}-w{r}")
        # Its own admin socket: another switchd may hold the default one.
        write_switchd_config(switchd, tb, out / "switchd.toml", "scripts/bench transports", a.workers, secret,
                             [f'switch.admin_socket="{out}/switchd.sock"'])
        sw = start_switchd(procs, f"{a.prefix}-sw", switchd, out / "switchd.log",
                           ["run", "--config", out / "switchd.toml"])
        runs = []
        for run_i in range(a.runs):
            for t in a.transports:
                mark(out / f"{t}-{run_i}.before", ["children", "switchd", "wall", "stat"], sw.pid)
                ranks = [procs.start([worker, "allreduce", "--switch", tb["switch_addr"], "--job", 1,
                                      "--rank", r, "--workers", a.workers, "--elements", a.elements,
                                      "--iterations", a.iterations, "--transport", t, "--json"],
                                     ns=f"{a.prefix}-w{r}", env={"AGGSWITCH_SECRET": secret},
                                     stdout=out / f"{t}-{run_i}-rank{r}.json",
                                     stderr=out / f"{t}-{run_i}-rank{r}.log")
                         for r in range(a.workers)]
                status = procs.wait(ranks, a.timeout)
                mark(out / f"{t}-{run_i}.after", ["stat", "wall", "switchd", "children"], sw.pid)
                if any(s != 0 for s in status):
                    raise HarnessError(f"a worker failed ({t} run {run_i}, status {status}); see {out}")
                line = report.one_run(str(out), t, run_i, a.workers)
                print(json.dumps(line, separators=(",", ":")), flush=True)
                runs.append(line)
    with open(out / "runs.jsonl", "w") as f:
        f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in runs)
    for line in report.summary(runs):
        print(json.dumps(line, separators=(",", ":")))
    log(f"worker tx offload {a.worker_tx}; runs in {out}")
    return 0


SCENARIO = Scenario(
    name="transports",
    summary="the worker's UDP transports (mmsg, udp-gso) compared: time and CPU (root)",
    description=DESCRIPTION,
    run=run,
    needs_root=True,
    options=(
        Option("--prefix", "testbed namespace prefix", type=str, default="gs", metavar="P"),
        Option("--workers", "ranks, one namespace each", type=uint_range(1, 90), default=4, metavar="W"),
        Option("--elements", "float32 elements per tensor", type=uint_range(1, 1 << 30), default=16777216,
               metavar="N"),
        Option("--iterations", "all-reduces per worker run", type=uint_range(1, 100000), default=3, metavar="K"),
        Option("--runs", "runs per transport, interleaved", type=uint_range(1, 1000), default=3, metavar="R"),
        Option("--transports", "the transports to compare, space- or comma-separated", type=word_list(),
               default=["mmsg", "udp-gso"], metavar="T"),
        Option("--worker-tx", "transmit checksum offload of the workers' eth0", type=on_off, default="off",
               metavar="X"),
        Option("--timeout", "seconds a run's workers may take before they are stopped",
               type=uint_range(1, 86400), default=600, metavar="S"),
    ),
)
