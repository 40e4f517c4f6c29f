"""demos/tree.py: `scripts/demo tree`: the demo over an aggregation tree.
Makes a leaf-spine testbed (scripts/testbed.sh up --leaves), starts a
switchd in every spine and every leaf (configs from `switchd
testbed-config --topology leaf-spine`), runs an all-reduce across the
workers of every leaf (verified against the tree-order sum: ranks within a
leaf, then leaves), pings from a host under leaf 0 to a host under leaf 1
across the fabric meanwhile, then prints the per-rank table, the counters
of leaf 0, the chunks each spine summed (seq mod K) and DEMO PASSED / DEMO
FAILED. Everything it starts is stopped by PID and the testbed removed on
exit, also on failure, Ctrl-C or SIGTERM.
"""

import os

from demos.common import (AGG_PORT, BIN_DIR, JOB_ID, RunDir, elements, json_path, prefix_type, prepare, report,
                          start_ping, stop_switchds, verdict, wait_ping)
from lifecycle import Processes, Testbed, log, random_secret, run_checked, start_switchd
from options import uint_range
from scenario import Option, Scenario

UPLINK_PORT = 40000

DESCRIPTION = """\
Exits 0 only if every worker exited 0 and verified and every switchd exited
0. Logs, configs and outputs go to /tmp/agg-demo-tree.XXXXXX, removed after a
pass unless --keep-logs."""

OPTIONS = (
    Option("--leaves", "leaf switches (2..8), each with its own workers", uint_range(2, 8), 2, "L"),
    Option("--spines", "spine switches (1..8): chunk seq s is summed at spine s mod K", uint_range(1, 8), 2, "K"),
    Option("--workers", "workers per leaf (1..16)", uint_range(1, 16), 2, "W"),
    Option("--mib", "tensor size per worker in MiB of float32 (1..1024)", uint_range(1, 1024), 16, "S"),
    Option("--iterations", "all-reduce rounds per worker", uint_range(1, 1000000), 3, "N"),
    Option("--timeout", "seconds the workers get before they are stopped (1..86400)", uint_range(1, 86400), 600, "T"),
    Option("--prefix", "testbed namespace prefix", prefix_type(21), "tree", "P"),
    Option("--keep-logs", "keep the folder of logs and configs also on success"),
    Option("--json", "the full JSON (default results/demo-tree-STAMP.json)", str, None, "FILE"),
    BIN_DIR,
)


def leaf_sizes(leaves, per_leaf):
    """worker's --tree-leaves: every leaf's rank count, comma-separated."""
    return ",".join([str(per_leaf)] * leaves)


def run(a):
    json_out = json_path(a.json, "demo-tree", os.getcwd())
    switchd, worker = prepare(a.bin_dir)
    n = elements(a.mib)
    with RunDir("/tmp/agg-demo-tree", a.keep_logs) as work, \
            Testbed(a.prefix, ["--leaves", a.leaves, "--spines", a.spines, "--workers-per-leaf", a.workers,
                               "--hosts-per-leaf", 1], work.path, show=True) as tb, Processes() as procs:
        wd = work.path
        secret = random_secret()

        def fabric_config(role, out, *extra):
            run_checked([switchd, "testbed-config", "--topology", "leaf-spine", "--role", role,
                         "--env", tb.env_file, "--out", out, "--writer", "scripts/demo tree",
                         "--agg-port", AGG_PORT, "--uplink-port", UPLINK_PORT,
                         "--job", f"{JOB_ID}:all:env:AGGSWITCH_TESTBED_SECRET", *extra],
                        f"switchd testbed-config --role {role}",
                        env={**os.environ, "AGGSWITCH_TESTBED_SECRET": secret})

        def start(name, ns, what):
            log(f"starting switchd in {ns} ({what})")
            return start_switchd(procs, ns, switchd, wd / f"{name}.log",
                                 ["run", "--config", wd / f"{name}.toml", "--stats-file", wd / f"{name}-stats.json"])

        switchds = []
        for j in range(a.spines):
            fabric_config(f"spine:{j}", wd / f"spine{j}.toml", "--set", f'switch.admin_socket="{wd}/spine{j}.sock"')
            switchds.append(start(f"spine{j}", tb[f"spine_{j}_ns"], f"spine {j}, {tb[f'spine_{j}_addr']}"))
        for i in range(a.leaves):
            fabric_config(f"leaf:{i}", wd / f"leaf{i}.toml", "--host-ports",
                          "--set", f'switch.admin_socket="{wd}/leaf{i}.sock"')
            switchds.append(start(f"leaf{i}", tb[f"leaf_{i}_ns"], f"leaf {i}, {tb[f'leaf_{i}_gateway']}"))

        log(f"all-reduce: {a.leaves} leaves x {a.workers} workers x {n} float32 ({a.mib} MiB) x "
            f"{a.iterations} iterations, {a.spines} spines")
        workers = []
        for i in range(a.leaves):
            for k in range(a.workers):
                g = i * a.workers + k
                workers.append(procs.start(
                    [worker, "allreduce", "--switch", tb[f"leaf_{i}_gateway"], "--job", JOB_ID, "--rank", k,
                     "--workers", a.workers, "--tree-leaves", leaf_sizes(a.leaves, a.workers), "--leaf", i,
                     "--elements", n, "--iterations", a.iterations, "--verify", "--json"],
                    ns=tb[f"leaf_{i}_worker_{k}_ns"], stdout=wd / f"worker{g}.json", stderr=wd / f"worker{g}.log",
                    env={"AGGSWITCH_SECRET": secret}))
        far = tb["leaf_1_host_0_addr"]
        ping = start_ping(procs, tb["leaf_0_host_0_ns"], far, wd / "ping.log")

        statuses = procs.wait(workers, a.timeout, stop_on_failure=False)
        ping_line = wait_ping(procs, ping, wd / "ping.log", f"leaf 0 host -> {far} under leaf 1",
                              f"leaf 0 host -> {far}")
        # Each switchd writes its counters on exit.
        switchd_rc = stop_switchds(procs, switchds)
        ok = report(wd, statuses, switchd_rc, ping_line, json_out, a.mib, a.iterations, wd / "leaf0-stats.json",
                    [wd / f"spine{j}-stats.json" for j in range(a.spines)])
        work.passed = ok and switchd_rc == 0
    return verdict(work.passed)


MODE = Scenario("tree", "all-reduce through a leaf-spine aggregation tree", DESCRIPTION, run, OPTIONS,
                needs_root=True)
