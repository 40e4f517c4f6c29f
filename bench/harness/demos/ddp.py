"""demos/ddp.py: `scripts/demo ddp`: train examples/train_ddp.py with
PyTorch DDP across the worker namespaces of a testbed, gradients summed in
the switch. Installs what is missing (scripts/setup.sh), builds switchd and
the aggswitch package (into the project venv), makes a testbed (prefix
"train"), starts switchd with one job, launches one `torchrun` per worker
namespace (--nnodes N, rendezvous at worker 0's address through the
switch), shows rank 0's progress, and prints each rank's final loss and
weight digest (train_ddp_report.py): TRAIN PASSED when every rank ended
with the same weights; with --comm switch then the switch's counters for
the job. Everything it starts is stopped by PID and the testbed removed on
exit, also on failure, Ctrl-C or SIGTERM; the run folder is kept unless
it passed.
"""

import argparse
import os
import re
import subprocess
import sys

from demos.common import BINARIES, JOB_ID, RunDir, prefix_type
from lifecycle import (REPO_ROOT, HARNESS_DIR, HarnessError, Processes, Testbed, log, release_binary,
                       random_secret, start_switchd, tail, warn, write_switchd_config)
from options import uint_range
from scenario import Option, Scenario
from tools import VENV, build_python_package, build_release, run_setup

MASTER_PORT = 29500
# Lines of rank 0's log shown while it trains (train_ddp.py's progress and result).
PROGRESS = re.compile(r"^(step|rank)")
FAILED_LOG_LINES = 15


def comm(text):
    if text not in ("switch", "gloo"):
        raise argparse.ArgumentTypeError(f"must be switch or gloo, got '{text}'")
    return text


DESCRIPTION = """\
switch runs the aggswitch DDP hook; gloo DDP's default all-reduce (its
traffic crosses the switch's forwarding path). Options after `--` go to
examples/train_ddp.py (--hidden, --batch, ...). Needs scripts/setup.sh's venv
(.venv) with torch and scikit-learn. Logs go to /tmp/agg-train.XXXXXX, kept
when the run fails."""

OPTIONS = (
    Option("--comm", "switch: the aggswitch DDP hook; gloo: DDP's default all-reduce", comm, "switch", "C"),
    Option("--workers", "ranks (1..16), one per namespace PREFIX-wI", uint_range(1, 16), 4, "N"),
    Option("--steps", "training steps (1..1000000)", uint_range(1, 1000000), 100, "K"),
    Option("--prefix", "testbed namespace prefix", prefix_type(31), "train", "P"),
    Option("--timeout", "seconds the ranks get before they are stopped (1..86400)", uint_range(1, 86400), 600,
           "T"),
    Option("--no-build", "use target/release and the venv's aggswitch as they are (no cargo or maturin build)"),
)


class Follower:
    """Prints the lines of a growing log that match a pattern, as they come."""

    def __init__(self, path, pattern):
        self.path, self.pattern = path, pattern
        self.offset, self.partial = 0, ""

    def poll(self):
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self.offset)
                text = f.read()
                self.offset = f.tell()
        except OSError:
            return
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        for line in lines:
            if self.pattern.match(line):
                print(line, flush=True)


def rank_argv(a, rank, master_addr, out, train_args):
    """One node's torchrun command line."""
    return [VENV / "bin" / "torchrun", f"--nnodes={a.workers}", "--nproc-per-node=1", f"--node-rank={rank}",
            f"--master-addr={master_addr}", f"--master-port={MASTER_PORT}", REPO_ROOT / "examples" / "train_ddp.py",
            "--comm", a.comm, "--steps", a.steps, "--out", out, *train_args]


def run(a):
    train_args = a.extra
    torchrun, python = VENV / "bin" / "torchrun", VENV / "bin" / "python"
    run_setup()
    if not a.no_build:
        build_release()
        build_python_package()
    for b in BINARIES:
        release_binary(b)
    if not (os.access(torchrun, os.X_OK) and os.access(python, os.X_OK)):
        raise HarnessError(f"no torchrun in {VENV}: run scripts/setup.sh")
    switchd = release_binary("switchd")
    with RunDir("/tmp/agg-train", keep=False) as work, \
            Testbed(a.prefix, ["--workers", a.workers], work.path, show=True) as tb, Processes() as procs:
        wd = work.path
        secret = random_secret()
        cfg = wd / "switch.toml"
        write_switchd_config(switchd, tb, cfg, "scripts/demo ddp", workers=a.workers, secret=secret,
                             sets=[f'switch.admin_socket="{wd}/admin.sock"'])
        start_switchd(procs, f"{a.prefix}-sw", switchd, wd / "switchd.log",
                      ["run", "--config", cfg, "--stats-file", wd / "stats.json"])
        log(f"switchd ready; training with --comm {a.comm}, {a.workers} ranks, {a.steps} steps")

        env = {"AGGSWITCH_SWITCH": tb["switch_addr"], "AGGSWITCH_JOB": str(JOB_ID), "AGGSWITCH_SECRET": secret,
               "GLOO_SOCKET_IFNAME": "eth0"}
        ranks = [procs.start(rank_argv(a, i, tb["worker_0_addr"], wd / f"rank{i}.json", train_args),
                             ns=f"{a.prefix}-w{i}", stdout=wd / f"rank{i}.log", env=env, cwd=REPO_ROOT)
                 for i in range(a.workers)]
        # Rank 0's progress on the terminal.
        progress = Follower(wd / "rank0.log", PROGRESS)
        statuses = procs.wait(ranks, a.timeout, stop_on_failure=False, on_tick=progress.poll)
        progress.poll()
        failed = False
        for i, s in enumerate(statuses):
            if s != 0:
                warn(f"rank {i} failed (status {124 if s == 'timeout' else s}); its log:")
                print(tail(wd / f"rank{i}.log", FAILED_LOG_LINES), file=sys.stderr, flush=True)
                failed = True
        if failed:
            raise HarnessError("TRAIN FAILED")

        r = subprocess.run([str(python), str(HARNESS_DIR / "train_ddp_report.py"),
                            *sorted(str(p) for p in wd.glob("rank*.json"))])
        if r.returncode == 0 and a.comm == "switch":
            subprocess.run([str(release_binary("switchctl")), "--socket", str(wd / "admin.sock"), "stats",
                            str(JOB_ID)], stderr=subprocess.DEVNULL)
        work.passed = r.returncode == 0
    return 0 if work.passed else 1


MODE = Scenario("ddp", "PyTorch DDP training across the testbed, gradients summed in the switch", DESCRIPTION,
                run, OPTIONS, needs_root=True)
