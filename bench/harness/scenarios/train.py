"""train.py: the `train` scenario: DDP training step time through the
switch against DDP's default gloo all-reduce on one veth testbed, on each
--links setting; optionally also aggswitch.torch's host path, the switch
without the fallback's agreement, and the switch killed mid-run (the time
from the kill to the host path) (root, torch).

The ranks are examples/train_ddp.py, one per worker namespace (prefix
"btr"); bench_train_report.py makes the JSON, table and plot. The full
description of the configurations and checks is `scripts/bench train
--help`.

Worker threads: with --worker-threads T1,T2,... the switch and
switch-nofallback configurations run once per T (AGGSWITCH_THREADS=T in the
ranks, a switchd whose seq_lanes is at least T; switch-killed at the first
T only); a T above the machine's CPUs is skipped with a line saying so.
Folders of T = 1 keep their names (LINK-COMM), others are LINK-COMM-tT.
"""

import argparse
import json
import os
import re
import shutil
import time

from benchkit import proc_jiffies
from lifecycle import (lanes_for, seq_lane_sets, publish, run_checked_report, RESULTS_DIR, HarnessError, Processes, Testbed, log, random_secret,
                       start_switchd, warn, write_switchd_config)
from machine import busy_machine, loadavg, nproc, proc_stat, worker_threads_to_run, snapshot, wait_idle
from options import choice, thread_counts, uint_range, word_list
from scenario import Option, Scenario
from tools import net
from torch_bench import bench_python, prepare, start_rank, wait_ranks

PREFIX = "btr"
WORKERS = 4
LAYERS = 2
SEED = 0
MASTER_PORT_BASE = 29500
AGG_PORT = 48879
JOB_ID = 1
# switch-killed: aggswitch.torch's warning once a rank's first collective is
# done on the host path, and how often rank 0's log is read for it.
FALLBACK_LINE = "run on the hosts over the process group"
POLL_S = 0.05
COMMS = ["gloo", "switch", "switch-nofallback", "hosts", "switch-killed"]
# The configurations run once per worker thread count (switch-killed: the first).
THREADED = ("switch", "switch-nofallback")

DESCRIPTION = """\
Configurations (--comms, run on each --links setting, results in
results/bench-train-STAMP/LINK-COMM/):
  gloo               DDP's default all-reduce over gloo
  switch             aggswitch.torch's DDP hook, every bucket summed in
                     switchd, fallback on (the ranks agree after each
                     collective)
  switch-nofallback  the same with AGGSWITCH_FALLBACK=off (goal: switch /
                     switch-nofallback <= 1.02)
  hosts              AGGSWITCH_MODE=hosts: every bucket on the host path over
                     gloo, no switchd (goal at 1 Gbit/s: hosts / gloo <= 1.05)
  switch-killed      switch with switchd killed (SIGKILL) once rank 0 printed
                     step K (a third of the steps, a multiple of 10, >= 10);
                     kill to host path is the time until rank 0 logs the
                     fallback (goal <= stall timeout + 1 s)
A rate setting (NNmbit, NNgbit) shapes every worker link both ways with tbf
(burst 256 kB per Gbit/s, at least 256 kB; latency 50 ms). Statistic: the
slowest rank's median step time over the timed steps; samples/s = 4 x batch
/ step time; the goal at 1 Gbit/s is switch / gloo <= 0.75. Sanity checks
(loss within 2 %, identical weights, path counters) make it exit non-zero
and leave bench/results/bench-train.* alone. Writes
bench/results/bench-train-STAMP.{json,png} and (unless --no-docs)
bench/results/bench-train.{json,png}. Needs the project venv with torch,
scikit-learn and aggswitch (or AGGSWITCH_BENCH_PYTHON)."""


def link(text):
    if not re.fullmatch(r"unlimited|[1-9][0-9]{0,5}(mbit|gbit)", text):
        raise argparse.ArgumentTypeError(f"'{text}' is neither unlimited nor a rate like 1gbit or 500mbit")
    return text


def link_list(text):
    links = [link(x) for x in text.split(",") if x]
    if not links:
        raise argparse.ArgumentTypeError("needs at least one setting, e.g. unlimited,1gbit")
    return links


def comm_list(text):
    comms = [c for c in text.split(",") if c]
    if len(set(comms)) != len(comms):
        raise argparse.ArgumentTypeError(f"a configuration is listed twice in '{text}'")
    return word_list(COMMS, sep=",")(text)


def stall_timeout(text):
    if not re.fullmatch(r"[0-9]{1,3}(\.[0-9]{1,3})?", text) or not 0.1 <= float(text) <= 600:
        raise argparse.ArgumentTypeError(f"must be 0.1..600 s (up to 3 decimals), got '{text}'")
    return float(text)


def tbf_args(rate):
    """The tbf arguments of a rate setting (burst 256 kB per Gbit/s, about
    2 ms of the rate, at least 256 kB)."""
    n, unit = int(rate[:-4]), rate[-4:]
    kb = 256 * n if unit == "gbit" else 256
    return ["rate", rate, "burst", f"{kb}kb", "latency", "50ms"]


def kill_step(warmup, steps):
    """switch-killed: the step after which switchd is killed: about a third
    of the steps rounded to the multiple of 10 train_ddp.py prints, >= 10."""
    return max((warmup + steps + 15) // 30 * 10, 10)


def stall_json(value):
    """--stall-timeout as the report reads it (2, 0.5)."""
    return int(value) if value == int(value) else value


def config_dir(lnk, comm, threads):
    """A configuration's folder name: LINK-COMM, with -tT for T > 1."""
    return f"{lnk}-{comm}" + ("" if threads in (None, 1) else f"-t{threads}")


def thread_counts_of(comm, threads):
    """The worker thread counts COMM runs with: every one for THREADED, the
    first for switch-killed, none (None) for gloo and hosts."""
    if comm in THREADED:
        return list(threads)
    return threads[:1] if comm == "switch-killed" else [None]


def switchd_cpu(path, pid):
    try:
        path.write_text(f"{proc_jiffies(proc_stat(pid)) / os.sysconf('SC_CLK_TCK'):g}\n")
    except OSError:
        pass


def kill_mid_run(out, sw, ranks, k_step, stall):
    """Wait until rank 0's log shows step k_step or later, SIGKILL switchd,
    then read rank 0's log every POLL_S s until it holds FALLBACK_LINE;
    writes out/killed.json (null for what did not happen). Returns whether
    it killed switchd."""
    log0 = out / "rank0.log"
    step = None
    kill_s = seen_s = None

    def text():
        try:
            return log0.read_text(errors="replace")
        except OSError:
            return ""

    def all_running():
        return all(p.poll() is None for p in ranks)

    while step is None:
        for line in text().splitlines():
            f = line.split()
            if len(f) >= 2 and f[0] == "step" and f[1].isdigit() and int(f[1]) >= k_step:
                step = int(f[1])
                break
        if step is None:
            if not all_running():
                break
            time.sleep(POLL_S)
    if step is not None:
        switchd_cpu(out / "switchd-cpu-seconds", sw.pid)
        sw.kill()
        kill_s = time.time()
        sw.wait()
        while True:
            alive = all_running()
            if FALLBACK_LINE in text():
                seen_s = time.time()
                break
            if not alive:
                break
            time.sleep(POLL_S)
    (out / "killed.json").write_text(json.dumps({
        "kill_s": kill_s, "fallback_seen_s": seen_s, "stall_timeout_s": stall_json(stall),
        "kill_after_step": k_step, "step_seen": step, "poll_interval_s": POLL_S,
        "fallback_line": FALLBACK_LINE}) + "\n")
    if seen_s is not None:
        log(f"switchd killed (SIGKILL) after rank 0's step {step}; rank 0 on the host path "
            f"{seen_s - kill_s:.2f} s later (stall timeout {stall:g} s)")
    elif kill_s is not None:
        warn(f"switchd killed after rank 0's step {step}, but the ranks ended without rank 0 logging "
             f"'{FALLBACK_LINE}'")
    else:
        warn(f"the ranks ended before rank 0 printed step {k_step}: switchd not killed")
    return kill_s is not None


def run(a):
    k_step = kill_step(a.warmup, a.steps)
    if "switch-killed" in a.comms and a.warmup + a.steps < k_step + 3:
        raise HarnessError(f"--comms switch-killed needs at least {k_step + 3} warm-up + timed steps (switchd is "
                           f"killed after step {k_step}), got {a.warmup + a.steps}")
    cpus = nproc()
    threads = worker_threads_to_run(a.worker_threads, log, HarnessError)
    t0 = time.monotonic()
    st, rd, switchd = prepare("bench-train", build=not a.no_build)
    py = bench_python()
    secret = random_secret()
    links, comms = ",".join(a.links), ",".join(a.comms)
    measure_t0 = time.monotonic()
    log(f"run {st}: 4 ranks, MLP 64-{a.hidden}-{a.hidden}-10, batch {a.batch} per rank, {a.warmup} warm-up + "
        f"{a.steps} timed steps per configuration ({comms} on {links}); logs in {rd}")
    queue_args = [] if a.switch_threads == 1 else ["--queues", a.switch_threads, "--queue-per-worker"]
    tbf_report = []
    try:
        with Testbed(PREFIX, ["--workers", WORKERS, "--mtu", a.mtu, *queue_args], rd) as tb, Processes() as procs:
            def config(lanes):
                """switchd's config with seq_lanes = lanes (1: as it always was)."""
                cfg = rd / ("switchd.toml" if lanes == 1 else f"switchd-lanes{lanes}.toml")
                if not cfg.exists():
                    write_switchd_config(switchd, tb, cfg, "scripts/bench train", WORKERS, secret,
                                         [f"job.1.dtype={a.dtype}", f"switch.queues={a.switch_threads}",
                                          f"switch.dataplane_threads={a.switch_threads}"]
                                         + seq_lane_sets(lanes))
                return cfg
            configs = 0

            def run_config(lnk, comm, th):
                nonlocal configs
                out = rd / config_dir(lnk, comm, th)
                out.mkdir()
                port = MASTER_PORT_BASE + configs
                configs += 1
                # train_ddp.py --comm switch builds its state with
                # state_from_env(), which reads AGGSWITCH_MODE and _FALLBACK.
                extra = {"gloo": {}, "switch": {"AGGSWITCH_MODE": "switch", "AGGSWITCH_FALLBACK": "on"},
                         "switch-killed": {"AGGSWITCH_MODE": "switch", "AGGSWITCH_FALLBACK": "on",
                                           "AGGSWITCH_STALL_TIMEOUT": f"{a.stall_timeout:g}"},
                         "switch-nofallback": {"AGGSWITCH_MODE": "switch", "AGGSWITCH_FALLBACK": "off"},
                         "hosts": {"AGGSWITCH_MODE": "hosts"}}[comm]
                on_switch = comm.startswith("switch")
                sw = None
                if on_switch:
                    sw = start_switchd(procs, f"{PREFIX}-sw", switchd, out / "switchd.log",
                                       ["run", "--config", config(lanes_for(th))])
                log(f"[{lnk}] {comm}: {a.warmup + a.steps} steps on 4 ranks"
                    + ("" if th is None else f", {th} worker thread(s)"))
                snapshot(out / "before.jsonl", PREFIX, WORKERS)
                env = {k: v for k, v in os.environ.items()
                       if k not in ("AGGSWITCH_MODE", "AGGSWITCH_FALLBACK", "AGGSWITCH_SWITCH", "AGGSWITCH_JOB",
                                    "AGGSWITCH_SECRET", "AGGSWITCH_SECRET_FILE", "AGGSWITCH_STALL_TIMEOUT",
                                    "AGGSWITCH_THREADS")}
                env.update({"WORLD_SIZE": str(WORKERS), "MASTER_ADDR": tb["worker_0_addr"],
                            "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"})
                if on_switch:
                    env.update({"AGGSWITCH_SWITCH": f"{tb['switch_addr']}:{AGG_PORT}", "AGGSWITCH_JOB": str(JOB_ID),
                                "AGGSWITCH_SECRET": secret, "AGGSWITCH_TRANSPORT": a.transport,
                                "AGGSWITCH_THREADS": str(th)})
                env.update(extra)
                ranks = []
                for r in range(WORKERS):
                    p = start_rank(procs, f"{PREFIX}-w{r}", out, r, a.timeout,
                                   [py, "examples/train_ddp.py", "--comm", "gloo" if comm == "gloo" else "switch",
                                    "--steps", a.warmup + a.steps, "--batch", a.batch, "--hidden", a.hidden,
                                    "--layers", LAYERS, "--seed", SEED, "--dtype", a.dtype, "--device", a.device,
                                    "--out", out / f"rank{r}.json"], {"RANK": str(r), "LOCAL_RANK": str(r)},
                                   base_env=env)
                    ranks.append(p)
                if comm == "switch-killed" and kill_mid_run(out, sw, ranks, k_step, a.stall_timeout):
                    procs.stop(sw)  # reaped already; forgets it
                    sw = None
                wait_ranks(procs, ranks, out, a.timeout, f"[{lnk}] {comm}: training")
                snapshot(out / "after.jsonl", PREFIX, WORKERS)
                if sw is not None:
                    switchd_cpu(out / "switchd-cpu-seconds", sw.pid)
                    procs.stop(sw)
                last = (out / "rank0.log").read_text(errors="replace").strip().splitlines()
                log(f"[{lnk}] {comm}{'' if th is None else f', T={th}'}: {last[-1] if last else ''}")

            if a.wait_idle > 0:
                wait_idle(a.wait_idle, log)
            if busy_machine():
                warn(f"1-min load average is {loadavg()} on {nproc()} cores before starting: other work shares "
                     "the CPUs, expect noisy times")
            for lnk in a.links:
                if lnk == "unlimited":
                    net("unshape-workers", PREFIX, WORKERS)
                else:
                    tbf = tbf_args(lnk)
                    net("shape-workers", PREFIX, WORKERS, *tbf)
                    tbf_report += ["--tbf", f"{lnk}={' '.join(tbf)}"]
                for comm in a.comms:
                    for th in thread_counts_of(comm, threads):
                        run_config(lnk, comm, th)
    except BaseException:
        log(f"failed; logs in {rd}")
        raise
    finally:
        shutil.rmtree(rd / "bin", ignore_errors=True)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out_json, out_png = RESULTS_DIR / f"bench-train-{st}.json", RESULTS_DIR / f"bench-train-{st}.png"
    now = time.monotonic()
    run_checked_report(
        "bench_train_report.py",
        [rd, "--json", out_json, "--table", rd / "table.md", "--png", out_png, "--stamp", st, "--warmup", a.warmup,
         "--steps", a.steps, "--batch", a.batch, "--hidden", a.hidden, "--layers", LAYERS, "--seed", SEED,
         "--mtu", a.mtu, "--dtype", a.dtype, "--transport", a.transport, "--device", a.device, "--links", links,
         "--comms", comms, "--switch-threads", a.switch_threads,
         "--worker-threads", ",".join(map(str, a.worker_threads)), "--cpus", cpus, "--stall-timeout", f"{a.stall_timeout:g}",
         *tbf_report, "--bench-seconds", int(now - t0), "--measure-seconds", int(now - measure_t0)],
        out_json, rd / "table.md",
        f"=== bench train {st}: DDP step time, 4 ranks on {a.device}, batch {a.batch} per rank, hidden "
        f"{a.hidden}, {a.steps} timed steps ===", "bench-train")
    publish(out_json, out_png, "bench-train", not a.no_docs)
    log(f"bench took {int(time.monotonic() - t0)} s")
    return 0


SCENARIO = Scenario(
    name="train",
    summary="DDP training step time through the switch against gloo (root, torch)",
    description=DESCRIPTION,
    run=run,
    needs_root=True,
    options=(
        Option("--steps", "timed steps per configuration", type=uint_range(1, 10000), default=30, metavar="N"),
        Option("--warmup", "steps run first and left out of the statistics", type=uint_range(0, 1000), default=3,
               metavar="N"),
        Option("--batch", "samples per rank and step", type=uint_range(1, 1797), default=32, metavar="B"),
        Option("--hidden", "width of the 2 hidden layers", type=uint_range(1, 20000), default=5000, metavar="H"),
        Option("--mtu", "MTU of every testbed link", type=uint_range(576, 9000), default=1500, metavar="M"),
        Option("--dtype", "gradients on the wire: f32, bf16 or f16", type=choice("f32", "bf16", "f16"),
               default="f32", metavar="D"),
        Option("--transport", "the worker's UDP data path for the switch runs: auto, mmsg or udp-gso",
               type=choice("auto", "mmsg", "udp-gso"), default="auto", metavar="T"),
        Option("--device", "cpu or cuda: where the ranks compute", type=choice("cpu", "cuda"), default="cpu",
               metavar="D"),
        Option("--links", "comma-separated link settings: unlimited or a rate NNmbit / NNgbit", type=link_list,
               default=["unlimited", "1gbit"], metavar="L"),
        Option("--comms", f"comma-separated configurations, in order ({', '.join(COMMS)})", type=comm_list,
               default=["gloo", "switch"], metavar="C"),
        Option("--switch-threads", "switchd's dataplane threads and queues per veth", type=uint_range(1, 64),
               default=1, metavar="T"),
        Option("--worker-threads", "switch and switch-nofallback run once per worker thread count T "
               "(AGGSWITCH_THREADS=T, switchd seq_lanes >= T); a T above the machine's CPUs is skipped",
               type=thread_counts, default=[1], metavar="LIST"),
        Option("--stall-timeout", "switch-killed: the ranks' AGGSWITCH_STALL_TIMEOUT in seconds",
               type=stall_timeout, default=2.0, metavar="S"),
        Option("--timeout", "seconds one configuration (4 ranks) may take", type=uint_range(10, 86400),
               default=600, metavar="T"),
        Option("--wait-idle", "wait up to W s for the load average to fall below half the cores",
               type=uint_range(0, 86400), default=0, metavar="W"),
        Option("--no-build", "use the binaries in target/release as they are: no cargo, no apt-get"),
        Option("--no-docs", "leave bench/results/bench-train.{json,png} alone"),
    ),
)
