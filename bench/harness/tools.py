"""tools.py: what a scenario needs before it measures: Debian packages
(installed when missing, unless told not to), or everything the project
needs (scripts/setup.sh, for the demos), the release binaries (built
with cargo unless told not to; cargo found in ~/.cargo/bin also under sudo),
the aggswitch Python package built into the project venv (the ddp demo), private copies of them (a rebuild of
target/ while a run goes on must not change what is measured), and the
scripts/net.sh commands (the ip/tc/namespace work, which stays in bash).
"""

import os
import shutil
import subprocess
import tempfile

from lifecycle import REPO_ROOT, HarnessError, log, release_binary, run_checked

NET_SH = REPO_ROOT / "scripts" / "net.sh"
SETUP_SH = REPO_ROOT / "scripts" / "setup.sh"


def pkg_installed(name):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    return r.stdout.strip() == "install ok installed"


def ensure_packages(install, packages):
    """apt-get install the packages not installed (one apt-get update
    first); HarnessError naming them when install is False."""
    missing = [p for p in packages if not pkg_installed(p)]
    if not missing:
        return
    if not install:
        raise HarnessError(f"missing packages: {' '.join(missing)} (run without --no-install, or apt-get install them)")
    log(f"installing Debian packages: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]):
        if subprocess.run(argv, stdout=subprocess.DEVNULL, env=env).returncode:
            raise HarnessError(f"{' '.join(argv)} failed")


def run_setup():
    """scripts/setup.sh: installs what the project needs and is missing
    (packages, the Rust toolchain, the venv); its output passes through."""
    if subprocess.run(["bash", str(SETUP_SH)], cwd=REPO_ROOT).returncode:
        raise HarnessError("scripts/setup.sh failed (see above)")


def cargo():
    """cargo: on PATH, else rustup's ~/.cargo/bin/cargo (sudo drops it from PATH)."""
    found = shutil.which("cargo")
    if found:
        return found
    home = os.path.expanduser("~") if os.environ.get("HOME") else "/root"
    candidate = os.path.join(home, ".cargo", "bin", "cargo")
    if os.access(candidate, os.X_OK):
        return candidate
    raise HarnessError("cargo not found (looked on PATH and in ~/.cargo); install the Rust toolchain with rustup")


def build_release():
    log("building (cargo build --release --workspace --bins)")
    if subprocess.run([cargo(), "build", "--release", "--workspace", "--bins"], cwd=REPO_ROOT).returncode:
        raise HarnessError("cargo build --release --workspace --bins failed")


VENV = REPO_ROOT / ".venv"


def build_python_package():
    """Build the aggswitch package (python/, release) into the project venv,
    editable (maturin develop), and check that it imports."""
    py, maturin = VENV / "bin" / "python", VENV / "bin" / "maturin"
    if not (os.access(py, os.X_OK) and os.access(maturin, os.X_OK)):
        raise HarnessError(f"no project venv with maturin in {VENV}: run scripts/setup.sh")
    log("building the aggswitch package (maturin develop --release in python/)")
    path = os.pathsep.join([str(VENV / "bin"), os.path.dirname(cargo()), os.environ.get("PATH", "")])
    env = {**os.environ, "VIRTUAL_ENV": str(VENV), "PATH": path}
    if subprocess.run([str(maturin), "develop", "--release", "--quiet"], cwd=REPO_ROOT / "python", env=env).returncode:
        raise HarnessError("building the aggswitch package failed (maturin develop --release in python/)")
    if subprocess.run([str(py), "-c", "import aggswitch"]).returncode:
        raise HarnessError("aggswitch does not import after building it")


def private_binaries(names, build=True):
    """A temporary folder with copies of target/release/NAMES (switchctl
    beside switchd: start_switchd asks it); the caller removes it."""
    if build:
        build_release()
    srcs = [release_binary(n) for n in names]
    d = tempfile.mkdtemp(prefix="bench-bin.")
    for src in srcs:
        shutil.copy2(src, d)
    return d


def net(*args):
    """scripts/net.sh ARGS (ip/tc/namespace work); its stdout."""
    return run_checked(["bash", NET_SH, *args], f"scripts/net.sh {args[0]}").stdout.strip()
