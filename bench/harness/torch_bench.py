"""torch_bench.py: what the torch benchmarks (`train`, `fsdp`) share: the
project venv's Python that imports torch, scikit-learn and aggswitch
($AGGSWITCH_BENCH_PYTHON overrides it), their run folder
results/NAME-STAMP/ with a private copy of switchd and switchctl, and
launching the ranks (one
per worker namespace, bounded by `timeout`, measured by /usr/bin/time).
"""

import os
import shutil
import subprocess

from lifecycle import REPO_ROOT, RELEASE, HarnessError, log, release_binary, stamp, tail, warn
from tools import build_release, ensure_packages

PACKAGES = ["clang", "llvm", "libbpf-dev", "linux-libc-dev", "iproute2", "ethtool", "gcc", "time"]


def bench_python():
    return os.environ.get("AGGSWITCH_BENCH_PYTHON", str(REPO_ROOT / ".venv" / "bin" / "python"))


def prepare(name, build=True):
    """Check the Python, install and build (unless build is False), make the
    run folder with private binaries. Returns (stamp, run_dir, switchd)."""
    py = bench_python()
    if not os.access(py, os.X_OK):
        raise HarnessError(f"no Python at {py}: run scripts/setup.sh (or set AGGSWITCH_BENCH_PYTHON)")
    if subprocess.run([py, "-c", "import torch, sklearn, aggswitch.torch"], stderr=subprocess.DEVNULL).returncode:
        raise HarnessError(f"{py} cannot import torch, scikit-learn or aggswitch: run scripts/setup.sh")
    if subprocess.run([py, "-c", "import matplotlib"], stderr=subprocess.DEVNULL).returncode:
        log("installing matplotlib into the venv (for the plot)")
        if subprocess.run([py, "-m", "pip", "install", "-q", "matplotlib"], stdout=subprocess.DEVNULL).returncode:
            warn("pip install matplotlib failed; the plot will be skipped")
    if build:
        ensure_packages(True, PACKAGES)
        build_release()
    else:
        for b in ("switchd", "switchctl"):
            release_binary(b)
    for c in ("tc", "ip", "timeout", "/usr/bin/time"):
        if shutil.which(c) is None:
            raise HarnessError(f"{c} not found (apt-get install iproute2 coreutils time)")
    st = stamp()
    run_dir = REPO_ROOT / "results" / f"{name}-{st}"
    (run_dir / "bin").mkdir(parents=True)
    # switchctl beside switchd: start_switchd asks it whether switchd is ready.
    for b in ("switchd", "switchctl"):
        shutil.copy2(RELEASE / b, run_dir / "bin")
    return st, run_dir, run_dir / "bin" / "switchd"


def start_rank(procs, ns, out, rank, timeout, argv, env, base_env=None):
    """One rank: `timeout -k 10 T ip netns exec NS /usr/bin/time ... ARGV`,
    run from the repository root, log in OUT/rankR.log, its peak memory and
    times in OUT/rankR.time; environment as Processes.start's."""
    return procs.start(["timeout", "-k", 10, timeout, "ip", "netns", "exec", ns, "/usr/bin/time", "-f",
                        "%M %e %U %S", "-o", out / f"rank{rank}.time", *argv],
                       env=env, base_env=base_env, stdout=out / f"rank{rank}.log", cwd=REPO_ROOT)


def wait_ranks(procs, ranks, out, timeout, what):
    """Wait for the ranks; when one fails the others are stopped. HarnessError
    with every rank's log tail on failure."""
    status = procs.wait(ranks, timeout + 30)
    if any(s != 0 for s in status):
        logs = "\n".join(f"---- rank {r} ({out}/rank{r}.log), status {s} ----\n{tail(out / f'rank{r}.log', 5)}"
                         for r, s in enumerate(status))
        raise HarnessError(f"{what}: failed; see {out}\n{logs}")
