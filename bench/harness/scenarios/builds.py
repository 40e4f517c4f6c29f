"""builds.py: the `builds` scenario: the same all-reduce through two builds
of the switch and worker (each DIR holds its switchd, switchctl and worker),
interleaved run by run on one testbed, so a refactor's cost is measured in
one run on a noisy machine (root).

Each run starts the build's switchd (one dataplane thread), runs its
workers, and stops its switchd; the order alternates (A B, B A, ...) so
neither build always runs first. `--link 1gbit` shapes every worker link
as the efficiency scenario's 1 Gbit/s setting does, for a change's cost
where the link is the bottleneck. `--slow-results MBIT` shapes everything
into the last rank to MBIT Mbit/s (a deep tbf on its ingress) from
`--slow-after` seconds into each run: a queue that builds on one rank's
way after its RTO has settled, for a change's cost when one path slows
mid-run. `--worker-threads T` runs every worker with `--threads T` against
a switchd whose seq_lanes is at least T (docs/design/worker-threads.md), for
a change's cost to a collective carried by T threads. `--b-switch-config`
sets switchd keys for the second build only (a setting's cost with the
same binaries on both sides, or a new key the first build does not know),
`--b-worker-args` adds `worker allreduce` options to the second build's
workers only (an option's cost, e.g. `--no-congestion-control`), and
`--huge-pages N` adds N pages to the machine's 2 MiB huge page pool for the
runs (`umem_huge_pages`), restored afterwards. Each run's figures are
the transports scenario's (bench_transports_report.py), with the build's
label in place of the transport.
"""

import argparse
import json
import os
import shlex
import tempfile
import time
from pathlib import Path

import bench_transports_report as report
from lifecycle import (RESULTS_DIR, HarnessError, HugePages, Processes, Testbed, log, random_secret, start_switchd,
                       stamp, thread_args, write_switchd_config)
from options import choice, positive_seconds, uint_range
from scenario import Option, Scenario
from scenarios.efficiency import TBF_ARGS
from scenarios.transports import mark
from tools import net

DESCRIPTION = """\
Prints one JSON line per run and the medians per build, then the ratio of
the second build's median time to the first's. Writes
bench/results/builds-STAMP.json. Build a DIR with, e.g.:
git worktree add /tmp/old REV && cargo build --release --bins
--manifest-path /tmp/old/Cargo.toml, then DIR = /tmp/old/target/release."""


def build_dir(text):
    d = Path(text)
    for b in ("switchd", "switchctl", "worker"):
        if not os.access(d / b, os.X_OK):
            raise argparse.ArgumentTypeError(f"{d / b} is not an executable (a DIR holds switchd, switchctl and worker)")
    return d


def switch_sets(text):
    """`switchd testbed-config --set` strings from KEY=VALUE,KEY=VALUE."""
    sets = tuple(s.strip() for s in text.split(",") if s.strip())
    for s in sets:
        key, eq, value = s.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"{s!r} is not KEY=VALUE (switch.umem_huge_pages=\"on\")")
    return sets


# The options every run sets itself: --b-worker-args may not set them again.
OWN_WORKER_OPTIONS = ("--switch", "--job", "--rank", "--workers", "--elements", "--iterations", "--threads",
                      "--json")


def worker_args(text):
    """Extra `worker allreduce` options from a shell-quoted string; none that
    the scenario sets itself."""
    try:
        args = tuple(shlex.split(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    for arg in args:
        option = arg.split("=", 1)[0]
        if option in OWN_WORKER_OPTIONS:
            raise argparse.ArgumentTypeError(f"{option} is set by the scenario for both builds; "
                                             f"use --worker-threads, --workers, --elements or --iterations")
    return args


def order(run_i, labels):
    """The builds' order in run run_i: as given, reversed every other run."""
    return list(labels) if run_i % 2 == 0 else list(reversed(labels))


def run(a):
    if a.a is None or a.b is None:
        raise HarnessError("name both builds: scripts/bench builds --a DIR --b DIR")
    if a.slow_results and a.link != "unlimited":
        raise HarnessError("--slow-results replaces the last rank's ingress shaper: use it on unlimited links")
    builds = {"A": a.a, "B": a.b}
    worker_threads, lane_sets = thread_args(a.worker_threads)
    slow_ns = f"{a.prefix}-w{a.workers - 1}"
    out = Path(tempfile.mkdtemp(prefix="bench-builds."))
    secret = random_secret()
    runs = []
    with HugePages(a.huge_pages), Testbed(a.prefix, ["--workers", a.workers, "--mtu", a.mtu], out) as tb, \
            Processes() as procs:
        if a.link == "1gbit":
            net("shape-workers", a.prefix, a.workers, *TBF_ARGS)
        for run_i in range(a.runs):
            for label in order(run_i, builds):
                d = builds[label]
                cfg = out / f"switchd-{label}.toml"
                extra = list(a.b_switch_config) if label == "B" else []
                write_switchd_config(d / "switchd", tb, cfg, "scripts/bench builds", a.workers, secret,
                                     [f'switch.admin_socket="{out}/switchd-{label}.sock"', *lane_sets, *extra])
                sw = start_switchd(procs, f"{a.prefix}-sw", d / "switchd", out / f"switchd-{label}-{run_i}.log",
                                   ["run", "--config", cfg])
                mark(out / f"{label}-{run_i}.before", ["children", "switchd", "wall", "stat"], sw.pid)
                ranks = [procs.start([d / "worker", "allreduce", "--switch", tb["switch_addr"], "--job", 1,
                                      "--rank", r, "--workers", a.workers, "--elements", a.elements,
                                      "--iterations", a.iterations, *worker_threads, "--json",
                                      *(a.b_worker_args if label == "B" else ())],
                                     ns=f"{a.prefix}-w{r}", env={"AGGSWITCH_SECRET": secret},
                                     stdout=out / f"{label}-{run_i}-rank{r}.json",
                                     stderr=out / f"{label}-{run_i}-rank{r}.log")
                         for r in range(a.workers)]
                started, slowed = time.monotonic(), []

                def slow_once():
                    if a.slow_results and not slowed and time.monotonic() - started >= a.slow_after:
                        net("slow-ingress", slow_ns, a.slow_results)
                        slowed.append(True)

                status = procs.wait(ranks, a.timeout, on_tick=slow_once)
                if slowed:
                    net("unslow-ingress", slow_ns)
                mark(out / f"{label}-{run_i}.after", ["stat", "wall", "switchd", "children"], sw.pid)
                procs.stop(sw)
                if any(s != 0 for s in status):
                    raise HarnessError(f"a worker of build {label} failed (run {run_i}, status {status}); see {out}")
                line = report.one_run(str(out), label, run_i, a.workers)
                line["build"] = str(d)
                print(json.dumps(line, separators=(",", ":")), flush=True)
                runs.append(line)
    summary = report.summary(runs)
    for line in summary:
        print(json.dumps(line, separators=(",", ":")))
    by = {s["transport"]: s for s in summary}
    ratio = by["B"]["median_seconds"] / by["A"]["median_seconds"]
    slow = f", the last rank's ingress at {a.slow_results} Mbit/s after {a.slow_after:g} s" if a.slow_results else ""
    threads = f", {a.worker_threads} worker threads" if a.worker_threads > 1 else ""
    b_args = f", B's workers with {shlex.join(a.b_worker_args)}" if a.b_worker_args else ""
    print(f"B / A, median all-reduce time: {ratio:.3f} (A = {a.a}, B = {a.b}, links {a.link}{slow}{threads}{b_args})")
    path = RESULTS_DIR / f"builds-{stamp()}.json"
    path.write_text(json.dumps({"a": str(a.a), "b": str(a.b), "workers": a.workers, "elements": a.elements,
                                "iterations": a.iterations, "mtu": a.mtu, "link": a.link,
                                "slow_results_mbit": a.slow_results, "slow_after_s": a.slow_after,
                                "worker_threads": a.worker_threads, "b_switch_config": list(a.b_switch_config),
                                "b_worker_args": list(a.b_worker_args),
                                "huge_pages": a.huge_pages, "runs": runs, "summary": summary,
                                "b_over_a_seconds": ratio}, indent=1) + "\n")
    log(f"wrote {path}; runs in {out}")
    return 0


SCENARIO = Scenario(
    name="builds",
    summary="two builds' all-reduce, interleaved run by run: a change's cost in one run (root)",
    description=DESCRIPTION,
    run=run,
    needs_root=True,
    options=(
        Option("--a", "the first build's DIR (switchd, switchctl, worker)", type=build_dir,
               metavar="DIR"),
        Option("--b", "the second build's DIR", type=build_dir, metavar="DIR"),
        Option("--prefix", "testbed namespace prefix", type=str, default="ab", metavar="P"),
        Option("--workers", "ranks, one namespace each", type=uint_range(1, 90), default=4, metavar="W"),
        Option("--elements", "float32 elements per tensor", type=uint_range(1, 1 << 30), default=16777216,
               metavar="N"),
        Option("--iterations", "all-reduces per worker run", type=uint_range(1, 100000), default=3, metavar="K"),
        Option("--mtu", "MTU of the testbed's links (above 3500 switchd's sockets are multi-buffer)",
               type=uint_range(1280, 9000), default=1500, metavar="M"),
        Option("--link", "worker links: unlimited, or 1gbit (tbf both ways, as in efficiency)",
               type=choice("unlimited", "1gbit"), default="unlimited", metavar="L"),
        Option("--slow-results", "shape everything into the last rank to MBIT Mbit/s (deep queue), from "
               "--slow-after on (0: never)", type=uint_range(0, 100000), default=0, metavar="MBIT"),
        Option("--slow-after", "seconds into each run when --slow-results starts", type=positive_seconds,
               default=1.0, metavar="S"),
        Option("--worker-threads", "threads per worker (worker --threads T, switchd seq_lanes >= T; 1: as "
               "before threads)", type=uint_range(1, 64), default=1, metavar="T"),
        Option("--b-switch-config", "the second build's switchd settings only: KEY=VALUE,... "
               "(switch.umem_huge_pages=\"on\")", type=switch_sets, default=(), metavar="SETS"),
        Option("--b-worker-args", "the second build's workers only: more `worker allreduce` options, "
               "shell-quoted, after an = (--b-worker-args=--no-congestion-control)", type=worker_args, default=(),
               metavar="ARGS"),
        Option("--huge-pages", "2 MiB huge pages to add to the machine's pool for the runs (restored after; "
               "switchd's UMEMs take 8 per socket)", type=uint_range(0, 65536), default=0, metavar="N"),
        Option("--runs", "runs per build, interleaved", type=uint_range(1, 1000), default=6, metavar="R"),
        Option("--timeout", "seconds a run's workers may take before they are stopped",
               type=uint_range(1, 86400), default=600, metavar="S"),
    ),
)
