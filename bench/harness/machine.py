"""machine.py: what the scenarios read about the machine they run on: the
load average (is it busy?), /proc/stat's cpu line and a process's
/proc/PID/stat, the CPU count (and which worker thread counts it can
run), and snapshots of a testbed's shaper
counters. The arithmetic on those readings is
benchkit's (the one definition of busy CPU); this file only reads them.
"""

import json
import os
import subprocess
import time


def nproc():
    return len(os.sched_getaffinity(0))


def runnable_threads(asked, cpus):
    """(the thread counts that run, those skipped): a T above the CPUs the
    machine has would only measure the threads' contention."""
    return [t for t in asked if t <= cpus], [t for t in asked if t > cpus]


def worker_threads_to_run(asked, log, error):
    """The --worker-threads counts this machine runs, each skipped one said
    by `log`; `error(message)` is raised when none is left."""
    cpus = nproc()
    threads, skipped = runnable_threads(asked, cpus)
    for t in skipped:
        log(f"worker threads T = {t} skipped: this machine has {cpus} CPUs")
    if not threads:
        raise error(f"every --worker-threads count is above this machine's {cpus} CPUs; give at most {cpus}")
    return threads


def loadavg():
    """The 1-minute load average."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def is_busy(load, cpus):
    """True when a 1-min load average is above half the cores (the one
    test of a busy machine: its load is measured along with ours)."""
    return load > cpus / 2


def busy_machine():
    return is_busy(loadavg(), nproc())


def wait_idle(seconds, log):
    """Wait up to `seconds` for the machine to stop being busy; True when it
    is idle at the end."""
    deadline = time.monotonic() + seconds
    if busy_machine() and seconds > 0:
        log(f"machine busy (load {loadavg():.2f} on {nproc()} CPUs); waiting up to {seconds:g} s")
        while busy_machine() and time.monotonic() < deadline:
            time.sleep(5)
    return not busy_machine()


def cpu_line():
    """/proc/stat's aggregate cpu line."""
    with open("/proc/stat") as f:
        return f.readline().rstrip("\n")


def proc_stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rstrip("\n")


def children_times_line():
    """User and system seconds of this process's waited-for children, as
    bash's `times` writes them ("0m1.250s 0m0.030s")."""
    t = os.times()

    def fmt(s):
        return f"{int(s // 60)}m{s % 60:.3f}s"

    return f"{fmt(t.children_user)} {fmt(t.children_system)}"


def snapshot(path, prefix, workers):
    """/proc/stat's cpu line, the load average and every shaper's counters
    (tc -s -j), as JSON lines; the reports take the differences."""

    def tc(ns, dev):
        r = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show", "dev", dev],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return json.loads(r.stdout) if r.stdout.strip() else []

    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    lines = [{"t": time.time(), "stat": cpu_line(), "loadavg": load}]
    for i in range(workers):
        lines.append({"kind": "worker_egress", "rank": i, "tc": tc(f"{prefix}-w{i}", "eth0")})
        lines.append({"kind": "switch_port_egress", "rank": i, "tc": tc(f"{prefix}-sw", f"sw-w{i}")})
        if subprocess.run(["ip", "-n", f"{prefix}-w{i}", "link", "show", "ifb0"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0:
            lines.append({"kind": "worker_ingress_ifb", "rank": i, "tc": tc(f"{prefix}-w{i}", "ifb0")})
    with open(path, "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)
