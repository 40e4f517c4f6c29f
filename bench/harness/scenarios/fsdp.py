"""fsdp.py: the `fsdp` scenario: reduce-scatter and all-gather through the
switch against gloo's, and FSDP2 training step time with the switch's
collectives against FSDP2 on gloo, on one veth testbed, on unlimited links
and on links limited to 1 Gbit/s each way (issue 22) (root).

Each configuration runs bench/fsdp_bench.py as 4 ranks, one per worker
namespace (prefix "bfs"); switchd runs during the switch configurations
only; bench_fsdp_report.py takes the medians, ratios and checks.
"""

import os
import shutil
import time

from benchkit import proc_jiffies

from lifecycle import (publish, run_checked_report, RESULTS_DIR, Processes, Testbed, log, random_secret,
                       start_switchd, warn, write_switchd_config)
from machine import busy_machine, loadavg, nproc, proc_stat, snapshot
from options import uint_range
from scenario import Option, Scenario
from tools import net
from torch_bench import bench_python, prepare, start_rank, wait_ranks

PREFIX = "bfs"
WORKERS = 4
SEED = 0
MASTER_PORT_BASE = 29500
AGG_PORT = 48879
JOB_ID = 1
TBF_ARGS = ["rate", "1gbit", "burst", "256kb", "latency", "50ms"]

DESCRIPTION = """\
Configurations: link unlimited | 1gbit  x  mode collectives | fsdp  x  comm
gloo | switch. 1 Gbit/s shapes every worker link both ways. The report
takes the medians of the slowest rank, the ratios switch / gloo (goals at
1 Gbit/s: reduce-scatter <= 0.5, FSDP2 step <= 0.8), checks every FSDP2
run's ranks ended with the same parameters, and writes
bench/results/bench-fsdp-STAMP.{json,png} and (unless --no-docs)
bench/results/bench-fsdp.{json,png} (bench-fsdp-mtuM with --mtu M != 1500)."""


def run(a):
    t0 = time.monotonic()
    st, rd, switchd = prepare("bench-fsdp")
    py = bench_python()
    secret = random_secret()
    log(f"run {st}: 4 ranks; collectives of {a.mib} MiB x {a.repeats}; FSDP2 MLP 64-{a.hidden}-{a.hidden}-10, "
        f"{a.warmup} warm-up + {a.steps} timed steps; logs in {rd}")
    try:
        with Testbed(PREFIX, ["--workers", WORKERS, "--mtu", a.mtu], rd) as tb, Processes() as procs:
            cfg = rd / "switchd.toml"
            write_switchd_config(switchd, tb, cfg, "scripts/bench fsdp", WORKERS, secret)
            configs = 0

            def run_config(link, mode, comm):
                nonlocal configs
                out = rd / f"{link}-{mode}-{comm}"
                out.mkdir()
                port = MASTER_PORT_BASE + configs
                configs += 1
                sw = None
                if comm == "switch":
                    sw = start_switchd(procs, f"{PREFIX}-sw", switchd, out / "switchd.log", ["run", "--config", cfg])
                log(f"[{link}] {mode}, {comm}: 4 ranks")
                snapshot(out / "before.jsonl", PREFIX, WORKERS)
                env = {"WORLD_SIZE": str(WORKERS), "MASTER_ADDR": tb["worker_0_addr"], "MASTER_PORT": str(port),
                       "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
                       "AGGSWITCH_SWITCH": f"{tb['switch_addr']}:{AGG_PORT}", "AGGSWITCH_JOB": str(JOB_ID),
                       "AGGSWITCH_SECRET": secret}
                ranks = [start_rank(procs, f"{PREFIX}-w{r}", out, r, a.timeout,
                                    [py, "bench/fsdp_bench.py", "--mode", mode, "--comm", comm, "--mib", a.mib,
                                     "--repeats", a.repeats, "--steps", a.steps, "--warmup", a.warmup,
                                     "--hidden", a.hidden, "--seed", SEED, "--out", out / f"rank{r}.json"],
                                    {**env, "RANK": str(r)}) for r in range(WORKERS)]
                wait_ranks(procs, ranks, out, a.timeout, f"[{link}] {mode}, {comm}")
                snapshot(out / "after.jsonl", PREFIX, WORKERS)
                if sw is not None:
                    # switchd's CPU-seconds (user + system, all threads) for the report.
                    cpu_s = proc_jiffies(proc_stat(sw.pid)) / os.sysconf("SC_CLK_TCK")
                    (out / "switchd-cpu-seconds").write_text(f"{cpu_s:g}\n")
                    procs.stop(sw)
                log(f"[{link}] {mode}, {comm}: done")

            if busy_machine():
                warn(f"1-min load average is {loadavg()} on {nproc()} cores before starting: other work shares "
                     "the CPUs, expect noisy times")
            for mode in ("collectives", "fsdp"):
                for comm in ("gloo", "switch"):
                    run_config("unlimited", mode, comm)
            net("shape-workers", PREFIX, WORKERS, *TBF_ARGS)
            for mode in ("collectives", "fsdp"):
                for comm in ("gloo", "switch"):
                    run_config("1gbit", mode, comm)
    except BaseException:
        log(f"failed; logs in {rd}")
        raise
    finally:
        shutil.rmtree(rd / "bin", ignore_errors=True)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out_json, out_png = RESULTS_DIR / f"bench-fsdp-{st}.json", RESULTS_DIR / f"bench-fsdp-{st}.png"
    name = "bench-fsdp" if a.mtu == 1500 else f"bench-fsdp-mtu{a.mtu}"
    run_checked_report(
        "bench_fsdp_report.py",
        [rd, "--json", out_json, "--table", rd / "table.md", "--png", out_png, "--stamp", st, "--mib", a.mib,
         "--mtu", a.mtu, "--repeats", a.repeats, "--warmup", a.warmup, "--steps", a.steps, "--hidden", a.hidden,
         "--tbf", " ".join(TBF_ARGS), "--bench-seconds", int(time.monotonic() - t0)],
        out_json, rd / "table.md",
        f"=== bench fsdp {st}: 4 ranks; reduce-scatter and all-gather of {a.mib} MiB; FSDP2 step, "
        f"hidden {a.hidden} ===", name)
    publish(out_json, out_png, name, not a.no_docs)
    log(f"bench took {int(time.monotonic() - t0)} s")
    return 0


SCENARIO = Scenario(
    name="fsdp",
    summary="reduce-scatter, all-gather and FSDP2 steps through the switch against gloo (root, torch)",
    description=DESCRIPTION,
    run=run,
    needs_root=True,
    options=(
        Option("--mib", "collectives: MiB of float32 in each rank's full tensor", type=uint_range(1, 1024),
               default=64, metavar="S"),
        Option("--repeats", "collectives: timed calls per op after one warm-up", type=uint_range(1, 1000),
               default=5, metavar="K"),
        Option("--steps", "FSDP2: timed steps", type=uint_range(1, 10000), default=10, metavar="N"),
        Option("--warmup", "FSDP2: steps left out of the statistics", type=uint_range(0, 1000), default=2,
               metavar="N"),
        Option("--hidden", "FSDP2: width of the MLP's 2 hidden layers", type=uint_range(1, 20000), default=5000,
               metavar="H"),
        Option("--mtu", "MTU of every testbed link", type=uint_range(576, 9000), default=1500, metavar="M"),
        Option("--timeout", "seconds one configuration (4 ranks) may take", type=uint_range(10, 86400),
               default=600, metavar="T"),
        Option("--no-docs", "leave bench/results/bench-fsdp.{json,png} alone"),
    ),
)
