"""priority.py: the `priority` scenario: does a short job declared
`priority = "high"` finish sooner than one of normal priority next to a
long job on shaped links, and what does a latency probe see meanwhile
(root). Five windows (short_alone, long_alone, short_equal,
short_priority, long_after), each with a sockperf probe from worker 0 to a
host and the switch's counters at both ends; bench_priority_report.py
writes the table, JSON and PNG.
"""

import json
import shutil
import subprocess
import time

from lifecycle import (REPO_ROOT, RESULTS_DIR, HarnessError, Processes, Testbed, log, random_secret,
                       run_report, stamp, start_switchd, warn, write_switchd_config)
from machine import nproc
from options import uint_range
from scenario import Option, Scenario
from switchctl import Switchctl
from tools import ensure_packages, net, private_binaries

PREFIX = "prio"
WORKERS = 2
AGG_PORT = 48879
SOCKPERF_PORT = 11111
READY_TIMEOUT = 30
# Seconds a short job may run past its window before the run fails.
SHORT_TIMEOUT = 300

DESCRIPTION = """\
Jobs 1 and 2 are of normal priority, job 3 of high; every job has both
workers as ranks. The long job (1) runs through the windows long_alone,
short_equal (short job 2 beside it), short_priority (short job 3) and
long_after; short_alone is job 2 alone. A window lasts --window seconds,
or until its short job is done if that takes longer. Writes
bench/results/priority-STAMP.{json,png}; raw outputs in
results/priority-STAMP/. Everything runs in the namespaces prio-*."""


def run(a):
    ensure_packages(True, ["sockperf", "python3-matplotlib", "iproute2"])
    bins = private_binaries(["switchd", "switchctl", "worker"], build=not a.no_build)
    st = stamp()
    rd = REPO_ROOT / "results" / f"priority-{st}"
    rd.mkdir(parents=True)
    tbf = ["rate", f"{a.rate}mbit", "burst", "256kb", "latency", "50ms"]
    secret = random_secret()
    sock = rd / "switchd.sock"

    ctl = Switchctl(f"{bins}/switchctl", sock)
    switch_stats = ctl.stats_text

    try:
        with Testbed(PREFIX, ["--workers", WORKERS, "--hosts", 1], rd) as tb, Processes() as procs:
            host = tb["host_0_addr"]
            net("shape-workers", PREFIX, WORKERS, *tbf)
            log(f"worker links shaped: {' '.join(tbf)}, each way")
            write_switchd_config(f"{bins}/switchd", tb, rd / "switchd.toml", "scripts/bench priority",
                                 host_ports=True, sets=[
                                     "job.3.priority=high", f"switch.agg_port={AGG_PORT}",
                                     f'switch.admin_socket="{sock}"'],
                                 jobs=[f"{j}:all:env:AGGSWITCH_TESTBED_SECRET" for j in (1, 2, 3)],
                                 secret=secret)
            log(f"starting switchd in {PREFIX}-sw")
            start_switchd(procs, f"{PREFIX}-sw", f"{bins}/switchd", rd / "switchd.log",
                          ["run", "--config", rd / "switchd.toml"], READY_TIMEOUT)
            server = procs.start(["sockperf", "server", "-i", host, "-p", SOCKPERF_PORT], ns=f"{PREFIX}-h0",
                                 stdout=rd / "sockperf-server.log")
            time.sleep(0.5)
            if server.poll() is not None:
                raise HarnessError(f"sockperf server exited: {(rd / 'sockperf-server.log').read_text()}")

            def start_workers(job, iterations, out, verify):
                # The short job verifies its sums; the long one does not (it
                # would spend the shared CPU generating and checking patterns).
                return [procs.start([f"{bins}/worker", "allreduce", "--switch", tb["switch_addr"], "--job", job,
                                     "--rank", r, "--workers", WORKERS, "--elements", a.elements,
                                     "--iterations", iterations, *(["--verify"] if verify else []), "--json"],
                                    ns=f"{PREFIX}-w{r}", env={"AGGSWITCH_SECRET": secret},
                                    stdout=f"{out}.w{r}.json", stderr=f"{out}.w{r}.log")
                        for r in range(WORKERS)]

            def window(name, short=None):
                log(f"window '{name}' ({a.window} s)" + (f": short job {short}" if short else ""))
                (rd / f"{name}.switch-start.json").write_text(switch_stats())
                (rd / f"{name}.t0").write_text(f"{time.time():.9f}\n")
                t_end = time.monotonic() + a.window
                probe = procs.start(["sockperf", "under-load", "-i", host, "-p", SOCKPERF_PORT, "-t", a.window,
                                     "--msg-size", 64, "--mps", a.mps, "--reply-every", 1], ns=f"{PREFIX}-w0",
                                    stdout=rd / f"{name}.sockperf.txt")
                shorts = start_workers(short, a.iterations, rd / f"{name}.short", True) if short else []
                rc = procs.wait([probe], a.window + 60)[0]
                if rc != 0:
                    warn(f"window '{name}': sockperf exited with status {rc}")
                # The window lasts --window seconds, or until the short job
                # is done if it takes longer.
                while time.monotonic() < t_end:
                    time.sleep(0.05)
                for p in shorts:
                    while p.poll() is None:
                        if time.monotonic() >= t_end + SHORT_TIMEOUT:
                            raise HarnessError(f"window '{name}': the short job did not finish within "
                                               f"{a.window + SHORT_TIMEOUT} s")
                        time.sleep(0.05)
                (rd / f"{name}.switch-end.json").write_text(switch_stats())
                (rd / f"{name}.t1").write_text(f"{time.time():.9f}\n")
                for s in procs.wait(shorts, 1):
                    if s != 0:
                        raise HarnessError(f"window '{name}': a short-job worker failed (status {s}, see "
                                           f"{rd}/{name}.short.w*.log)")

            window("short_alone", 2)
            log("starting the long job (job 1)")
            longs = start_workers(1, 100000000, rd / "long", False)
            ctl.wait_active({1}, READY_TIMEOUT, "the long job")
            time.sleep(2)  # past slow start
            window("long_alone")
            window("short_equal", 2)
            window("short_priority", 3)
            window("long_after")
            for p in longs:
                if p.poll() is not None:
                    raise HarnessError(f"the long job's worker {p.pid} exited during the run (see {rd}/long.w*.log)")
                procs.stop(p)
    finally:
        shutil.rmtree(bins, ignore_errors=True)
        log(f"logs and raw outputs in {rd.relative_to(REPO_ROOT)}")
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True).stdout.strip() or "unknown"
    (rd / "meta.json").write_text(json.dumps({
        "stamp": st, "commit": commit, "link": " ".join(tbf), "loadavg_at_end": load, "window_s": a.window,
        "short_iterations": a.iterations, "elements": a.elements, "probe_mps": a.mps, "cpus": nproc()},
        indent=2) + "\n")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    run_report("bench_priority_report.py", [rd, RESULTS_DIR / f"priority-{st}.json",
                                            RESULTS_DIR / f"priority-{st}.png"])
    return 0


SCENARIO = Scenario(
    name="priority",
    summary="a high-priority short job beside a long one on shaped links, and a latency probe (root)",
    description=DESCRIPTION,
    run=run,
    needs_root=True,
    options=(
        Option("--window", "seconds of each window", type=uint_range(2, 600), default=10, metavar="S"),
        Option("--iterations", "the short job's all-reduces", type=uint_range(1, 100000), default=20, metavar="N"),
        Option("--elements", "float32 elements per all-reduce", type=uint_range(1, 268435456), default=1048576,
               metavar="E"),
        Option("--mps", "probe messages per second", type=uint_range(1, 100000), default=1000, metavar="M"),
        Option("--rate", "worker link rate, each way, in Mbit/s", type=uint_range(1, 100000), default=1000,
               metavar="MBIT"),
        Option("--no-build", "use target/release as it is"),
    ),
)
