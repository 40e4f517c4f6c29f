"""demos/single.py: `scripts/demo` (mode `single`, the default): the whole
thing in one command. Installs what is missing (scripts/setup.sh), builds,
makes a testbed (scripts/testbed.sh, prefix "agg"), starts switchd in the
switch namespace, runs an all-reduce of float32 tensors across the workers
through it (verified), pings between two plain hosts meanwhile to show that
ordinary traffic crosses the same switch, then prints the per-rank table,
the switch's main counters (demo_report.py), the path of the full JSON and
DEMO PASSED / DEMO FAILED. Everything it starts is stopped by PID and the
testbed removed on exit, also on failure, Ctrl-C or SIGTERM.
"""

import os

from demos.common import (AGG_PORT, BIN_DIR, JOB_ID, RunDir, elements, json_path, prefix_type, prepare, report,
                          start_ping, stop_switchds, verdict, wait_ping)
from lifecycle import Processes, Testbed, log, random_secret, start_switchd, write_switchd_config
from options import uint_range
from scenario import Option, Scenario


DESCRIPTION = """\
Exits 0 only if every worker exited 0 and reported "verified": true.
--leaves or --spines runs the tree mode (scripts/demo tree) with the same
options. Logs, config and outputs go to /tmp/agg-demo.XXXXXX, removed after a
pass unless --keep-logs."""

OPTIONS = (
    Option("--workers", "ranks in the job (1..64), each in namespace PREFIX-wI", uint_range(1, 64), 4, "N"),
    Option("--hosts", "plain hosts PREFIX-hJ, 0..155 (the ping needs 2; 0 or 1 skips it)", uint_range(0, 155), 2, "M"),
    Option("--mib", "tensor size per worker in MiB of float32, 1..4096 (S*1024*1024/4 elements)",
           uint_range(1, 4096), 64, "S"),
    Option("--iterations", "all-reduce rounds per worker", uint_range(1, 1000000), 5, "K"),
    Option("--queues", "veth queues, 1..256 (testbed.sh --queues)", uint_range(1, 256), 1, "Q"),
    Option("--mtu", "MTU of every testbed link, 576..9000 (testbed.sh --mtu); switchd sizes its chunks from it "
           "(2233 floats at 9000)", uint_range(576, 9000), 1500, "M"),
    Option("--timeout", "seconds the workers get before they are stopped (1..86400)", uint_range(1, 86400), 600, "T"),
    Option("--prefix", "testbed namespace prefix (PREFIX-sw, PREFIX-w0, ...)", prefix_type(31), "agg", "P"),
    Option("--keep-logs", "keep the folder of logs and config also on success"),
    Option("--json", "where the full JSON goes: every worker's report and the switch's counters "
           "(default results/demo-STAMP.json)", str, None, "FILE"),
    BIN_DIR,
)


def run(a):
    json_out = json_path(a.json, "demo", os.getcwd())
    switchd, worker = prepare(a.bin_dir)
    n = elements(a.mib)
    with RunDir("/tmp/agg-demo", a.keep_logs) as work, \
            Testbed(a.prefix, ["--workers", a.workers, "--hosts", a.hosts, "--queues", a.queues,
                               "--mtu", a.mtu], work.path, show=True) as tb, Processes() as procs:
        wd = work.path
        # A fresh random job secret for this run; switchd writes its own
        # config (typed, from the testbed's addresses), mode 0600.
        secret = random_secret()
        cfg, stats, switchd_log = wd / "switchd.toml", wd / "stats.json", wd / "switchd.log"
        write_switchd_config(switchd, tb, cfg, "scripts/demo", secret=secret, host_ports=True,
                             jobs=[f"{JOB_ID}:all:env:AGGSWITCH_TESTBED_SECRET"],
                             sets=[f"switch.agg_port={AGG_PORT}"])
        log(f"starting switchd in {a.prefix}-sw (log: {switchd_log})")
        sw = start_switchd(procs, f"{a.prefix}-sw", switchd, switchd_log,
                           ["run", "--config", cfg, "--stats-file", stats])
        log(f"switchd ready (pid {sw.pid})")

        log(f"all-reduce: {a.workers} workers x {n} float32 ({a.mib} MiB) x {a.iterations} iterations")
        workers = [procs.start([worker, "allreduce", "--switch", tb["switch_addr"], "--job", JOB_ID, "--rank", i,
                                "--workers", a.workers, "--elements", n, "--iterations", a.iterations,
                                "--verify", "--json"], ns=f"{a.prefix}-w{i}", stdout=wd / f"worker{i}.json",
                               stderr=wd / f"worker{i}.log", env={"AGGSWITCH_SECRET": secret})
                   for i in range(a.workers)]
        ping_line, ping = "not run (needs --hosts 2 or more)", None
        if a.hosts >= 2:
            to = tb["host_1_addr"]
            ping = start_ping(procs, f"{a.prefix}-h0", to, wd / "ping.log")

        statuses = procs.wait(workers, a.timeout, stop_on_failure=False)
        if ping is not None:
            ping_line = wait_ping(procs, ping, wd / "ping.log", f"{a.prefix}-h0 -> {to}", f"{a.prefix}-h0 -> {to}")
        # switchd writes its counters on exit.
        switchd_rc = stop_switchds(procs, [sw])
        work.passed = report(wd, statuses, switchd_rc, ping_line, json_out, a.mib, a.iterations, stats)
    return verdict(work.passed)


MODE = Scenario("single", "all-reduce through one switch (the default)", DESCRIPTION, run, OPTIONS,
                needs_root=True)
