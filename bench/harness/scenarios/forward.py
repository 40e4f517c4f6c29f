"""forward.py: the `forward` scenario: what the switch costs ordinary
(non-aggregation) traffic (root). TCP throughput (iperf3) and UDP
ping-pong latency (sockperf) between two hosts of one testbed, through a
plain Linux bridge (bridge), switchd with forwarding = "bridge" (xdp-pass)
and switchd with forwarding = "xdp" (xdp-fwd), interleaved over rounds;
bench_forward_report.py takes the medians and ratios and writes the JSON.
"""

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from lifecycle import (REPO_ROOT, RESULTS_DIR, HarnessError, Processes, Testbed, log, run_report,
                       start_switchd, stamp, tail, write_switchd_config)
from machine import nproc
from options import uint_range
from scenario import Option, Scenario
from tools import ensure_packages

PREFIX = "fwd"
IPERF_PORT = 5201
SOCKPERF_PORT = 11111
SETUPS = ("bridge", "xdp-pass", "xdp-fwd")
FORWARDING = {"xdp-pass": "bridge", "xdp-fwd": "xdp"}

DESCRIPTION = """\
Ratios against the plain bridge are the headline; absolute numbers depend
on the machine and on whatever else runs on it. Latency is measured twice:
client and server pinned to the same CPU (the last; switchd's dataplane
thread is pinned to CPU 0), the headline, and (with 2+ CPUs) client on
CPU 0, server on the last ("cross-CPU"). With switchd it also reads the XDP
counters at exit, so the JSON shows which path the frames took. Installs
iperf3 and sockperf when missing; uses $AGG_SWITCHD or
target/release/switchd (built when missing). Every process it starts is
stopped by PID and the testbed removed on exit, also on failure."""


def ensure_tools():
    # By command, not by package: tools installed another way count.
    missing = [t for t in ("iperf3", "sockperf", "ethtool") if shutil.which(t) is None]
    if missing:
        ensure_packages(True, missing)


def switchd_binary():
    path = Path(os.environ.get("AGG_SWITCHD", REPO_ROOT / "target" / "release" / "switchd"))
    if not os.access(path, os.X_OK):
        log("building switchd (cargo build --release -p switchd --bins)")
        if subprocess.run(["cargo", "build", "--release", "-p", "switchd", "--bins"], cwd=REPO_ROOT).returncode:
            raise HarnessError("building switchd failed")
    if not os.access(path, os.X_OK):
        raise HarnessError(f"switchd not found at {path}")
    return path


def checked(procs, argv, ns, out, what, timeout):
    p = procs.start(argv, ns=ns, stdout=out)
    if procs.wait([p], timeout) != [0]:
        raise HarnessError(f"{what} failed: {tail(out, 5)}")


def run(a):
    ensure_tools()
    switchd = switchd_binary()
    st = stamp()
    json_out = Path(a.json) if a.json else RESULTS_DIR / f"bench-forward-{st}.json"
    json_out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-forward."))
    h0, h1, sw_ns = f"{PREFIX}-h0", f"{PREFIX}-h1", f"{PREFIX}-sw"
    lat_cpu, cross_cpu = nproc() - 1, 0
    limit = a.secs + 60
    try:
        with Testbed(PREFIX, ["--workers", 1, "--hosts", 2], work) as tb, Processes() as procs:
            h1_addr = tb["host_1_addr"]
            servers = [procs.start(["iperf3", "-s", "-B", h1_addr, "-p", IPERF_PORT], ns=h1,
                                   stdout=work / "iperf3-server.log"),
                       procs.start(["taskset", "-c", lat_cpu, "sockperf", "server", "-i", h1_addr,
                                    "-p", SOCKPERF_PORT], ns=h1, stdout=work / "sockperf-server.log")]
            time.sleep(1)
            for p, name in zip(servers, ("iperf3", "sockperf")):
                if p.poll() is not None:
                    raise HarnessError(f"{name} server did not start: {tail(work / f'{name}-server.log')}")

            def measure(setup, rnd):
                base = work / f"{setup}-{rnd}"
                # Resolve ARP and let the fast path learn both MACs.
                checked(procs, ["ping", "-c", 2, "-i", 0.2, "-W", 2, h1_addr], h0, base.with_suffix(".ping"),
                        f"{setup}: h0 cannot ping h1;", 30)
                checked(procs, ["iperf3", "-c", h1_addr, "-p", IPERF_PORT, "-t", a.secs, "-J"], h0,
                        f"{base}.iperf.json", f"{setup}: iperf3", limit)
                pong = ["sockperf", "ping-pong", "-i", h1_addr, "-p", SOCKPERF_PORT, "-t", a.secs,
                        "-m", a.msg_size, "--full-rtt"]
                checked(procs, ["taskset", "-c", lat_cpu, *pong], h0, f"{base}.sockperf.txt",
                        f"{setup}: sockperf", limit)
                if lat_cpu != cross_cpu:
                    checked(procs, ["taskset", "-c", cross_cpu, *pong], h0, f"{base}.sockperf-x.txt",
                            f"{setup}: sockperf (cross-CPU)", limit)

            log(f"testbed '{PREFIX}' up; {a.rounds} rounds of {' '.join(SETUPS)}, {a.secs} s each test")
            for rnd in range(1, a.rounds + 1):
                for setup in SETUPS:
                    log(f"round {rnd}/{a.rounds}: {setup}")
                    if setup not in FORWARDING:
                        measure(setup, rnd)
                        continue
                    cfg, stats = work / "switchd.toml", work / "stats.json"
                    write_switchd_config(switchd, tb, cfg, "scripts/bench forward", host_ports=True,
                                         sets=["switch.summary_interval_secs=1.0",
                                               f'switch.admin_socket="{work}/admin.sock"',
                                               f"switch.forwarding={FORWARDING[setup]}"])
                    stats.unlink(missing_ok=True)
                    sw = start_switchd(procs, sw_ns, switchd, work / "switchd.log",
                                       ["run", "--config", cfg, "--stats-file", stats])
                    measure(setup, rnd)
                    rc = procs.stop(sw, 15)
                    if rc != 0:
                        raise HarnessError(f"switchd exited with status {rc}: {tail(work / 'switchd.log', 20)}")
                    if not stats.exists():
                        raise HarnessError("switchd wrote no stats file")
                    shutil.copy(stats, work / f"{setup}-{rnd}.stats.json")
                    links = subprocess.run(["ip", "-n", sw_ns, "-d", "link", "show"], stdout=subprocess.PIPE,
                                           text=True).stdout
                    if "prog/xdp" in links:
                        raise HarnessError("switchd left an XDP program attached")
        m = re.search(r"attached in [a-z]* \([a-z]*\) mode", (work / "switchd.log").read_text())
        run_report("bench_forward_report.py", [work, json_out, a.rounds, a.secs, a.msg_size, st,
                                               m.group(0) if m else "", *SETUPS])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


SCENARIO = Scenario(
    name="forward",
    summary="what the switch costs ordinary traffic: TCP throughput and UDP latency (root)",
    description=DESCRIPTION,
    run=run,
    needs_root=True,
    options=(
        Option("--json", "write the results here (default bench/results/bench-forward-STAMP.json)", type=str,
               metavar="FILE"),
        Option("--secs", "seconds per iperf3 run and per sockperf run", type=uint_range(1, 600), default=3,
               metavar="S"),
        Option("--rounds", "the three setups are measured R times, interleaved; medians reported",
               type=uint_range(1, 100), default=3, metavar="R"),
        Option("--msg-size", "sockperf message size in bytes", type=uint_range(12, 65000), default=64,
               metavar="B"),
    ),
)
