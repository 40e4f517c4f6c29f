"""allreduce.py: the `allreduce` scenario: all-reduce through the switch
against OpenMPI's MPI_Allreduce and gloo, on the same veth testbed, in the
same run, on unlimited links and on links limited to 1 Gbit/s each way;
with it the packet rates (aggblast against XDP_DROP, AF_XDP echo and
aggregation), the switch's all-reduce by dataplane thread count, and (as
their own scenarios, run from here) per-packet, forward and efficiency
(root). One command from a fresh clone.

bench_report.py, bench_rates_report.py and bench_threads_report.py compute
every figure from the raw files each phase leaves in results/bench-STAMP/;
bench_plot.py draws the PNG.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from lifecycle import (publish, REPO_ROOT, RELEASE, RESULTS_DIR, HarnessError, Processes, Testbed, log, random_secret,
                       run_checked, start_switchd, stamp, tail, warn, write_switchd_config)
from machine import busy_machine, cpu_line, loadavg, nproc, proc_stat, snapshot, wait_idle
from options import uint_range
from scenario import Option, Scenario
from tools import NET_SH, build_release, ensure_packages, net

PREFIX = "bench"
WORKERS = 4
AGG_PORT = 48879
JOB_ID = 1
POOL_SLOTS = 256
RATE_BPS = 1000000000
TBF_ARGS = ["rate", "1gbit", "burst", "256kb", "latency", "50ms"]
IPERF_SECS = 2
IPERF_PORT = 5201
GLOO_PORT = 29518
PACKAGES = ["clang", "llvm", "libbpf-dev", "linux-libc-dev", "iproute2", "ethtool", "gcc", "openmpi-bin",
            "libopenmpi-dev", "python3", "python3-matplotlib", "jq", "iperf3"]
RATE_PREFIX = "rate"
RATE_RANKS = (2, 4, 8)
RATE_FLOWS = 8
DATA_FRAME_BYTES = 1512
# DATA frames in flight at most in the closed loop: half the switch's
# receive ring (4096 / 2): the generator does not react to ECE as a DCTCP
# worker would, so a larger window would lose frames to ring overflow.
RATE_INFLIGHT_FRAMES = 1024
HARNESS = REPO_ROOT / "bench" / "harness"

DESCRIPTION = """\
Packet rates (first, unless --no-rates), on a testbed of its own (prefix
"rate", 2 queues per veth or the most --threads): aggblast pinned to the last
CPU against switchd (thread 0 on CPU 0) in mode xdp-drop, echo (1512- and
64-byte frames) and aggregation (jobs of 2, 4, 8 ranks, closed loop) with
each --threads count; ratios aggregation / echo (goal >= 0.9), echo /
XDP_DROP, 2 threads / 1 thread.
The all-reduce (testbed prefix "bench", 4 workers), for unlimited then
1 Gbit/s links (tbf on every worker link both ways): iperf3 to show what the
links carry; OpenMPI (TCP BTL on eth0) without and with TSO; gloo (the
headline peer) with TSO; the switch, once with K iterations in one run and K
single runs. Then the switch's all-reduce with each dataplane thread count
(testbed remade with T queues per veth, --queue-per-worker). Writes
bench/results/bench-STAMP.json and, unless --quick or --no-docs,
bench/results/bench.{json,png} (bench-mtuM with --mtu M != 1500;
bench-rates.{json,png} with --rates-only). Raw results in
results/bench-STAMP/."""


def thread_list(text):
    try:
        ts = [uint_range(1, 64)(t) for t in text.split(",")]
    except argparse.ArgumentTypeError:
        ts = []
    if not ts or any(b <= a for a, b in zip(ts, ts[1:])):
        raise argparse.ArgumentTypeError(f"must be ascending counts 1..64 separated by commas, got '{text}'")
    if ts[0] != 1:
        raise argparse.ArgumentTypeError(f"must start with 1 (the baseline), got '{text}'")
    return ts


def settings(a):
    """The run's settings after --quick, --cores-only and the defaults:
    mib, repeats, rate_seconds, rate_repeats, docs, per_packet, forward,
    efficiency."""
    if a.rates_only and a.no_rates:
        raise HarnessError("--rates-only and --no-rates exclude each other")
    if a.rates_only and a.cores_only:
        raise HarnessError("--rates-only and --cores-only exclude each other")
    q = a.quick
    s = argparse.Namespace(
        mib=a.mib if a.mib is not None else (8 if q else 64),
        repeats=a.repeats if a.repeats is not None else (3 if q else 5),
        rate_seconds=a.rate_seconds if a.rate_seconds is not None else (2 if q else 5),
        rate_repeats=a.rate_repeats if a.rate_repeats is not None else (1 if q else 3),
        docs=not (q or a.no_docs or a.cores_only),
        per_packet=not (a.no_per_packet or a.cores_only or a.rates_only),
        forward=not (a.no_forward or a.cores_only or a.rates_only),
        efficiency=not (a.no_efficiency or a.cores_only),
        rates=not a.no_rates)
    s.elements = s.mib * 1024 * 1024 // 4
    return s


def rate_queues(threads):
    """Queues of the rate generator's veth: 2, or the most threads asked for."""
    return max(2, threads[-1])


class Run:
    """One allreduce run: its folder, private binaries and settings."""

    def __init__(self, a, s):
        self.a, self.s = a, s
        self.stamp = stamp()
        self.dir = REPO_ROOT / "results" / f"bench-{self.stamp}"
        self.bin = self.dir / "bin"
        self.bin.mkdir(parents=True)
        # Private copies: a rebuild meanwhile cannot change what is measured.
        for b in ("switchd", "worker", "switchctl", "aggblast"):
            shutil.copy2(RELEASE / b, self.bin)
        self.switchd, self.worker = self.bin / "switchd", self.bin / "worker"
        self.switchctl, self.aggblast = self.bin / "switchctl", self.bin / "aggblast"
        self.venv_py = str(REPO_ROOT / ".venv" / "bin" / "python")

    def report(self, script, *args, out=None):
        """A report in bench/harness; its stdout to the file out (or through)."""
        f = open(out, "w") if out else None
        try:
            r = subprocess.run([sys.executable, str(HARNESS / script), *map(str, args)], stdout=f)
        finally:
            if f:
                f.close()
        if r.returncode:
            raise HarnessError(f"{script} {args[0]} failed (status {r.returncode}); the raw results are in {self.dir}")

    # --- packet rates ----------------------------------------------------------------
    def rates(self):
        a, s = self.a, self.s
        rd = self.dir / "rates"
        rd.mkdir()
        queues = rate_queues(a.threads)
        gen_cpu = nproc() - 1 if nproc() >= 2 else None
        secret = random_secret()
        log(f"[rates] testbed '{RATE_PREFIX}' ({queues} queues), {s.rate_seconds} s x {s.rate_repeats} per "
            f"measurement; generator on CPU {gen_cpu if gen_cpu is not None else 'any'}, switchd thread 0 on CPU 0")
        with Testbed(RATE_PREFIX, ["--workers", 1, "--queues", queues], rd) as tb, Processes() as procs:
            load_start = loadavg()
            sock = rd / "switchd.sock"

            def stats():
                return run_checked([self.switchctl, "--socket", sock, "--json", "stats"], "switchctl stats").stdout

            def start(mode, threads):
                cfg = rd / f"switchd-{mode}-t{threads}.toml"
                jobs, sets = [], []
                for n in RATE_RANKS:
                    # One generator plays all n ranks of job n, from the subnet.
                    jobs.append(f"{n}:all:env:AGGSWITCH_TESTBED_SECRET")
                    sets += [f"job.{n}.n_workers={n}", f"job.{n}.pool_slots={POOL_SLOTS}"]
                write_switchd_config(self.switchd, tb, cfg, "scripts/bench allreduce (rate section)", secret=secret,
                                     jobs=jobs, sets=sets + [
                                         f"switch.agg_port={AGG_PORT}", f"switch.queues={queues}",
                                         f"switch.dataplane_threads={threads}", "switch.pin_threads=true",
                                         f"switch.mode={mode}", "switch.summary_interval_secs=1.0",
                                         f'switch.admin_socket="{sock}"'])
                return start_switchd(procs, f"{RATE_PREFIX}-sw", self.switchd, rd / f"switchd-{mode}-t{threads}.log",
                                     ["run", "--config", cfg])

            def mark(sw, tag, edge, k):
                (rd / f"{tag}-stats-{edge}{k}.json").write_text(stats())
                (rd / f"{tag}-switchd-{edge}{k}.stat").write_text(proc_stat(sw.pid) + "\n")

            def gen(out, *args):
                pin = ["taskset", "-c", str(gen_cpu)] if gen_cpu is not None else []
                p = procs.start(["ip", "netns", "exec", f"{RATE_PREFIX}-w0", *pin, self.aggblast, *args,
                                 "--spread-queues"], stdout=out, stderr=str(out).replace(".json", ".log"))
                if procs.wait([p], s.rate_seconds + 60) != [0]:
                    raise HarnessError(f"aggblast {' '.join(map(str, args))} failed; see "
                                       f"{str(out).replace('.json', '.log')}:\n{tail(str(out).replace('.json', '.log'), 5)}")

            def line_of(*args):
                r = subprocess.run([sys.executable, str(HARNESS / "bench_rates_report.py"), *map(str, args)],
                                   stdout=subprocess.PIPE, text=True)
                if r.returncode:
                    raise HarnessError(f"bench_rates_report.py {args[0]} failed on {rd} ({args[2]})")
                log(f"[rates] {r.stdout.strip()}")

            def rate_open(sw, tag, nbytes):
                for k in range(1, s.rate_repeats + 1):
                    mark(sw, tag, "before", k)
                    gen(rd / f"{tag}-gen{k}.json", "echo", "--switch", tb["switch_addr"], "--port", AGG_PORT,
                        "--frame-bytes", nbytes, "--flows", RATE_FLOWS, "--seconds", s.rate_seconds)
                    time.sleep(0.3)  # the last frames through, the counters published
                    mark(sw, tag, "after", k)
                line_of("open", rd, tag, "--repeats", s.rate_repeats)

            def rate_agg(sw, n, t):
                tag = f"agg-n{n}-t{t}"
                for k in range(1, s.rate_repeats + 1):
                    mark(sw, tag, "before", k)
                    gen(rd / f"{tag}-gen{k}.json", "aggregate", "--switch", tb["switch_addr"], "--port", AGG_PORT,
                        "--job", n, "--workers", n, "--secret", secret, "--seconds", s.rate_seconds,
                        "--verify-every", 256, "--window", RATE_INFLIGHT_FRAMES // n)
                    time.sleep(0.3)
                    mark(sw, tag, "after", k)
                line_of("agg", rd, n, t, "--repeats", s.rate_repeats)
                if json.loads((rd / f"{tag}.json").read_text()).get("verify_failed") != 0:
                    raise HarnessError(f"aggregation rate run {tag}: sampled RESULTs differ from N x value")

            sw = start("xdp-drop", 1)
            if "xdp_dropped" in json.loads(stats())["ports"][0]:
                rate_open(sw, "xdp_drop", DATA_FRAME_BYTES)
            else:
                warn("[rates] this switchd has no xdp-drop counter; XDP_DROP baseline skipped")
                (rd / "xdp_drop.json").write_text("null\n")
            procs.stop(sw)
            sw = start("echo", 1)
            rate_open(sw, "echo", DATA_FRAME_BYTES)
            rate_open(sw, "echo64", 64)
            procs.stop(sw)
            for t in a.threads:
                sw = start("aggregate", t)
                for n in RATE_RANKS:
                    rate_agg(sw, n, t)
                procs.stop(sw)
            self.report("bench_rates_report.py", "report", rd, "--threads", ",".join(map(str, a.threads)),
                        "--ranks", ",".join(map(str, RATE_RANKS)), "--seconds", s.rate_seconds, "--repeats",
                        s.rate_repeats, "--queues", queues, "--flows", RATE_FLOWS, "--inflight",
                        RATE_INFLIGHT_FRAMES, "--gen-cpu", gen_cpu if gen_cpu is not None else "none",
                        "--load-start", load_start, out=self.dir / "rates-table.md")

    # --- the all-reduce --------------------------------------------------------------
    def phase_snapshot(self, out, tag, edge):
        """Every shaper's counters and /proc/stat into out/snap-TAG-EDGE.jsonl;
        before a phase a fresh /proc/stat line follows the shaper reads, so
        that their CPU falls outside the phase."""
        f = out / f"snap-{tag}-{edge}.jsonl"
        snapshot(f, PREFIX, WORKERS)
        if edge == "before":
            with open(f, "a") as fh:
                fh.write(json.dumps({"t": time.time(), "stat": cpu_line()}) + "\n")

    def run_switch(self, procs, tb, cfg, out, label, secret):
        s = self.s
        log(f"[{label}] switch: {WORKERS} workers x {s.mib} MiB, {s.repeats} iterations in one run, then "
            f"{s.repeats} single runs")
        sw = start_switchd(procs, f"{PREFIX}-sw", self.switchd, out / "switchd.log",
                           ["run", "--config", cfg, "--stats-file", out / "switchd-stats.json"])
        self.phase_snapshot(out, "switch", "before")

        def workers(iters, tag):
            ranks = [procs.start([self.worker, "allreduce", "--switch", tb["switch_addr"], "--job", JOB_ID,
                                  "--rank", r, "--workers", WORKERS, "--elements", s.elements, "--iterations", iters,
                                  "--json"], ns=f"{PREFIX}-w{r}", env={"AGGSWITCH_SECRET": secret},
                                 stdout=out / f"{tag}-rank{r}.json", stderr=out / f"{tag}-rank{r}.log")
                     for r in range(WORKERS)]
            status = procs.wait(ranks, self.a.timeout)
            if any(x != 0 for x in status):
                detail = "\n".join(f"rank {r}: status {x}; {tail(out / f'{tag}-rank{r}.log', 3)}"
                                   for r, x in enumerate(status))
                raise HarnessError(f"switch all-reduce '{tag}' failed; see {out}\n{detail}")

        workers(s.repeats, "multi")
        for k in range(s.repeats):
            workers(1, f"single{k}")
        self.phase_snapshot(out, "switch", "after")
        procs.stop(sw)
        self.report("bench_report.py", "switch", out, "--repeats", s.repeats, "--elements", s.elements,
                    "--workers", WORKERS)

    def measure(self, procs, tb, cfg, link, mpi, secret):
        s, out = self.s, self.dir / link
        out.mkdir()
        shutil.copy("/proc/loadavg", out / "loadavg-start.txt")
        log(f"[{link}] iperf3 (TCP, {IPERF_SECS} s each): worker->switch, switch->worker, worker->worker")

        def iperf(name, sns, addr, cns, *extra):
            server = procs.start(["iperf3", "-s", "-1", "-p", IPERF_PORT], ns=sns,
                                 stdout=out / f"iperf-{name}-server.log")
            for _ in range(50):
                r = subprocess.run(["ip", "netns", "exec", sns, "ss", "-ltnH", f"sport = :{IPERF_PORT}"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                if r.stdout.strip():
                    break
                time.sleep(0.1)
            client = procs.start(["iperf3", "-c", addr, "-p", IPERF_PORT, "-t", IPERF_SECS, "-J", *extra], ns=cns,
                                 stdout=out / f"iperf-{name}.json")
            rc = procs.wait([client], IPERF_SECS + 60, stop_on_failure=False)[0]
            procs.wait([server], 10, stop_on_failure=False)
            if rc != 0:
                warn(f"iperf3 {name} failed (status {rc}), see {out}/iperf-{name}.json")

        iperf("up", f"{PREFIX}-sw", tb["switch_addr"], f"{PREFIX}-w0")
        iperf("down", f"{PREFIX}-sw", tb["switch_addr"], f"{PREFIX}-w0", "-R")
        iperf("w2w", f"{PREFIX}-w1", tb["worker_1_addr"], f"{PREFIX}-w0")

        def run_mpi(tag):
            self.phase_snapshot(out, tag, "before")
            log(f"[{link}] OpenMPI MPI_Allreduce ({tag}): {WORKERS} ranks x {s.mib} MiB, 1 warm-up + {s.repeats} timed")
            p = procs.start(["bash", NET_SH, "mpirun", PREFIX, WORKERS, *mpi, s.elements, s.repeats],
                            stdout=out / f"{tag}.json", stderr=out / f"{tag}.log", cwd=out)
            rc = procs.wait([p], self.a.timeout)[0]
            if rc != 0:
                raise HarnessError(f"mpirun failed (status {rc}); see {out}/{tag}.log\n{tail(out / f'{tag}.log', 20)}")
            self.phase_snapshot(out, tag, "after")
            self.report("bench_report.py", "peer", out, tag, "--output", out / f"{tag}.json")

        def run_gloo(tag):
            self.phase_snapshot(out, tag, "before")
            log(f"[{link}] gloo all-reduce ({tag}): {WORKERS} ranks x {s.mib} MiB, 1 warm-up + {s.repeats} timed")
            ranks = [procs.start(["env", f"RANK={r}", f"WORLD_SIZE={WORKERS}", f"MASTER_ADDR={tb['worker_0_addr']}",
                                  f"MASTER_PORT={GLOO_PORT}", "GLOO_SOCKET_IFNAME=eth0", "OMP_NUM_THREADS=1",
                                  self.venv_py, REPO_ROOT / "bench" / "gloo_allreduce.py", s.elements, s.repeats],
                                 ns=f"{PREFIX}-w{r}", stdout=out / f"{tag}-rank{r}.out",
                                 stderr=out / f"{tag}-rank{r}.log") for r in range(WORKERS)]
            status = procs.wait(ranks, self.a.timeout)
            if any(x != 0 for x in status):
                detail = "\n".join(f"rank {r}: status {x}; {tail(out / f'{tag}-rank{r}.log', 3)}"
                                   for r, x in enumerate(status))
                raise HarnessError(f"gloo all-reduce '{tag}' failed; see {out}\n{detail}")
            self.phase_snapshot(out, tag, "after")
            self.report("bench_report.py", "peer", out, tag, "--output", out / f"{tag}-rank0.out")

        run_mpi("mpi")
        net("worker-tx", PREFIX, WORKERS, "on")
        run_mpi("mpi_tso")
        # gloo at its best: TCP with segmentation offload, as on a real NIC.
        if not self.a.no_gloo:
            run_gloo("gloo")
        net("worker-tx", PREFIX, WORKERS, "off")
        self.run_switch(procs, tb, cfg, out, link, secret)
        shutil.copy("/proc/loadavg", out / "loadavg-end.txt")

    def threads(self, secret):
        """The switch's all-reduce with each dataplane thread count, on a
        testbed of T queues per veth; `ethtool -S` of every switch port
        afterwards has the frames each queue (thread) received."""
        td = self.dir / "threads"
        td.mkdir()
        for t in self.a.threads:
            with Testbed(PREFIX, ["--workers", WORKERS, "--mtu", self.a.mtu, "--queues", t, "--queue-per-worker"],
                         td) as tb, Processes() as procs:
                shutil.copy(tb.env_file, td / f"testbed-t{t}.env")
                cfg = td / f"switchd-t{t}.toml"
                write_switchd_config(self.switchd, tb, cfg, f"scripts/bench allreduce, {t} thread(s)", WORKERS,
                                     secret, [f"switch.queues={t}", f"switch.dataplane_threads={t}"])
                out = td / f"t{t}"
                out.mkdir()
                self.run_switch(procs, tb, cfg, out, f"unlimited, {t} thread(s)", secret)
                for i in range(WORKERS):
                    with open(out / f"ethtool-sw-w{i}.txt", "w") as f:
                        if subprocess.run(["ip", "netns", "exec", f"{PREFIX}-sw", "ethtool", "-S", f"sw-w{i}"],
                                          stdout=f).returncode:
                            warn(f"ethtool -S sw-w{i} failed; frames per queue unknown")
        self.report("bench_threads_report.py", td, ",".join(map(str, self.a.threads)), td / "threads.json",
                    out=self.dir / "threads-table.md")

    def publish(self, json_path, png, name):
        """Draw png from json_path (bench_plot.py) and, with docs, copy both
        to bench/results/NAME.{json,png}."""
        if subprocess.run([sys.executable, str(HARNESS / "bench_plot.py"), str(json_path), str(png)]).returncode:
            warn("plot failed (bench/harness/bench_plot.py)")
        publish(json_path, png, name, self.s.docs)


def run(a):
    s = settings(a)
    if a.cores_only:
        missing = [c for c in ("jq", "python3", "tc", "ip", "ethtool", "taskset") if shutil.which(c) is None]
        if missing:
            ensure_packages(True, ["iproute2", "ethtool", "python3", "jq", "util-linux"])
    else:
        ensure_packages(True, PACKAGES)
    if a.no_build:
        for b in ("switchd", "worker", "switchctl", "aggblast"):
            if not (RELEASE / b).exists():
                raise HarnessError(f"--no-build: target/release/{b} missing (build it with cargo build --release "
                                   "--workspace --bins)")
    else:
        build_release()
    venv_py = str(REPO_ROOT / ".venv" / "bin" / "python")
    if not (a.no_gloo or a.cores_only or a.rates_only) and \
            subprocess.run([venv_py, "-c", "import torch"], stderr=subprocess.DEVNULL).returncode:
        log("gloo needs torch in the project venv: running scripts/setup.sh")
        if subprocess.run(["bash", str(REPO_ROOT / "scripts" / "setup.sh")]).returncode:
            raise HarnessError("scripts/setup.sh failed; fix what it says, or pass --no-gloo")
    run_ = Run(a, s)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out_json = RESULTS_DIR / f"bench-{run_.stamp}.json"
    mpi_tmp = None
    try:
        if s.per_packet:
            r = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "bench"), "per-packet", "--secs",
                                "1" if a.quick else "3", "--json", str(run_.dir / "per-packet.json")],
                               stdout=subprocess.PIPE, text=True)
            (run_.dir / "per-packet-table.md").write_text(r.stdout)
            sys.stdout.write(r.stdout)
            if r.returncode:
                raise HarnessError("scripts/bench per-packet failed (see above)")
        if s.rates:
            run_.rates()
            print(f"\n=== bench {run_.stamp}: packet rates ===\n{(run_.dir / 'rates-table.md').read_text()}")
        if s.forward:
            fwd = ["--json", str(run_.dir / "forward.json")] + (["--secs", "2", "--rounds", "1"] if a.quick else [])
            log(f"forwarding comparison (scripts/bench forward {' '.join(fwd)})")
            r = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "bench"), "forward", *fwd],
                               stdout=subprocess.PIPE, text=True, env={**os.environ,
                                                                       "AGG_SWITCHD": str(RELEASE / "switchd")})
            (run_.dir / "forward-table.txt").write_text(r.stdout)
            sys.stdout.write(r.stdout)
            if r.returncode:
                raise HarnessError("scripts/bench forward failed (see above)")
        if a.rates_only:
            run_.report("bench_report.py", "rates-only", "--json", out_json, "--stamp", run_.stamp, "--repo", REPO_ROOT,
                        "--rates", run_.dir / "rates" / "rates.json")
            run_.publish(out_json, out_json.with_suffix(".png"), "bench-rates")
            return 0
        mpi_bin = run_.dir / "mpi_allreduce"
        if not a.cores_only:
            run_checked(["mpicc", "-O2", "-o", mpi_bin, REPO_ROOT / "bench" / "mpi_allreduce.c"],
                        "mpicc on bench/mpi_allreduce.c")
        secret = random_secret()
        if a.wait_idle > 0:
            wait_idle(a.wait_idle, log)
        log(f"run {run_.stamp}: {WORKERS} workers, {s.mib} MiB ({s.elements} float32), {s.repeats} repeats; "
            f"logs in {run_.dir}")
        load_start = loadavg()
        if busy_machine():
            warn(f"1-min load average is {load_start} on {nproc()} cores before starting: other work shares the "
                 "CPUs, expect noisy times")
        if not a.cores_only:
            with Testbed(PREFIX, ["--workers", WORKERS, "--mtu", a.mtu], run_.dir) as tb, Processes() as procs:
                cfg = run_.dir / "switchd.toml"
                write_switchd_config(run_.switchd, tb, cfg, "scripts/bench allreduce", WORKERS, secret)
                mpi_tmp = tempfile.mkdtemp(prefix="bench-mpi.")
                hostfile, rsh = run_.dir / "hostfile", run_.dir / "netns-ssh.sh"
                net("mpi-hosts", tb.env_file, WORKERS, hostfile, rsh, mpi_tmp)
                mpi = [hostfile, rsh, mpi_tmp, mpi_bin]
                run_.measure(procs, tb, cfg, "unlimited", mpi, secret)
                net("shape-workers", PREFIX, WORKERS, *TBF_ARGS)
                run_.measure(procs, tb, cfg, "1gbit", mpi, secret)
        run_.threads(secret)
        if a.cores_only:
            out_json = RESULTS_DIR / f"bench-cores-{run_.stamp}.json"
            run_.report("bench_report.py", "cores-only", "--json", out_json, "--stamp", run_.stamp, "--repo",
                        REPO_ROOT, "--rates", run_.dir / "rates" / "rates.json", "--threads-json",
                        run_.dir / "threads" / "threads.json", "--mib", s.mib, "--repeats", s.repeats, "--workers",
                        WORKERS, "--mtu", a.mtu, "--load-start", load_start)
            print(f"\n=== bench {run_.stamp} (cores only): {WORKERS} workers, {s.mib} MiB float32, {nproc()} cores ===")
            print("switch all-reduce, unlimited links, by dataplane threads:")
            print((run_.dir / "threads-table.md").read_text())
            print("packet rates:")
            print((run_.dir / "rates-table.md").read_text())
            log(f"wrote {out_json} (logs in {run_.dir})")
            return 0
        if s.efficiency:
            eff = ["--mib", str(s.mib), "--repeats", str(s.repeats), "--json", str(run_.dir / "efficiency.json"),
                   "--png", str(run_.dir / "efficiency.png")] + (["--quick"] if a.quick else []) + \
                ([] if s.docs else ["--no-docs"])
            log(f"per-byte efficiency (scripts/bench efficiency {' '.join(eff)})")
            with open(run_.dir / "efficiency.log", "w") as f:
                rc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "bench"), "efficiency", *eff],
                                    stdout=f, stderr=subprocess.STDOUT).returncode
            if rc:
                raise HarnessError(f"scripts/bench efficiency failed; see {run_.dir}/efficiency.log\n"
                                   f"{tail(run_.dir / 'efficiency.log', 30)}")
            text = (run_.dir / "efficiency.log").read_text()
            i = text.find("| MTU")
            (run_.dir / "efficiency-table.md").write_text(text[i:] if i >= 0 else "")
    except BaseException:
        log(f"failed; logs in {run_.dir}")
        raise
    finally:
        if mpi_tmp:
            shutil.rmtree(mpi_tmp, ignore_errors=True)
        shutil.rmtree(run_.bin, ignore_errors=True)
    version = subprocess.run(["mpirun", "--version"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True).stdout.splitlines()
    table = run_.dir / "table.md"
    run_.report("bench_report.py", "report", run_.dir, "--json", out_json, "--table", table, "--stamp", run_.stamp,
                "--repo", REPO_ROOT, "--mib", s.mib, "--repeats", s.repeats, "--workers", WORKERS, "--mtu", a.mtu,
                "--rate-bps", RATE_BPS, "--load-start", load_start, "--openmpi-version", version[0] if version else "",
                *(["--quick"] if a.quick else []), *(["--rates"] if s.rates else []))
    print(f"\n=== bench {run_.stamp}: {WORKERS} workers, {s.mib} MiB float32 all-reduce, {s.repeats} repeats, "
          f"MTU {a.mtu} ===\n{table.read_text()}")
    print("switch all-reduce, unlimited links, by dataplane threads (under \"threads\" in the JSON):")
    print((run_.dir / "threads-table.md").read_text())
    if s.rates:
        print("packet rates (see above; also under \"rates\" in the JSON):")
        print((run_.dir / "rates-table.md").read_text())
    eff_table = run_.dir / "efficiency-table.md"
    if eff_table.exists() and eff_table.stat().st_size:
        print("per-byte efficiency (scripts/bench efficiency; under \"efficiency\" in the JSON, every run in "
              "bench/results/bench-efficiency.json):")
        print(eff_table.read_text())
    pp = run_.dir / "per-packet-table.md"
    if pp.exists() and pp.stat().st_size:
        print("per-packet cost, in memory (criterion medians; also under \"per_packet\" in the JSON; goal "
              "engine / copy <= 1.5):")
        print(pp.read_text())
    run_.publish(out_json, out_json.with_suffix(".png"), "bench" if a.mtu == 1500 else f"bench-mtu{a.mtu}")
    return 0


SCENARIO = Scenario(
    name="allreduce",
    summary="all-reduce through the switch against OpenMPI and gloo, packet rates, threads (root)",
    description=DESCRIPTION,
    run=run,
    needs_root=True,
    options=(
        Option("--mib", "tensor size per worker in MiB of float32 (default 64; --quick: 8)", type=uint_range(1, 1024),
               metavar="S"),
        Option("--repeats", "timed all-reduces per measurement (default 5; --quick: 3)", type=uint_range(1, 1000),
               metavar="K"),
        Option("--mtu", "MTU of every testbed link for the all-reduce part", type=uint_range(576, 9000),
               default=1500, metavar="M"),
        Option("--quick", "a fast check: 8 MiB, 3 repeats (unless given), bench/results/bench.* left alone"),
        Option("--timeout", "seconds any one measurement may take", type=uint_range(10, 86400), default=900,
               metavar="T"),
        Option("--wait-idle", "wait up to W s for the 1-min load average to fall below half the cores",
               type=uint_range(0, 86400), default=0, metavar="W"),
        Option("--no-docs", "leave bench/results/bench.{json,png} alone"),
        Option("--rates-only", "only the packet-rate section, then stop"),
        Option("--no-rates", "skip the packet-rate section"),
        Option("--rate-seconds", "seconds per rate measurement (default 5; --quick: 2)", type=uint_range(1, 600),
               metavar="D"),
        Option("--rate-repeats", "runs per rate measurement, median reported (default 3; --quick: 1)",
               type=uint_range(1, 100), metavar="R"),
        Option("--threads", "dataplane thread counts, ascending, starting with 1", type=thread_list, default=[1, 2],
               metavar="LIST"),
        Option("--cores-only", "only the packet rates and the switch's all-reduce by thread count"),
        Option("--no-build", "use target/release as it is"),
        Option("--no-forward", "skip the forwarding comparison (scripts/bench forward)"),
        Option("--no-per-packet", "skip the in-memory per-packet cost (scripts/bench per-packet)"),
        Option("--no-efficiency", "skip the per-byte efficiency section (scripts/bench efficiency)"),
        Option("--no-gloo", "skip gloo (it needs torch in the project venv)"),
    ),
)
