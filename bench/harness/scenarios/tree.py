"""tree.py: the `tree` scenario: the all-reduce and PANAMA's fairness
experiment on the leaf-spine testbed, with the leaf-spine links limited to
a rate R (the bottleneck, as in an oversubscribed fabric) (root).

Every switch's config comes from `switchd testbed-config --topology
leaf-spine`; the shaping and CE marking from scripts/net.sh;
bench_tree_report.py makes the table, JSON and plot from the run folder
(results/bench-tree-STAMP/, every raw log, worker report, switch counter
file and qdisc snapshot).
"""

import os
import shlex
import shutil
import subprocess
import sys
import time

from lifecycle import (publish, REPO_ROOT, RESULTS_DIR, HarnessError, Processes, Testbed, log, random_secret,
                       run_report, stamp, start_switchd, warn)
from machine import proc_stat
from options import uint_range, word_list
from scenario import Option, Scenario
from switchctl import Switchctl
from tools import ensure_packages, net, private_binaries

AGG_PORT = 48879
UPLINK_PORT = 40000
SOCKPERF_PORT = 11111
MSG_SIZE = 64
READY_TIMEOUT = 30
LEAVES = 2
WPL = 2
# Bytes of one full chunk's RESULT, the longer way of a leaf-spine link
# (both are shaped): 358 floats + 16 (token) + 22 (header) + 8 (UDP) + 20
# (IPv4) + 14 (Ethernet); the partial going up is 16 shorter.
CHUNK_PAYLOAD = 1432
CHUNK_WIRE = 1512

DESCRIPTION = """\
Two parts:
  trees     2 leaves x 2 workers, 2 spines. One job of 4 ranks all-reduces
            MIB MiB x N iterations (verified against the tree-order sum)
            once over 1 tree (both leaves list only spine 0) and once over 2
            trees (chunk seq s summed at spine s mod 2), interleaved over
            --repeat repeats; first once of each on unshaped links. The
            shaped links mark CE (unless --trees-no-ecn). Reports the median
            time per all-reduce, the ratio 2 trees / 1 tree (goal <= 0.55),
            the chunks each spine summed, the partials resent, the CPU use.
  fairness  2 leaves x 2 workers + 1 host each, 1 spine. Job 1 = l0w0 +
            l1w0, job 2 = l0w1 + l1w1, and a sockperf probe from l0h0 to
            l1h0, all across the same shaped, CE-marking links. Runs idle /
            no_cc (--no-congestion-control) / cc (DCTCP); reports the
            probe's p50/p99/p99.9, each job's throughput and Jain's index.
Every leaf-spine link is limited both ways: HTB at R on the egress of up-sJ
in each leaf and on an ifb carrying up-sJ's ingress. Writes
bench/results/bench-tree-STAMP.{json,png} and (unless --no-docs)
bench/results/bench-tree.{json,png}; raw outputs in results/bench-tree-STAMP/."""


def fair_iterations(seconds, fair_mib, rate_mbit):
    """Iterations enough that at its fair share of the link's payload rate
    each fairness job outlasts the probe by 3 s."""
    bits_per_iter = fair_mib * 1024 * 1024 // 4 * 32
    goodput_bps = rate_mbit * 1000000 * CHUNK_PAYLOAD // CHUNK_WIRE // 2
    return (seconds + 3) * goodput_bps // bits_per_iter + 2


def tree_timeout(iterations, mib, rate_mbit):
    """Twice the time of the whole tensor through one link, plus 5 minutes."""
    return iterations * mib * 8388608 * 2 // (rate_mbit * 1000000) + 300


class Fabric:
    """The switchds of one leaf-spine testbed run: configs, start, stop."""

    def __init__(self, procs, tb, bins, spines):
        self.procs, self.tb, self.bins, self.spines = procs, tb, bins, spines
        self.running = []  # (name, Popen)

    def config(self, role, out, jobs, secrets, trees, extra=()):
        argv = [f"{self.bins}/switchd", "testbed-config", "--topology", "leaf-spine", "--role", role,
                "--env", self.tb.env_file, "--out", out, "--writer", "scripts/bench tree",
                "--agg-port", AGG_PORT, "--uplink-port", UPLINK_PORT, "--trees", trees, *extra]
        for j in jobs:
            argv += ["--job", j]
        r = subprocess.run([str(a) for a in argv], env={**os.environ, **secrets}, stderr=subprocess.PIPE,
                           text=True)
        if r.returncode:
            raise HarnessError(f"switchd testbed-config --role {role} failed: {r.stderr.strip()}")

    def start(self, d, trees, jobs):
        """jobs: (id, secret, local worker indices) — the same indices under
        every leaf are that job's ranks there."""
        secrets = {f"AGG_TREE_SECRET_{jid}": s for jid, s, _ in jobs}
        for j in range(self.spines):
            self.config(f"spine:{j}", d / f"spine{j}.toml", [f"{jid}:all:env:AGG_TREE_SECRET_{jid}" for jid, _, _ in jobs],
                        secrets, trees, ["--set", f'switch.admin_socket="{d}/spine{j}.sock"'])
            self._run(d, f"spine{j}", self.tb[f"spine_{j}_ns"])
        for i in range(LEAVES):
            self.config(f"leaf:{i}", d / f"leaf{i}.toml",
                        [f"{jid}:{','.join(map(str, ranks))}:env:AGG_TREE_SECRET_{jid}" for jid, _, ranks in jobs],
                        secrets, trees, ["--host-ports", "--set", f'switch.admin_socket="{d}/leaf{i}.sock"'])
            self._run(d, f"leaf{i}", self.tb[f"leaf_{i}_ns"])

    def _run(self, d, name, ns):
        p = start_switchd(self.procs, ns, f"{self.bins}/switchd", d / f"{name}.log",
                          ["run", "--config", d / f"{name}.toml", "--stats-file", d / f"{name}-stats.json"],
                          READY_TIMEOUT)
        self.running.append((name, p))

    def stop(self, d):
        """Record every switchd's CPU time (/proc/PID/stat), then stop it
        (each writes its stats file on exit); exit status to switchd-exit."""
        for name, p in self.running:
            try:
                (d / f"{name}.procstat").write_text(proc_stat(p.pid) + "\n")
            except OSError:
                pass
        rc = 0
        for _, p in self.running:
            code = self.procs.stop(p, 10)
            rc = code if code else rc
        (d / "switchd-exit").write_text(f"{rc}\n")
        self.running = []


def qdisc_snapshot(tb, spines, d, when):
    """Every leaf's uplink and ifb qdisc counters (tc -s -j), and the CE
    markers' maps when there are any, as JSON files in d."""
    for i in range(LEAVES):
        ns = tb[f"leaf_{i}_ns"]
        for j in range(spines):
            for dev in (f"up-s{j}", f"ifb-s{j}"):
                r = subprocess.run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                if r.returncode == 0:
                    (d / f"tc-leaf{i}-{dev}.{when}.json").write_text(r.stdout)
            for dev in (f"up-s{j}", f"ifb-s{j}"):
                try:
                    map_id = net("ecn-map-id", ns, dev)
                except HarnessError:
                    continue
                r = subprocess.run(["bpftool", "map", "dump", "id", map_id, "-j"], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True)
                if r.returncode == 0:
                    (d / f"marker-leaf{i}-{dev}.{when}.json").write_text(r.stdout)
    shutil.copy("/proc/stat", d / f"procstat.{when}")


def shape_fabric(tb, spines, a, run_dir, mark):
    """Every leaf-spine link limited both ways to --rate; with mark the
    FIFOs also mark CE. Returns the marker (bpf, red) or None."""
    up = []
    for i in range(LEAVES):
        ns = tb[f"leaf_{i}_ns"]
        for j in range(spines):
            up += [f"{ns}:up-s{j}", f"{ns}:ifb-s{j}"]
            net("ifb", ns, f"up-s{j}", f"ifb-s{j}")
    if mark:
        marker = net("ecn-bottleneck", run_dir, a.rate, a.mark_min, a.mark_max, *up).splitlines()[-1]
        log(f"leaf-spine links at {a.rate} Mbit/s each way; their FIFOs mark CE from {a.mark_min} to "
            f"{a.mark_max} bytes ({marker})")
        return marker
    for nd in up:
        ns, dev = nd.split(":", 1)
        net("htb", ns, dev, a.rate)
    log(f"leaf-spine links at {a.rate} Mbit/s each way (HTB; spine->leaf on an ifb at the leaf)")
    return None


def run_workers(procs, tb, bins, d, specs, elements, iterations, extra):
    """specs: (name, leaf, k, job, secret, rank, n_local, tree); one worker each."""
    out = []
    for name, leaf, k, job, secret, rank, n_local, tree in specs:
        out.append(procs.start(
            [f"{bins}/worker", "allreduce", "--switch", tb[f"leaf_{leaf}_gateway"], "--job", job, "--rank", rank,
             "--workers", n_local, "--tree-leaves", tree, "--leaf", leaf, "--elements", elements,
             "--iterations", iterations, "--json", *extra],
            ns=tb[f"leaf_{leaf}_worker_{k}_ns"], env={"AGGSWITCH_SECRET": secret},
            stdout=d / f"{name}.json", stderr=d / f"{name}.log"))
    return out


def finish_workers(procs, d, workers, timeout):
    status = procs.wait(workers, timeout, stop_on_failure=False)
    (d / "worker-exit").write_text(",".join(str(s) for s in status) + "\n")


def trees_part(a, run_dir, bins):
    elements = a.mib * 1024 * 1024 // 4
    timeout = tree_timeout(a.iterations, a.mib, a.rate)
    with Testbed(a.prefix, ["--leaves", LEAVES, "--spines", 2, "--workers-per-leaf", WPL,
                            "--hosts-per-leaf", 1], run_dir) as tb, Processes() as procs:
        shutil.copy(tb.env_file, run_dir / "fabric-2spines.env")
        fabric = Fabric(procs, tb, bins, 2)

        def one(name, trees):
            d = run_dir / "trees" / name
            d.mkdir(parents=True)
            secret = random_secret()
            log(f"trees: run {name}: 1 job of {LEAVES * WPL} ranks over {trees} tree(s), {a.mib} MiB x {a.iterations}")
            fabric.start(d, trees, [(1, secret, list(range(WPL)))])
            qdisc_snapshot(tb, 2, d, "before")
            specs = [(f"worker-l{i}w{k}", i, k, 1, secret, k, WPL, f"{WPL},{WPL}")
                     for i in range(LEAVES) for k in range(WPL)]
            finish_workers(procs, d, run_workers(procs, tb, bins, d, specs, elements, a.iterations, ["--verify"]),
                           timeout)
            qdisc_snapshot(tb, 2, d, "after")
            fabric.stop(d)
            (d / "trees").write_text(f"{trees}\n")

        if not a.no_unshaped:
            one("unshaped-1tree-r1", 1)
            one("unshaped-2tree-r1", 2)
        ecn = 0 if a.trees_no_ecn else 1
        shape_fabric(tb, 2, a, run_dir, ecn)
        (run_dir / "trees-ecn").write_text(f"{ecn}\n")
        for rep in range(1, a.repeat + 1):
            # Alternate the order so that a drift of the machine's speed does
            # not favour one side.
            for t in ((1, 2) if rep % 2 == 1 else (2, 1)):
                one(f"shaped-{t}tree-r{rep}", t)


def fairness_part(a, run_dir, bins):
    elements = a.fair_mib * 1024 * 1024 // 4
    iterations = fair_iterations(a.seconds, a.fair_mib, a.rate)
    (run_dir / "fair-iterations").write_text(f"{iterations}\n")
    with Testbed(a.prefix, ["--leaves", LEAVES, "--spines", 1, "--workers-per-leaf", WPL,
                            "--hosts-per-leaf", 1], run_dir) as tb, Processes() as procs:
        shutil.copy(tb.env_file, run_dir / "fabric-1spines.env")
        marker = shape_fabric(tb, 1, a, run_dir, True)
        host = tb["leaf_1_host_0_addr"]
        server = procs.start(["sockperf", "server", "-i", host, "-p", SOCKPERF_PORT],
                             ns=tb["leaf_1_host_0_ns"], stdout=run_dir / "sockperf-server.log")
        time.sleep(0.5)
        if server.poll() is not None:
            raise HarnessError(f"sockperf server exited: {(run_dir / 'sockperf-server.log').read_text()}")
        (run_dir / "marker").write_text(f"{marker}\n")
        fabric = Fabric(procs, tb, bins, 1)

        def one(name, rep):
            d = run_dir / "fairness" / f"{name}-r{rep}"
            d.mkdir(parents=True)
            spine = Switchctl(f"{bins}/switchctl", d / "spine0.sock")
            cc = ["--no-congestion-control"] if name == "no_cc" else []
            log(f"fairness: run {name} ({rep} of {a.repeat}), {a.seconds} s probe")
            s1, s2 = random_secret(), random_secret()
            fabric.start(d, 1, [(1, s1, [0]), (2, s2, [1])])
            qdisc_snapshot(tb, 1, d, "before")
            workers = []
            if name != "idle":
                specs = []
                for i in range(LEAVES):
                    specs += [(f"worker-l{i}w0", i, 0, 1, s1, 0, 1, "1,1"), (f"worker-l{i}w1", i, 1, 2, s2, 0, 1, "1,1")]
                workers = run_workers(procs, tb, bins, d, specs, elements, iterations, cc)
                # Until both jobs are active at the spine, then 1 s more:
                # past slow start, the windows have met the queue.
                spine.wait_active({1, 2}, READY_TIMEOUT, f"fairness run {name} (see {d})")
                time.sleep(1)
            (d / "spine0.start.json").write_text(spine.stats_text())
            (d / "probe.t0").write_text(f"{time.time():.9f}\n")
            probe = procs.start(["sockperf", "under-load", "-i", host, "-p", SOCKPERF_PORT, "-t", a.seconds,
                                 "--msg-size", MSG_SIZE, "--full-rtt", "--mps", a.mps, "--reply-every", 1,
                                 "--full-log", d / "sockperf.csv"], ns=tb["leaf_0_host_0_ns"],
                                stdout=d / "sockperf.txt")
            rc = procs.wait([probe], a.seconds + 60)[0]
            (d / "probe.t1").write_text(f"{time.time():.9f}\n")
            (d / "spine0.end.json").write_text(spine.stats_text())
            if rc != 0:
                warn(f"fairness run {name}: sockperf exited with status {rc} (see {d}/sockperf.txt)")
            if workers:
                # A slower job is stopped 20 s after the probe ends.
                finish_workers(procs, d, workers, 20)
            qdisc_snapshot(tb, 1, d, "after")
            fabric.stop(d)

        for rep in range(1, a.repeat + 1):
            for r in ("idle", "no_cc", "cc"):
                one(r, rep)


def run(a):
    if a.mark_max <= a.mark_min:
        raise HarnessError(f"--mark-max ({a.mark_max}) must be above --mark-min ({a.mark_min})")
    ensure_packages(not a.no_install, ["python3-matplotlib", "iproute2", "sockperf", "clang", "llvm",
                                       "libbpf-dev", "linux-libc-dev", "bpftool"])
    bins = private_binaries(["switchd", "switchctl", "worker"], build=not a.no_build)
    st = stamp()
    run_dir = REPO_ROOT / "results" / f"bench-tree-{st}"
    run_dir.mkdir(parents=True)
    try:
        if "trees" in a.parts:
            trees_part(a, run_dir, bins)
        if "fairness" in a.parts:
            fairness_part(a, run_dir, bins)
    finally:
        shutil.rmtree(bins, ignore_errors=True)
        log(f"logs and raw outputs in {run_dir.relative_to(REPO_ROOT)}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out_json, out_png = RESULTS_DIR / f"bench-tree-{st}.json", RESULTS_DIR / f"bench-tree-{st}.png"
    commit = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
    run_report("bench_tree_report.py", [
        run_dir, "--json", out_json, "--png", out_png, "--rate", a.rate, "--mib", a.mib,
        "--iterations", a.iterations, "--repeat", a.repeat, "--seconds", a.seconds, "--fair-mib", a.fair_mib,
        "--mps", a.mps, "--mark-min", a.mark_min, "--mark-max", a.mark_max, "--prefix", a.prefix,
        "--command", shlex.join(["sudo", "scripts/bench", "tree", *sys.argv[2:]]), "--commit", commit or "unknown"])
    publish(out_json, out_png, "bench-tree", not a.no_docs)
    return 0


def prefix(text):
    import argparse
    import re
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,12}", text):
        raise argparse.ArgumentTypeError(f"bad prefix '{text}'")
    return text


SCENARIO = Scenario(
    name="tree",
    summary="1 aggregation tree against 2, and fairness, on a rate-limited leaf-spine fabric (root)",
    description=DESCRIPTION,
    run=run,
    needs_root=True,
    options=(
        Option("--parts", "trees, fairness or both", type=word_list(["trees", "fairness"]),
               default=["trees", "fairness"], metavar="LIST"),
        Option("--rate", "rate of every leaf-spine link, each way, in Mbit/s", type=uint_range(1, 100000),
               default=30, metavar="MBIT"),
        Option("--mib", "trees: tensor per worker in MiB of float32", type=uint_range(1, 1024), default=16,
               metavar="S"),
        Option("--iterations", "trees: all-reduces per run", type=uint_range(1, 1000), default=2, metavar="N"),
        Option("--repeat", "repeats of each kind of run, interleaved", type=uint_range(1, 100), default=3,
               metavar="R"),
        Option("--seconds", "fairness: length of the probe's measurement", type=uint_range(2, 3600),
               default=20, metavar="N"),
        Option("--fair-mib", "fairness: tensor per worker in MiB", type=uint_range(1, 1024), default=4,
               metavar="S"),
        Option("--mps", "fairness: probe messages per second", type=uint_range(1, 1000000), default=1000,
               metavar="M"),
        Option("--mark-min", "fairness: queue depth where CE marking starts", type=uint_range(0, 100000000),
               default=6000, metavar="BYTES"),
        Option("--mark-max", "fairness: queue depth where every ECT packet is marked",
               type=uint_range(1, 100000000), default=18000, metavar="BYTES"),
        Option("--no-unshaped", "trees: skip the reference runs on unshaped links"),
        Option("--trees-no-ecn", "trees: shaped links without CE marking (plain FIFOs)"),
        Option("--prefix", "testbed namespace prefix", type=prefix, default="tbch", metavar="P"),
        Option("--no-docs", "leave bench/results/bench-tree.{json,png} alone"),
        Option("--no-install", "do not apt-get install missing packages"),
        Option("--no-build", "do not run cargo build (use target/release as is)"),
    ),
)
