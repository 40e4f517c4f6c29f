"""efficiency.py: the `efficiency` scenario: what a gradient all-reduce
costs per byte, in time and in CPU: the switch (float32 with each worker
transport, and the narrower dtypes) against OpenMPI's TCP ring with TSO and
PyTorch's gloo, in the same run, at each MTU, on unlimited links and on
links limited to 1 Gbit/s each way (root).

The peers run on the plain bridge with switchd stopped and the workers'
transmit offload on (TSO, as on a real NIC); the switch with switchd and
the testbed's offload settings. bench_efficiency_report.py turns the runs
manifest (runs.jsonl) into the table, JSON and PNG.

Worker threads: with --worker-threads T1,T2,... the switch runs (every
dtype and transport) run once per T, `worker --threads T`, each against a
switchd of its own whose seq_lanes is at least T (a power of two: the
worker's threads split the chunks by seq lane); T = 1 runs with the
config as it always was. A T larger than the machine's CPUs is skipped
with a line saying so. The workers read switchd's CPU at the edges of
their timed all-reduces (`--switchd-pid`), so its CPU per GiB is counted
apart from theirs. On a machine with >= 16 CPUs the run adds what issue
38's many-core goals need: links shaped to 10 Gbit/s, and one worker alone
(a one-worker job) at T = 1 and 4 on unlimited links at the largest MTU.

Switch threads: --switch-threads N gives switchd N dataplane threads and N
sockets per port, the testbed's veths N queues; each worker socket's flow
lands on a queue by its hash, as RSS spreads flows on a NIC (one switchd
thread is the limit past a few Gbit/s). A lent machine without a Rust
toolchain or network takes --no-build: the binaries in target/release as
they are (carried there), no cargo and no apt-get, gloo under
$AGGSWITCH_BENCH_PYTHON (a Python with torch), and OpenMPI only where
mpicc is installed.
"""

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lifecycle import (lanes_for, seq_lane_sets, publish, release_binary, REPO_ROOT, RESULTS_DIR, HarnessError, Processes, Testbed, log, random_secret,
                       run_checked, run_report, stamp, start_switchd, warn, write_switchd_config)
from machine import nproc, worker_threads_to_run
from options import thread_counts, uint_list, uint_range, word_list
import perf_paths
from scenario import Option, Scenario
from tools import NET_SH, build_release, ensure_packages, net
from torch_bench import bench_python

PREFIX = "eff"
WORKERS = 4
GLOO_PORT = 29517
TBF_ARGS = ["rate", "1gbit", "burst", "256kb", "latency", "50ms"]
TBF_10GBIT = ["rate", "10gbit", "burst", "2560kb", "latency", "50ms"]
# Issue 38's many-core goals are measured on machines with this many CPUs.
MANY_CORES = 16
# The one-worker-alone job (many cores only) and its thread counts.
ALONE_JOB = 9
ALONE_THREADS = (1, 4)
PACKAGES = ["clang", "llvm", "libbpf-dev", "linux-libc-dev", "iproute2", "ethtool", "gcc", "openmpi-bin",
            "libopenmpi-dev", "python3", "python3-matplotlib"]
JOB_OF = {"f32": 1, "bf16": 2, "f16": 3}

DESCRIPTION = """\
Every measurement is K all-reduces of the tensor by 4 workers on the veth
testbed (prefix "eff"), after one untimed warm-up. Time: the slowest rank's,
per all-reduce. CPU: the whole machine's busy CPU time (/proc/stat) over the
all-reduces only, in CPU-seconds per GiB of float32 gradient reduced; also
the workers' own and switchd's own apart (on a cluster they are different
machines). --worker-threads 1,2,4 runs the switch once per worker thread
count T (switchd seq_lanes >= T; a T above the CPUs is skipped) and prints
issue 38's goal table for T = 1 and the best T.
1 Gbit/s links: tbf on every worker link, both ways. Writes
bench/results/efficiency-STAMP.{json,png} (or --json/--png) and, unless
--quick or --no-docs, bench/results/bench-efficiency.{json,png}. Every
process started is stopped by PID and the testbed removed on exit."""


def settings(a):
    """(mib, repeats, mtus, docs) after --quick and the defaults."""
    mib = a.mib if a.mib is not None else (8 if a.quick else 64)
    repeats = a.repeats if a.repeats is not None else (2 if a.quick else 5)
    mtus = a.mtus or ([1500] if a.quick else [1500, 9000])
    return mib, repeats, mtus, not (a.quick or a.no_docs)


def switch_threads(n):
    """(testbed arguments, switchd config settings) for n switchd
    dataplane threads: n queues per veth and n sockets per port."""
    if n == 1:
        return [], []
    return ["--queues", n], [f"switch.queues={n}", f"switch.dataplane_threads={n}"]


def check_tools(a):
    """Without a build: what the run needs must be there already. Returns
    whether OpenMPI runs (mpicc and mpirun installed)."""
    needed = ["ip", "tc", "ethtool"] + (["perf"] if a.profile else [])
    missing = [c for c in needed if shutil.which(c) is None]
    if missing:
        raise HarnessError(f"--no-build: {' '.join(missing)} not found (apt-get install iproute2 ethtool"
                           f"{' linux-perf' if 'perf' in missing else ''}, or drop --no-build)")
    for b in ("switchd", "switchctl", "worker"):
        release_binary(b)
    mpi = all(shutil.which(c) for c in ("mpicc", "mpirun"))
    if not mpi:
        log("--no-build: mpicc or mpirun not installed: OpenMPI is skipped")
    return mpi


def run(a):
    mib, repeats, mtus, docs = settings(a)
    cpus = nproc()
    threads = worker_threads_to_run(a.worker_threads, log, HarnessError)
    many = cpus >= MANY_CORES
    elements = mib * 1024 * 1024 // 4
    gloo_py = bench_python()
    if a.no_build:
        mpi = check_tools(a)
    else:
        mpi = True
        ensure_packages(True, PACKAGES)
        if a.profile and shutil.which("perf") is None:
            ensure_packages(True, ["linux-perf"])
        build_release()
    if not a.no_gloo and subprocess.run([gloo_py, "-c", "import torch"], stderr=subprocess.DEVNULL).returncode:
        if a.no_build:
            raise HarnessError(f"gloo needs torch: {gloo_py} cannot import it (set AGGSWITCH_BENCH_PYTHON to a "
                               "Python that can, or pass --no-gloo)")
        log("gloo needs torch in the project venv: running scripts/setup.sh")
        if subprocess.run(["bash", str(REPO_ROOT / "scripts" / "setup.sh")]).returncode:
            raise HarnessError("scripts/setup.sh failed; fix what it says, or pass --no-gloo")
    queue_args, thread_sets = switch_threads(a.switch_threads)
    st = stamp()
    rd = REPO_ROOT / "results" / f"efficiency-{st}"
    (rd / "bin").mkdir(parents=True)
    for b in ("switchd", "switchctl", "worker"):
        shutil.copy2(REPO_ROOT / "target" / "release" / b, rd / "bin")
    switchd, worker, mpi_bin = rd / "bin" / "switchd", rd / "bin" / "worker", rd / "bin" / "mpi_allreduce"
    if mpi:
        run_checked(["mpicc", "-O2", "-o", mpi_bin, REPO_ROOT / "bench" / "mpi_allreduce.c"],
                    "mpicc on bench/mpi_allreduce.c")
    mpi_tmp = Path(tempfile.mkdtemp(prefix="eff-mpi."))
    hostfile, rsh = rd / "hostfile", rd / "netns-ssh.sh"
    secret = random_secret()
    manifest = rd / "runs.jsonl"
    manifest.write_text("")
    profiled_mtu = max(mtus)

    def record(d, mtu, lnk, method, dtype, transport, threads=None):
        with open(manifest, "a") as f:
            f.write(json.dumps({"dir": str(d), "mtu": mtu, "link": lnk, "method": method, "dtype": dtype,
                                "transport": transport, "threads": threads}, separators=(",", ":")) + "\n")

    log(f"run {st}: {WORKERS} workers, {mib} MiB, {repeats} all-reduces per measurement; MTUs "
        f"{' '.join(map(str, mtus))}; worker threads {','.join(map(str, threads))}; switchd threads "
        f"{a.switch_threads}; logs in {rd}")
    try:
        for mtu in mtus:
            with Testbed(PREFIX, ["--workers", WORKERS, "--mtu", mtu, *queue_args], rd) as tb, Processes() as procs:
                shutil.copy(tb.env_file, rd / f"testbed-mtu{mtu}.env")
                jobs, sets = [], list(thread_sets)
                for d in a.dtypes:
                    jobs.append(f"{JOB_OF[d]}:all:env:AGGSWITCH_TESTBED_SECRET")
                    sets.append(f"job.{JOB_OF[d]}.dtype={d}")
                if many:
                    jobs.append(f"{ALONE_JOB}:0-0:env:AGGSWITCH_TESTBED_SECRET")

                written = set()

                def config(lanes):
                    """This testbed's switchd config with seq_lanes = lanes (1: as it always was)."""
                    cfg = rd / ("switchd.toml" if lanes == 1 else f"switchd-lanes{lanes}.toml")
                    if lanes not in written:
                        write_switchd_config(switchd, tb, cfg, "scripts/bench efficiency", secret=secret, jobs=jobs,
                                             sets=sets + seq_lane_sets(lanes))
                        written.add(lanes)
                    return cfg
                if mpi:
                    net("mpi-hosts", tb.env_file, WORKERS, hostfile, rsh, mpi_tmp)

                def run_switch(d, dtype, transport, t, sw, job=None, workers=WORKERS, iterations=None):
                    d.mkdir(parents=True, exist_ok=True)
                    extra = ([] if dtype == "f32" else ["--dtype", dtype]) + \
                        ([] if transport == "auto" else ["--transport", transport])
                    ranks = [procs.start([worker, "allreduce", "--switch", tb["switch_addr"],
                                          "--job", job or JOB_OF[dtype], "--rank", r, "--workers", workers,
                                          "--elements", elements, "--warmup", 1, "--iterations", iterations or repeats,
                                          "--json",
                                          "--machine-cpu", "--switchd-pid", sw.pid, "--threads", t, *extra],
                                         ns=f"{PREFIX}-w{r}", env={"AGGSWITCH_SECRET": secret},
                                         stdout=d / f"rank{r}.json", stderr=d / f"rank{r}.log") for r in range(workers)]
                    if any(s != 0 for s in procs.wait(ranks, a.timeout)):
                        raise HarnessError(f"switch all-reduce ({dtype}, transport {transport}, {t} worker "
                                           f"thread(s)) failed; see {d}/rank*.log")

                def run_peer(d, kind, dtype="f32"):
                    d.mkdir(parents=True, exist_ok=True)
                    if kind == "openmpi":
                        ps = [procs.start(["bash", NET_SH, "mpirun", PREFIX, WORKERS, hostfile, rsh, mpi_tmp, mpi_bin,
                                           elements, repeats], stdout=d / "peer.out", stderr=d / "peer.log", cwd=d)]
                    else:
                        ps = [procs.start(["env", f"RANK={r}", f"WORLD_SIZE={WORKERS}", f"MASTER_ADDR={tb['worker_0_addr']}",
                                           f"MASTER_PORT={GLOO_PORT}", "GLOO_SOCKET_IFNAME=eth0", "OMP_NUM_THREADS=1",
                                           gloo_py, REPO_ROOT / "bench" / "gloo_allreduce.py", elements, repeats, dtype],
                                          ns=f"{PREFIX}-w{r}", stdout=d / f"rank{r}.out", stderr=d / f"rank{r}.log")
                              for r in range(WORKERS)]
                    if any(s != 0 for s in procs.wait(ps, a.timeout)):
                        raise HarnessError(f"{kind} all-reduce failed; see {d}")
                    for out in (d / "peer.out", d / "rank0.out"):
                        if out.exists() and out.stat().st_size:
                            lines = [ln for ln in out.read_text().splitlines() if ln.startswith("{")]
                            if lines:
                                (d / "peer.json").write_text(lines[-1] + "\n")
                    if not (d / "peer.json").exists():
                        raise HarnessError(f"{kind} printed no JSON; see {d}")
                    if json.loads((d / "peer.json").read_text()).get("verified") is not True:
                        raise HarnessError(f"{kind} gave a wrong sum; see {d}")

                def profiled(d, t, sw):
                    data = rd / "perf.data"
                    perf = procs.start(["perf", "record", "-a", "-g", "-q", "-o", data], stdout=rd / "perf-record.log")
                    time.sleep(0.5)
                    # 4x the all-reduces: what a rank does before them (its input
                    # filled, its buffers' first touch) weighs a quarter as much.
                    run_switch(d, "f32", a.transports[0], t, sw, iterations=4 * repeats)
                    perf.send_signal(2)
                    # perf record ends on SIGINT with status 0 or by the signal.
                    if procs.wait([perf], 60) not in ([0], [-2]):
                        warn(f"perf record did not end cleanly; see {rd}/perf-record.log")
                    for out, extra in (("profile-comm.txt", ["--sort", "comm"]),
                                       ("profile-sym.txt", ["--sort", "comm,sym", "-g", "none", "--percent-limit", "0.7"])):
                        with open(rd / out, "w") as f:
                            if subprocess.run(["perf", "report", "-i", str(data), "--no-children", *extra, "--stdio"],
                                              stdout=f, stderr=subprocess.DEVNULL).returncode:
                                warn("perf report failed")
                    if not perf_paths.write(data, rd / "profile-paths.txt"):
                        warn("perf script failed: no profile-paths.txt")
                    data.unlink(missing_ok=True)
                    log(f"profile: {rd}/profile-paths.txt (by path), {rd}/profile-comm.txt, {rd}/profile-sym.txt")

                def measure(lnk):
                    base = rd / f"mtu{mtu}" / lnk
                    net("worker-tx", PREFIX, WORKERS, "on")
                    if mpi:
                        log(f"[MTU {mtu}, {lnk}] OpenMPI with TSO")
                        run_peer(base / "openmpi_tso", "openmpi")
                        record(base / "openmpi_tso", mtu, lnk, "openmpi_tso", "f32", "tcp")
                    if not a.no_gloo:
                        log(f"[MTU {mtu}, {lnk}] gloo with TSO")
                        run_peer(base / "gloo_tso", "gloo")
                        record(base / "gloo_tso", mtu, lnk, "gloo_tso", "f32", "tcp")
                        if "bf16" in a.dtypes:
                            log(f"[MTU {mtu}, {lnk}] gloo with TSO, bf16 (PyTorch's bf16 compression)")
                            run_peer(base / "gloo_tso_bf16", "gloo", "bf16")
                            record(base / "gloo_tso_bf16", mtu, lnk, "gloo_tso", "bf16", "tcp")
                    net("worker-tx", PREFIX, WORKERS, "off")
                    for th in threads:
                        lanes = lanes_for(th)
                        at = "" if th == 1 else f"-t{th}"
                        sw = start_switchd(procs, f"{PREFIX}-sw", switchd, base / f"switchd{at}.log",
                                           ["run", "--config", config(lanes)])
                        for d in a.dtypes:
                            for t in a.transports:
                                # One transport is enough to show what the narrower type saves.
                                if d != "f32" and t != a.transports[0]:
                                    continue
                                log(f"[MTU {mtu}, {lnk}] switch, {d}, transport {t}, {th} worker thread(s)"
                                    + ("" if lanes == 1 else f", switchd seq_lanes {lanes}"))
                                run_switch(base / f"switch-{d}-{t}{at}", d, t, th, sw)
                                record(base / f"switch-{d}-{t}{at}", mtu, lnk, "switch", d, t, th)
                        if a.profile and mtu == profiled_mtu and lnk == "unlimited" and th == threads[0]:
                            # An extra run: perf's own cost must not reach the measured ones.
                            log(f"[MTU {mtu}, {lnk}] switch, f32, transport {a.transports[0]}, under perf record")
                            profiled(base / "profile-run", th, sw)
                        procs.stop(sw)
                    if many and mtu == profiled_mtu and lnk == "unlimited":
                        # Issue 38: one worker alone, T = 4 against T = 1.
                        sw = start_switchd(procs, f"{PREFIX}-sw", switchd, base / "switchd-alone.log",
                                           ["run", "--config", config(lanes_for(max(ALONE_THREADS)))])
                        for th in ALONE_THREADS:
                            log(f"[MTU {mtu}, {lnk}] switch, one worker alone, {th} worker thread(s)")
                            run_switch(base / f"alone-t{th}", "f32", a.transports[0], th, sw, ALONE_JOB, 1)
                            record(base / f"alone-t{th}", mtu, lnk, "switch_alone", "f32", a.transports[0], th)
                        procs.stop(sw)

                measure("unlimited")
                if many:
                    net("shape-workers", PREFIX, WORKERS, *TBF_10GBIT)
                    measure("10gbit")
                net("shape-workers", PREFIX, WORKERS, *TBF_ARGS)
                measure("1gbit")
    except BaseException:
        log(f"failed; logs in {rd}")
        raise
    finally:
        shutil.rmtree(mpi_tmp, ignore_errors=True)
        shutil.rmtree(rd / "bin", ignore_errors=True)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out_json = Path(a.json) if a.json else RESULTS_DIR / f"efficiency-{st}.json"
    out_png = Path(a.png) if a.png else RESULTS_DIR / f"efficiency-{st}.png"
    run_report("bench_efficiency_report.py", ["--runs", manifest, "--stamp", st, "--mib", mib, "--repeats", repeats,
                                              "--workers", WORKERS, "--json", out_json, "--png", out_png,
                                              "--table", rd / "table.md",
                                              "--worker-threads", ",".join(map(str, a.worker_threads)),
                                              "--cpus", cpus, "--switch-threads", a.switch_threads,
                                              *(["--profile-shares", rd / "profile-paths.json"] if a.profile else [])])
    sys.stdout.write((rd / "table.md").read_text())
    publish(out_json, out_png, "bench-efficiency", docs)
    return 0


SCENARIO = Scenario(
    name="efficiency",
    summary="time and CPU per GiB: the switch against OpenMPI and gloo, per MTU and link (root)",
    description=DESCRIPTION,
    run=run,
    needs_root=True,
    options=(
        Option("--mib", "tensor per worker in MiB of float32 (default 64; --quick: 8)", type=uint_range(1, 1024),
               metavar="S"),
        Option("--repeats", "all-reduces per measurement, in one run (default 5; --quick: 2)",
               type=uint_range(1, 1000), metavar="K"),
        Option("--mtus", "MTUs of the testbed's links, one testbed each (default 1500,9000; --quick: 1500)",
               type=uint_list(1280, 9000), metavar="LIST"),
        Option("--dtypes", "the switch's element types", type=word_list(list(JOB_OF), sep=","),
               default=["f32", "bf16"], metavar="LIST"),
        Option("--transports", "worker transports for the float32 runs; the narrower dtypes run with the first",
               type=word_list(["auto", "mmsg", "udp-gso"], sep=","), default=["auto", "mmsg"], metavar="LIST"),
        Option("--worker-threads", "the switch runs once per worker thread count T (worker --threads T, switchd "
               "seq_lanes >= T); a T above the machine's CPUs is skipped", type=thread_counts, default=[1],
               metavar="LIST"),
        Option("--switch-threads", "switchd's dataplane threads and sockets per port (the testbed's veths get as "
               "many queues; flows spread over them by hash)", type=uint_range(1, 64), default=1, metavar="N"),
        Option("--no-gloo", "skip gloo (it needs torch in the project venv, or in $AGGSWITCH_BENCH_PYTHON)"),
        Option("--no-build", "use the binaries in target/release as they are: no cargo, no apt-get (a lent "
               "machine); OpenMPI only where mpicc is installed"),
        Option("--profile", "also record a system-wide profile (perf record -a -g) of one more float32 switch "
               "run (4x the all-reduces) at the largest MTU on unlimited links, not counted; "
               "profile-paths.txt: the workers' and switchd's samples by path (bench/harness/perf_paths.py)"),
        Option("--quick", "8 MiB, 2 repeats, MTU 1500 only; bench/results/bench-efficiency.* left alone"),
        Option("--timeout", "seconds any one measurement may take", type=uint_range(10, 86400), default=600,
               metavar="T"),
        Option("--json", "where to write the JSON (default bench/results/efficiency-STAMP.json)", type=str,
               metavar="FILE"),
        Option("--png", "where to write the PNG (default bench/results/efficiency-STAMP.png)", type=str,
               metavar="FILE"),
        Option("--no-docs", "leave bench/results/bench-efficiency.{json,png} alone"),
    ),
)
