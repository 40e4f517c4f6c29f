"""demos/common.py: what the demo modes share. The run folder (a fresh
/tmp/agg-demo*.XXXXXX, removed after a pass unless --keep-logs, kept and
named otherwise), preparing the machine (scripts/setup.sh, then the
release build, or with --bin-dir the binaries of a folder such as an
unpacked package's usr/bin), the ping between two hosts beside the all-reduce and its
one-line verdict, and the closing verdict: bench/harness/demo_report.py's
tables, then DEMO PASSED or DEMO FAILED. Pure helpers (prefix_type, elements,
json_path, ping_received, ping_verdict, exit_status) touch nothing
outside this process; binaries_in only looks at a folder.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lifecycle import HARNESS_DIR, REPO_ROOT, HarnessError, log, release_binary, stamp
from scenario import Option
from tools import build_release, run_setup

AGG_PORT = 48879
JOB_ID = 1
STOP_TIMEOUT = 15
PING_COUNT = 5
# Every binary the build must leave in target/release (as the bash demos checked).
BINARIES = ("switchd", "worker", "switchctl", "aggblast")
# What the single and tree demos run from a --bin-dir: what the package
# aggswitch installs in /usr/bin (switchctl beside switchd: start_switchd
# asks it whether switchd is ready).
PACKAGED = ("switchd", "worker", "switchctl")
BIN_DIR = Option("--bin-dir", "run switchd, switchctl and worker from DIR (e.g. usr/bin of the aggswitch package "
                 "unpacked with dpkg-deb -x) instead of building them in target/release", str, None, "DIR")


def prefix_type(max_len):
    """A testbed namespace prefix: a letter, digit or _ then up to max_len-1
    more of those or '-' (namespace and link names must stay short)."""

    def parse(text):
        if not re.fullmatch(rf"[A-Za-z0-9_][A-Za-z0-9_-]{{0,{max_len - 1}}}", text):
            raise argparse.ArgumentTypeError(f"bad prefix '{text}' (letters, digits, _ and -, at most {max_len})")
        return text

    parse.__name__ = "prefix"
    return parse


def elements(mib):
    """float32 elements in `mib` MiB."""
    return mib * 1024 * 1024 // 4


def json_path(given, name, cwd):
    """Where the full JSON goes: `given` (relative to cwd) or
    results/NAME-STAMP.json in the repository."""
    if not given:
        return REPO_ROOT / "results" / f"{name}-{stamp()}.json"
    path = Path(given)
    return path if path.is_absolute() else Path(cwd) / path


def ping_received(text):
    """The replies ping's summary line counts ("5 packets transmitted, 5
    received, ..."); 0 when there is none."""
    m = re.search(r"(\d+) received", text)
    return int(m.group(1)) if m else 0


def ping_verdict(rc, text, ok, failed):
    """The ping line of the report: "yes: OK, R/5 replies" when ping
    exited 0 with a reply, else "NO: FAILED, R/5 replies ...". ok and failed
    describe the path (hosts and addresses)."""
    received = ping_received(text)
    if rc == 0 and received > 0:
        return f"yes: {ok}, {received}/{PING_COUNT} replies"
    return f"NO: {failed}, {received}/{PING_COUNT} replies"


def exit_status(rc):
    """A Popen returncode as the shell writes it: -N (killed by signal N)
    is 128+N; "timeout" and other words pass through."""
    return 128 - rc if isinstance(rc, int) and rc < 0 else rc


def binaries_in(bin_dir):
    """(switchd, worker) of folder bin_dir, an absolute path each; a
    HarnessError naming every one of PACKAGED that is missing there or not
    executable."""
    d = Path(bin_dir).resolve()
    missing = [n for n in PACKAGED if not ((d / n).is_file() and os.access(d / n, os.X_OK))]
    if missing:
        raise HarnessError(f"--bin-dir {bin_dir}: no executable {', '.join(missing)} in {d} (it needs "
                           f"{', '.join(PACKAGED)}, as the aggswitch package installs them in /usr/bin)")
    return d / "switchd", d / "worker"


def prepare(bin_dir=None):
    """scripts/setup.sh, then the release build, or with bin_dir no build
    and the binaries of that folder; (switchd, worker)."""
    log("checking the tools (scripts/setup.sh)")
    run_setup()
    if bin_dir is not None:
        switchd, worker = binaries_in(bin_dir)
        log(f"running the binaries of {switchd.parent} (--bin-dir; nothing built)")
        return switchd, worker
    build_release()
    for b in BINARIES:
        release_binary(b)
    return release_binary("switchd"), release_binary("worker")


class RunDir:
    """A fresh run folder for a `with` block; `passed = True` inside the
    block (and no keep) removes it on leaving, otherwise it is kept and
    named on stderr."""

    def __init__(self, prefix, keep):
        self.prefix, self.keep = prefix, keep
        self.passed = False
        self.path = None

    def __enter__(self):
        self.path = Path(tempfile.mkdtemp(prefix=f"{self.prefix}."))
        return self

    def __exit__(self, *exc):
        if self.passed and not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            log(f"logs, configs and outputs kept in {self.path}")
        return False


def start_ping(procs, ns, to, out):
    """ping -c 5 from namespace ns to address `to`, output to out."""
    return procs.start(["ping", "-c", PING_COUNT, "-i", "0.2", "-W", "2", to], ns=ns, stdout=out)


def wait_ping(procs, p, out, ok, failed):
    """Wait for the ping started by start_ping (it ends by itself within
    about 3 s; stopped after 30); its report line."""
    rc = procs.wait([p], 30)[0]
    line = ping_verdict(rc, Path(out).read_text(errors="replace"), ok, failed)
    return line if line.startswith("yes") else f"{line} (see {out})"


def stop_switchds(procs, switchds):
    """SIGTERM each switchd (each writes its counters on exit), SIGKILL
    after STOP_TIMEOUT s; the last non-zero exit status, or 0."""
    rc = 0
    for p in switchds:
        log(f"stopping switchd (SIGTERM to pid {p.pid})")
        status = exit_status(procs.stop(p, grace=STOP_TIMEOUT))
        if status != 0:
            rc = status
    return rc


def report(work, statuses, switchd_rc, ping, json_out, mib, iterations, stats, spine_stats=()):
    """demo_report.py's tables and full JSON; True when every rank exited
    0 and verified."""
    argv = [sys.executable, str(HARNESS_DIR / "demo_report.py"), str(work), "--workers", str(len(statuses)),
            "--stats", str(stats), "--status", ",".join(str(exit_status(s)) for s in statuses),
            "--switchd-status", str(switchd_rc), "--ping", ping, "--json", str(json_out),
            "--mib", str(mib), "--iterations", str(iterations), "--job", str(JOB_ID)]
    for s in spine_stats:
        argv += ["--spine-stats", str(s)]
    return subprocess.run(argv).returncode == 0


def verdict(passed):
    """Print DEMO PASSED / DEMO FAILED; the exit status."""
    print("DEMO PASSED" if passed else "DEMO FAILED", flush=True)
    return 0 if passed else 1

