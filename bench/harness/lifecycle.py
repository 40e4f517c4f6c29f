"""lifecycle.py: one testbed's life and the processes a scenario starts.

* Processes starts commands (in a network namespace with `ip netns exec`,
  which execs, so the PID is the command's own) and stops them by PID:
  SIGTERM, SIGKILL after a grace period. It only ever signals PIDs it
  started, and on leaving its `with` block stops every one still running.
* Testbed brings `scripts/testbed.sh up ... --print-env` up on entry and,
  on leaving (normally, on an exception, on Ctrl-C or SIGTERM: the CLI turns
  SIGTERM into SystemExit), stops what still runs inside its namespaces
  and takes it down. Its key=value description (addresses, namespaces)
  reads as tb["switch_addr"].
* switchd: `switchd testbed-config` writes its config from the testbed's
  env file (the one typed writer); lanes_for says the seq_lanes a
  worker's T threads need; start_switchd waits until switchctl says that
  PID is ready.
Bash keeps the namespaces and links (scripts/testbed.sh); nothing here
runs ip or tc itself except `ip netns exec` and `ip netns pids`.
"""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
TESTBED_SH = REPO_ROOT / "scripts" / "testbed.sh"
RELEASE = REPO_ROOT / "target" / "release"

_name = "bench"


class HarnessError(Exception):
    """A failure the user can act on; the CLI prints it and exits 1."""


def set_name(name, prog="bench"):
    """Messages start with `PROG NAME:` (`bench allreduce:`, `demo tree:`)."""
    global _name
    _name = f"{prog} {name}"


def log(msg):
    print(f"{_name}: {msg}", file=sys.stderr, flush=True)


def warn(msg):
    print(f"{_name}: warning: {msg}", file=sys.stderr, flush=True)


def stamp():
    """A UTC timestamp for file names: 20261129T020000Z."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def require_root(scenario, argv, prog="scripts/bench"):
    if os.geteuid() != 0:
        raise HarnessError(f"run as root: sudo {prog} {scenario} {' '.join(argv)}".rstrip())


def random_secret():
    """A fresh job secret: 32 random bytes as 64 hex digits."""
    return secrets.token_hex(32)


def release_binary(name, hint="cargo build --release --workspace --bins"):
    path = RELEASE / name
    if not os.access(path, os.X_OK):
        raise HarnessError(f"{path} missing (build with: {hint})")
    return path


def run_checked(argv, what, **kw):
    """Run argv to completion; HarnessError with its stderr's tail on failure."""
    r = subprocess.run([str(a) for a in argv], stdout=kw.pop("stdout", subprocess.PIPE),
                       stderr=subprocess.PIPE, text=True, **kw)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or "").strip().splitlines()[-20:])
        raise HarnessError(f"{what} failed (status {r.returncode}){': ' + tail if tail else ''}")
    return r


def tail(path, n=40):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def netns_argv(ns, argv):
    return ["ip", "netns", "exec", ns, *[str(a) for a in argv]] if ns else [str(a) for a in argv]


class Processes:
    """The processes a scenario started; stops those still running on exit."""

    def __init__(self):
        self._running = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in reversed(list(self._running)):
            self.stop(p, grace=5)
        return False

    def start(self, argv, ns=None, stdout=None, stderr=None, env=None, cwd=None, base_env=None):
        """Start argv (inside network namespace ns when given); stdout and
        stderr are paths (stderr None: to stdout's file) or None (inherited).
        Its environment: base_env (default this process's) with env added."""
        out = open(stdout, "w") if stdout else None
        err = open(stderr, "w") if stderr else (subprocess.STDOUT if out else None)
        try:
            p = subprocess.Popen(netns_argv(ns, argv), stdout=out, stderr=err,
                                 env={**(os.environ if base_env is None else base_env), **(env or {})}, cwd=cwd)
        finally:
            for f in (out, err):
                if hasattr(f, "close"):
                    f.close()
        self._running.append(p)
        return p

    def wait(self, procs, timeout, stop_on_failure=True, on_tick=None):
        """Wait for every one of procs; the ones still running after timeout
        seconds are stopped and reported as "timeout". When one fails (and
        stop_on_failure), the others are stopped as "stopped": they would
        wait on it. on_tick (no arguments) is called at every poll, e.g. to
        show a log's progress. Returns their statuses."""
        deadline = time.monotonic() + timeout
        status = {}
        while len(status) < len(procs):
            if on_tick is not None:
                on_tick()
            for i, p in enumerate(procs):
                if i not in status and p.poll() is not None:
                    status[i] = p.returncode
                    self._forget(p)
            failed = stop_on_failure and any(s != 0 for s in status.values())
            if len(status) < len(procs) and (failed or time.monotonic() >= deadline):
                if not failed:
                    warn(f"still running after {timeout:g} s; stopping them")
                for i, p in enumerate(procs):
                    if i not in status:
                        self.stop(p, grace=5)
                        status[i] = "stopped" if failed else "timeout"
                break
            time.sleep(0.05)
        return [status[i] for i in range(len(procs))]

    def stop(self, p, grace=15):
        """SIGTERM, SIGKILL after grace seconds; reaps p; its exit status."""
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(grace)
            except subprocess.TimeoutExpired:
                warn(f"pid {p.pid} ignored SIGTERM for {grace} s; sending SIGKILL")
                p.kill()
                p.wait()
        self._forget(p)
        return p.returncode

    def _forget(self, p):
        if p in self._running:
            self._running.remove(p)


def parse_env(text):
    """testbed.sh's --print-env output as a dict."""
    env = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and not key.startswith("#"):
            env[key.strip()] = value
    return env


NR_HUGEPAGES = Path("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")


class HugePages:
    """`extra` more 2 MiB huge pages in the machine's pool for the length
    of a `with` block (switchd's UMEMs take them, `[switch]
    umem_huge_pages`), the pool's size as it was restored on the way out,
    also on error. HarnessError when the kernel finds fewer. 0: nothing
    changes."""

    def __init__(self, extra, path=NR_HUGEPAGES):
        self.extra = extra
        self.path = Path(path)
        self.before = None

    def __enter__(self):
        if self.extra == 0:
            return self
        self.before = int(self.path.read_text())
        want = self.before + self.extra
        self.path.write_text(f"{want}\n")
        got = int(self.path.read_text())
        if got < want:
            self.__exit__()
            raise HarnessError(f"asked the kernel for {want} 2 MiB huge pages ({self.extra} more), "
                               f"it found {got}: too little unfragmented memory")
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            self.path.write_text(f"{self.before}\n")
            self.before = None


class Testbed:
    """`scripts/testbed.sh up --prefix PREFIX ARGS --print-env` for the
    length of a `with` block; its env file is workdir/testbed.env. With
    show, testbed.sh's summary (its stderr) goes to the terminal (the
    demos show it); otherwise it is only quoted when `up` fails."""

    def __init__(self, prefix, args, workdir, show=False):
        self.prefix = prefix
        self.args = [str(a) for a in args]
        self.env_file = Path(workdir) / "testbed.env"
        self.env = {}
        self.show = show

    def __enter__(self):
        try:
            with open(self.env_file, "w") as out:
                r = subprocess.run(["bash", str(TESTBED_SH), "up", "--prefix", self.prefix,
                                    *self.args, "--print-env"], stdout=out,
                                   stderr=None if self.show else subprocess.PIPE, text=True)
            if r.returncode != 0:
                why = (r.stderr or "see above").strip()[-2000:]
                raise HarnessError(f"scripts/testbed.sh up --prefix {self.prefix} "
                                   f"{' '.join(self.args)} failed: {why}")
            self.env = parse_env(self.env_file.read_text())
        except BaseException:
            self._down()
            raise
        return self

    def __exit__(self, *exc):
        self._down()
        return False

    def __getitem__(self, key):
        try:
            return self.env[key]
        except KeyError:
            raise HarnessError(f"the testbed has no '{key}' (see {self.env_file})") from None

    def namespaces(self):
        return [v for k, v in self.env.items() if k.endswith("_ns")]

    def _down(self):
        self.stop_leftovers()
        r = subprocess.run(["bash", str(TESTBED_SH), "down", "--prefix", self.prefix],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            warn(f"testbed down failed; run: scripts/testbed.sh down --prefix {self.prefix}")

    def stop_leftovers(self):
        """Stop, by PID, anything still running inside this testbed's
        namespaces (e.g. a rank whose wrapper was stopped): TERM, half a
        second, KILL. Only this testbed's namespaces, which this run made."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            found = False
            for ns in self.namespaces():
                r = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True)
                for pid in r.stdout.split():
                    found = True
                    try:
                        os.kill(int(pid), sig)
                    except (ProcessLookupError, ValueError):
                        pass
            if not found:
                return
            if sig == signal.SIGTERM:
                time.sleep(0.5)


def write_switchd_config(switchd, tb, out, writer, workers=None, secret=None, sets=(),
                         host_ports=False, jobs=()):
    """A switchd config for testbed tb from `switchd testbed-config`: its
    worker ports (and host ports with host_ports), its address, and with
    workers one job (id 1, the first `workers` workers, secret, 256 slots).
    sets are KEY=VALUE strings (switch.admin_socket="...", job.1.dtype=...);
    a key switchd does not know is an error. jobs are more --job specs
    (ID:WORKERS:env:AGGSWITCH_TESTBED_SECRET: that variable holds secret).
    Mode 0600 (it holds the secret)."""
    argv = [switchd, "testbed-config", "--env", tb.env_file, "--out", out, "--writer", writer]
    env = dict(os.environ)
    if secret is not None:
        env["AGGSWITCH_TESTBED_SECRET"] = secret
    if workers is not None:
        argv += ["--job", f"1:0-{workers - 1}:env:AGGSWITCH_TESTBED_SECRET"]
    for j in jobs:
        argv += ["--job", j]
    if host_ports:
        argv.append("--host-ports")
    for s in sets:
        argv += ["--set", s]
    run_checked(argv, f"switchd testbed-config for {out}", env=env)


def lanes_for(threads, current=1):
    """switchd's seq_lanes for T worker threads: at least T and at least
    the setting it has, a power of two (switchd takes only those)."""
    need = max(threads, current)
    return 1 << (need - 1).bit_length()


def seq_lane_sets(lanes):
    """The `switchd testbed-config --set` strings for `lanes` seq lanes:
    none for one (the config as it always was)."""
    return [] if lanes == 1 else [f"switch.seq_lanes={lanes}"]


def thread_args(threads):
    """The worker's arguments and switchd's settings for T worker threads:
    `--threads T` and seq_lanes >= T; none for one thread (the worker and
    switchd then run as they always did: one seq lane, so one thread)."""
    if threads == 1:
        return [], []
    return ["--threads", threads], seq_lane_sets(lanes_for(threads))


def start_switchd(procs, ns, switchd, log_path, args, ready_timeout=30):
    """Start `switchd ARGS` in ns (output to log_path) and wait until the
    switchctl beside it says that PID is ready on the admin socket of ARGS'
    --config. HarnessError with the log's tail when it exits or is not
    ready in time (the caller's Processes still stops it)."""
    args = [str(a) for a in args]
    if "--config" not in args:
        raise HarnessError(f"start_switchd: no --config in {args}")
    cfg = args[args.index("--config") + 1]
    ctl = Path(os.environ.get("SWITCHCTL", Path(switchd).parent / "switchctl"))
    if not os.access(ctl, os.X_OK):
        raise HarnessError(f"{ctl} not found (build with cargo build --release --workspace --bins)")
    p = procs.start([switchd, *args], ns=ns, stdout=log_path)
    deadline = time.monotonic() + ready_timeout
    while True:
        r = subprocess.run([str(ctl), "--config", cfg, "ready", "--pid", str(p.pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode == 0:
            return p
        if p.poll() is not None:
            procs.stop(p)
            raise HarnessError(f"switchd exited with status {p.returncode} before it was ready:\n"
                               f"{tail(log_path)}")
        if time.monotonic() >= deadline:
            raise HarnessError(f"switchd was not ready within {ready_timeout} s: {r.stderr.strip()}\n"
                               f"{tail(log_path)}")
        time.sleep(0.1)


HARNESS_DIR = Path(__file__).resolve().parent


def publish(json_path, png, name, docs=True):
    """The one way a run's result becomes the published one: with docs,
    copy json_path and png (when it was drawn) to bench/results/NAME.json
    and .png, which docs/BENCHMARKS.md quotes; without, leave those alone
    and say so."""
    json_path, png = Path(json_path), Path(png)
    if not docs:
        log(f"wrote {json_path} and {png} (bench/results/{name}.* left alone)")
        return
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copy(json_path, RESULTS_DIR / f"{name}.json")
    if png.exists() and png.stat().st_size:
        shutil.copy(png, RESULTS_DIR / f"{name}.png")
    log(f"wrote bench/results/{name}.{{json,png}} (copies: {json_path.name}, {png.name})")


def run_checked_report(script, args, out_json, table, title, name):
    """Run a report of bench/harness/ that checks the run's sanity (exit 3:
    a check failed, its table says which), print `title` and its table,
    and raise HarnessError unless the run may be published as
    bench/results/NAME.* (the caller then calls publish)."""
    rc = subprocess.run([sys.executable, str(HARNESS_DIR / script), *[str(a) for a in args]]).returncode
    if not Path(out_json).exists():
        raise HarnessError(f"{script} wrote no JSON (status {rc})")
    print(f"\n{title}")
    print(Path(table).read_text())
    if rc not in (0, 3):
        raise HarnessError(f"{script} failed (status {rc})")
    if rc == 3:
        raise HarnessError(f"sanity check failed (see the table): bench/results/{name}.* left alone; {out_json}")


def run_report(script, args, what=None, stdout=None):
    """Run one of the reports in bench/harness/ (script name, e.g.
    bench_forward_report.py) under this Python; its output passes through
    (or into the open file stdout). HarnessError when it fails."""
    r = subprocess.run([sys.executable, str(HARNESS_DIR / script), *[str(a) for a in args]],
                       stdout=stdout)
    if r.returncode != 0:
        raise HarnessError(f"{what or script} failed (status {r.returncode}; see above)")
