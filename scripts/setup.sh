#!/usr/bin/env bash
#
# setup.sh: install what building and testing the switch needs, if missing.
#
# Usage:
#   scripts/setup.sh
#
# Idempotent and quiet when everything is there. Otherwise:
#   * Debian packages (checked with dpkg): clang llvm libbpf-dev
#     linux-libc-dev bpftool iproute2 ethtool iputils-ping python3 tcpdump
#     iperf3 jq shellcheck (so that test.sh's lint stage runs everywhere)
#     dpkg-dev binutils (cargo-deb's dpkg-shlibdeps and strip, for
#     scripts/package.sh); runs `apt-get update` once, then
#     `apt-get install -y --no-install-recommends` of the missing ones
#   * the rustup components rustfmt and clippy
#   * cargo-fuzz and cargo-deb (cargo install --locked; cargo-deb builds in
#     about a minute; a failed install is a warning: the fuzz stage is then
#     skipped and the package stage fails saying what to install)
#   * bpffs on /sys/fs/bpf (a failure to mount is only a warning)
#   * the project venv .venv (git-ignored; the system Python is untouched)
#     with python/requirements-dev.txt: maturin, numpy, pytest,
#     scikit-learn, torch (PyPI's wheel pulls CUDA libraries: about 80 s and
#     5 GB the first time, reused after), matplotlib. The aggswitch package
#     itself is built into the venv by test.sh (build_python_package in lib.sh).
# Prints what it installed; on failure prints the installer's output and
# exits non-zero. Installing needs root (checking does not).

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly PACKAGES=(
    clang llvm libbpf-dev linux-libc-dev bpftool iproute2 ethtool
    iputils-ping python3 tcpdump iperf3 jq shellcheck dpkg-dev binutils
)
readonly COMPONENTS=(rustfmt clippy)

case "${1:-}" in
    -h|--help)
        usage
        exit 0 ;;
    "") ;;
    *) die "unknown argument '$1' (see --help)" ;;
esac

INSTALLED=()
OUT="$(mktemp "${TMPDIR:-/tmp}/agg-setup.XXXXXX")"
cleanup() {
    rm -f -- "$OUT"
}
trap cleanup EXIT

# run_quiet WHAT CMD...: run CMD with its output kept aside; on failure show it.
run_quiet() {
    local what="$1"
    shift
    if ! "$@" >"$OUT" 2>&1; then
        cat "$OUT" >&2
        die "$what failed: $*"
    fi
}

# --- Debian packages -------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
    pkg_installed "$p" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
    require_root "$@"
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    run_quiet "apt-get update" apt-get update -q
    run_quiet "apt-get install" apt-get install -y -q --no-install-recommends "${missing[@]}"
    for p in "${missing[@]}"; do
        pkg_installed "$p" || die "package $p is still not installed after apt-get install"
    done
    INSTALLED+=("${missing[@]}")
fi

# --- Rust toolchain components ----------------------------------------------
ensure_cargo_path
if command -v rustup >/dev/null 2>&1; then
    have="$(rustup component list --installed 2>/dev/null || true)"
    for c in "${COMPONENTS[@]}"; do
        if ! grep -q "^$c" <<<"$have"; then
            log "adding rustup component $c"
            run_quiet "rustup component add $c" rustup component add "$c"
            INSTALLED+=("rustup:$c")
        fi
    done
else
    # No rustup: the toolchain came some other way; just check the tools run.
    cargo fmt --version >/dev/null 2>&1 || die "cargo fmt not available and no rustup to add rustfmt"
    cargo clippy --version >/dev/null 2>&1 || die "cargo clippy not available and no rustup to add clippy"
fi

# --- cargo-fuzz (fuzz/) ---
# For test.sh's fuzz stage only: a failed install is a warning, not an error
# (the stage is then skipped).
if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz (cargo install cargo-fuzz --locked)"
    if cargo install cargo-fuzz --locked >"$OUT" 2>&1; then
        INSTALLED+=("cargo-fuzz")
    else
        tail -n 20 "$OUT" >&2
        warn "could not install cargo-fuzz; the fuzz stage of test.sh will be skipped"
    fi
fi
# --- end cargo-fuzz ---

# --- cargo-deb (scripts/package.sh, test.sh's package stage) ---
if ! cargo deb --version >/dev/null 2>&1; then
    log "installing cargo-deb (cargo install cargo-deb --locked, about a minute)"
    if cargo install cargo-deb --locked >"$OUT" 2>&1; then
        INSTALLED+=("cargo-deb")
    else
        tail -n 20 "$OUT" >&2
        warn "could not install cargo-deb; scripts/package.sh (test.sh's package stage) will fail without it"
    fi
fi

# --- the project venv (python/) ------------------------------------------------
readonly VENV="$REPO_ROOT/.venv"
readonly PY_REQUIREMENTS="$REPO_ROOT/python/requirements-dev.txt"
# Import names of what requirements-dev.txt installs (maturin is a command).
readonly PY_MODULES="numpy, pytest, sklearn, torch, matplotlib, lightning, transformers, accelerate"
if [[ ! -x "$VENV/bin/python" ]]; then
    log "making the project venv $VENV"
    if ! python3 -m venv "$VENV" >"$OUT" 2>&1; then
        # Debian's own python3 needs python3-venv for this.
        require_root "$@"
        run_quiet "apt-get install python3-venv" apt-get install -y -q --no-install-recommends python3-venv
        run_quiet "python3 -m venv" python3 -m venv "$VENV"
    fi
    INSTALLED+=("venv .venv")
fi
if ! "$VENV/bin/python" -c "import $PY_MODULES" >/dev/null 2>&1 || [[ ! -x "$VENV/bin/maturin" ]]; then
    log "installing python/requirements-dev.txt into .venv (torch: about 80 s and 5 GB the first time)"
    run_quiet "pip install" "$VENV/bin/pip" install -q -r "$PY_REQUIREMENTS"
    "$VENV/bin/python" -c "import $PY_MODULES" ||
        die "the venv still lacks one of: $PY_MODULES (see the pip output above)"
    INSTALLED+=("python/requirements-dev.txt into .venv")
fi

# --- bpffs --------------------------------------------------------------------
# (Check the type: /sys/fs/bpf may be a mount point of plain sysfs.)
if [[ "$(stat -f -c %T /sys/fs/bpf 2>/dev/null || true)" != bpf_fs ]]; then
    if [[ "$(id -u)" -eq 0 ]] && mkdir -p /sys/fs/bpf 2>/dev/null &&
        mount -t bpf bpf /sys/fs/bpf 2>/dev/null; then
        INSTALLED+=("bpffs on /sys/fs/bpf")
    else
        warn "could not mount bpffs on /sys/fs/bpf (only needed for pinning)"
    fi
fi

if ((${#INSTALLED[@]} > 0)); then
    log "installed: ${INSTALLED[*]}"
else
    log "everything already installed"
fi
