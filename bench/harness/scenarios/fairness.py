"""fairness.py: the `fairness` scenario: does the aggregation traffic's
congestion control keep a latency-sensitive flow's tail latency down?
(PANAMA's headline, issue 4) (root).

Testbed of 4 workers and 1 host (prefix "fair", or $FAIRNESS_PREFIX); job
1 = w0 + w1, job 2 = w2 + w3; a sockperf probe from w0 to a server in h0.
Every worker's eth0 egress is a shaped FIFO that marks CE (scripts/net.sh
ecn-bottleneck). This file only orchestrates and leaves raw counter dumps,
sockperf output and worker reports in results/fairness-STAMP/;
fairness_report.py computes every figure, the JSON, tables and plot.
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time

from lifecycle import (publish, REPO_ROOT, RESULTS_DIR, HarnessError, Processes, Testbed, log, random_secret,
                       run_report, stamp, start_switchd, tail, warn, write_switchd_config)
from options import uint_range, word_list
from scenario import Option, Scenario
from switchctl import Switchctl
from tools import ensure_packages, net, private_binaries

AGG_PORT = 48879
SOCKPERF_PORT = 11111
MSG_SIZE = 64
READY_TIMEOUT = 30
# Bytes of one full chunk's DATA on the wire (the shaped way, worker
# egress): 358 floats + 22 (header) + 8 (UDP) + 20 (IPv4) + 14 (Ethernet).
CHUNK_PAYLOAD = 1432
CHUNK_WIRE = 1496
PROBE_MODES = {"ul": "under-load", "pp": "ping-pong"}

DESCRIPTION = """\
Three runs of N seconds each:
  idle    sockperf alone
  no_cc   sockperf + both jobs all-reducing with --no-congestion-control
  cc      sockperf + both jobs all-reducing with the DCTCP window (default)
For each: sockperf's p50/p99/p99.9 round trip, each job's throughput,
Jain's index, the workers' window/alpha/ECE counts, the queue's CE marks and
depth, the switch's per-job counters. Writes bench/results/fairness.{json,png}
(unless --no-docs) and bench/results/fairness-STAMP.{json,png}; raw outputs
in results/fairness-STAMP/. The CE marker is a tc-BPF program (kernel 6.2+
with BTF) or, when it cannot load, RED with ecn. FAIRNESS_PREFIX changes the
testbed prefix; FAIR_PROBE_PRIO > 0 runs the probe under chrt -f."""


def mps(text):
    if text == "max":
        return text
    return uint_range(1, 1000000)(text)


def probe(text):
    if text not in PROBE_MODES:
        raise argparse.ArgumentTypeError(f"must be ul (under-load) or pp (ping-pong), got '{text}'")
    return text


def iterations(seconds, elements, rate_mbit):
    """Enough all-reduces that even at the shaper's full rate they outlast
    the latency measurement (+3 s)."""
    return (seconds + 3) * (rate_mbit * 1000000 * CHUNK_PAYLOAD // CHUNK_WIRE) // (elements * 32) + 2


def run(a):
    if a.mark_max <= a.mark_min:
        raise HarnessError(f"--mark-max ({a.mark_max}) must be above --mark-min ({a.mark_min})")
    prefix = os.environ.get("FAIRNESS_PREFIX", "fair")
    prio = int(os.environ.get("FAIR_PROBE_PRIO", "0") or 0)
    prio_cmd = ["chrt", "-f", str(prio)] if prio > 0 else []
    ensure_packages(not a.no_install, ["sockperf", "python3-matplotlib", "clang", "llvm", "libbpf-dev",
                                       "linux-libc-dev", "bpftool", "iproute2"])
    bins = private_binaries(["switchd", "switchctl", "worker"], build=not a.no_build)
    st = stamp()
    rd = REPO_ROOT / "results" / f"fairness-{st}"
    rd.mkdir(parents=True)
    sock = rd / "switchd.sock"
    n_iter = iterations(a.seconds, a.elements, a.rate)
    worker_timeout = a.seconds * 10 + 120

    ctl = Switchctl(f"{bins}/switchctl", sock)
    switch_stats = ctl.stats_text

    try:
        with Testbed(prefix, ["--workers", 4, "--hosts", 1], rd) as tb, Processes() as procs:
            host = tb["host_0_addr"]
            marker = net("ecn-bottleneck", rd, a.rate, a.mark_min, a.mark_max,
                         *[f"{prefix}-w{i}:eth0" for i in range(4)]).splitlines()[-1]
            log(f"bottleneck: every worker's eth0 egress at {a.rate} Mbit/s, CE marks from {a.mark_min} to "
                f"{a.mark_max} bytes of queue ({marker})")

            def queue_snapshot(ns, out):
                r = subprocess.run(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", "eth0"],
                                   stdout=subprocess.PIPE, text=True)
                (rd / f"{out}.tc.json").write_text(r.stdout)
                if marker == "bpf":
                    try:
                        map_id = net("ecn-map-id", ns, "eth0")
                    except HarnessError:
                        raise HarnessError(f"the CE marker on {ns} eth0 is gone") from None
                    r = subprocess.run(["bpftool", "map", "dump", "id", map_id, "-j"], stdout=subprocess.PIPE,
                                       text=True)
                    (rd / f"{out}.map.json").write_text(r.stdout)

            secrets = {1: random_secret(), 2: random_secret()}
            for j, s in secrets.items():
                (rd / f"secret{j}").write_text(s)
                (rd / f"secret{j}").chmod(0o600)
            write_switchd_config(f"{bins}/switchd", tb, rd / "switchd.toml", "scripts/bench fairness",
                                 host_ports=True, jobs=[f"1:0-1:file:{rd}/secret1", f"2:2-3:file:{rd}/secret2"],
                                 sets=[f"switch.agg_port={AGG_PORT}", f'switch.admin_socket="{sock}"'])
            log(f"starting switchd in {prefix}-sw")
            start_switchd(procs, f"{prefix}-sw", f"{bins}/switchd", rd / "switchd.log",
                          ["run", "--config", rd / "switchd.toml"], READY_TIMEOUT)
            server = procs.start([*prio_cmd, "sockperf", "server", "-i", host, "-p", SOCKPERF_PORT],
                                 ns=f"{prefix}-h0", stdout=rd / "sockperf-server.log")
            time.sleep(0.5)
            if server.poll() is not None:
                raise HarnessError(f"sockperf server exited: {tail(rd / 'sockperf-server.log')}")

            def run_one(name, rep):
                d = rd / f"{name}-{rep}"
                d.mkdir()
                label = {"idle": "idle (sockperf alone)", "no_cc": "load, no congestion control",
                         "cc": "load, DCTCP congestion control"}[name]
                log(f"run '{name}' ({rep} of {a.repeat}): {label}, {a.seconds} s")
                for i in range(4):
                    queue_snapshot(f"{prefix}-w{i}", f"{d.name}/queue-w{i}.before")
                (d / "switch.before.json").write_text(switch_stats())
                workers = []
                if name != "idle":
                    cc = ["--no-congestion-control"] if name == "no_cc" else []
                    workers = [procs.start([f"{bins}/worker", "allreduce", "--switch", tb["switch_addr"],
                                            "--job", i // 2 + 1, "--rank", i % 2, "--workers", 2,
                                            "--elements", a.elements, "--iterations", n_iter, "--json", *cc],
                                           ns=f"{prefix}-w{i}", env={"AGGSWITCH_SECRET": secrets[i // 2 + 1]},
                                           stdout=d / f"worker-w{i}.json", stderr=d / f"worker-w{i}.log")
                               for i in range(4)]
                    ctl.wait_active({1, 2}, READY_TIMEOUT, f"run '{name}' (see {d})")
                    time.sleep(1)  # past slow start: the window has met the queue
                (d / "switch.start.json").write_text(switch_stats())
                (d / "probe.t0").write_text(f"{time.time():.9f}\n")
                extra = ["--reply-every", 1] if a.probe == "ul" else []
                client = procs.start([*prio_cmd, "sockperf", PROBE_MODES[a.probe], "-i", host, "-p", SOCKPERF_PORT,
                                      "-t", a.seconds, "--msg-size", MSG_SIZE, "--full-rtt", "--mps", a.mps, *extra,
                                      "--full-log", d / "sockperf.csv"], ns=f"{prefix}-w0",
                                     stdout=d / "sockperf.txt")
                rc = procs.wait([client], a.seconds + 60)[0]
                (d / "probe.t1").write_text(f"{time.time():.9f}\n")
                (d / "switch.end.json").write_text(switch_stats())
                if rc != 0:
                    warn(f"run '{name}': sockperf exited with status {rc} (see {d}/sockperf.txt)")
                # Let the all-reduces finish (they print their JSON at the end).
                if workers:
                    for i, s in enumerate(procs.wait(workers, worker_timeout, stop_on_failure=False)):
                        (d / f"worker-w{i}.exit").write_text(f"{s}\n")
                        if s != 0:
                            warn(f"run '{name}': worker {prefix}-w{i} exited with {s}: "
                                 f"{tail(d / f'worker-w{i}.log', 2)}")
                (d / "switch.after.json").write_text(switch_stats())
                for i in range(4):
                    queue_snapshot(f"{prefix}-w{i}", f"{d.name}/queue-w{i}.after")
                time.sleep(1)

            for rep in range(1, a.repeat + 1):
                for r in a.runs:
                    run_one(r, rep)
    finally:
        shutil.rmtree(bins, ignore_errors=True)
        log(f"logs and raw outputs in {rd.relative_to(REPO_ROOT)}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out_json, out_png = RESULTS_DIR / f"fairness-{st}.json", RESULTS_DIR / f"fairness-{st}.png"
    commit = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
    print()
    run_report("fairness_report.py", [
        "report", rd, "--json", out_json, "--png", out_png, "--prefix", prefix, "--marker", marker,
        "--rate", a.rate, "--mark-min", a.mark_min, "--mark-max", a.mark_max, "--elements", a.elements,
        "--iterations", n_iter, "--seconds", a.seconds, "--repeat", a.repeat, "--runs", ",".join(a.runs),
        "--mps", a.mps, "--msg-size", MSG_SIZE, "--probe-mode", PROBE_MODES[a.probe], "--host-addr", host,
        "--command", shlex.join(["sudo", "scripts/bench", "fairness", *sys.argv[2:]]),
        "--commit", commit or "unknown"])
    publish(out_json, out_png, "fairness", not a.no_docs)
    return 0


SCENARIO = Scenario(
    name="fairness",
    summary="a latency probe's tail beside two all-reducing jobs, with and without congestion control (root)",
    description=DESCRIPTION,
    run=run,
    needs_root=True,
    options=(
        Option("--seconds", "length of each run's latency measurement", type=uint_range(2, 3600), default=20,
               metavar="N"),
        Option("--repeat", "do the runs R times, interleaved; tables and plot show the median",
               type=uint_range(1, 100), default=1, metavar="R"),
        Option("--rate", "egress shaper rate of every worker, Mbit/s", type=uint_range(1, 100000), default=100,
               metavar="MBIT"),
        Option("--mark-min", "queue depth above which CE marking starts", type=uint_range(0, 100000000),
               default=6000, metavar="BYTES"),
        Option("--mark-max", "queue depth at which every ECT packet is marked (linear in between)",
               type=uint_range(1, 100000000), default=18000, metavar="BYTES"),
        Option("--elements", "float32 elements per all-reduce", type=uint_range(1, 268435456), default=4194304,
               metavar="E"),
        Option("--probe", "sockperf mode: ul = under-load, open loop; pp = ping-pong, closed loop", type=probe,
               default="ul", metavar="ul|pp"),
        Option("--mps", "sockperf messages per second (sockperf busy-waits one core to pace them)", type=mps,
               default=1000, metavar="M|max"),
        Option("--runs", "which runs, comma-separated", type=word_list(["idle", "no_cc", "cc"]),
               default=["idle", "no_cc", "cc"], metavar="LIST"),
        Option("--no-docs", "leave bench/results/fairness.{json,png} alone"),
        Option("--no-install", "do not apt-get install missing packages"),
        Option("--no-build", "do not run cargo build (use target/release as is)"),
    ),
)
