# shellcheck shell=bash
#
# lib.sh: helpers shared by the scripts in scripts/. Sourced, never run:
#
#   # shellcheck source=scripts/lib.sh
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Defines: REPO_ROOT, log, warn, die, require_root, ensure_cargo_path,
# is_uint, uint_in_range, netns_exists, stop_pid, random_secret,
# start_switchd, pkg_installed, build_release, shape_worker_links.

# Refuse to be run directly.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    echo "lib.sh is sourced by the other scripts, not run" >&2
    exit 2
fi

# The repository root (the folder holding scripts/).
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export REPO_ROOT

# The calling script's name, for messages ("testbed.sh: ...").
SCRIPT_NAME="$(basename "$0")"

log() {
    printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2
}

warn() {
    printf '%s: warning: %s\n' "$SCRIPT_NAME" "$*" >&2
}

die() {
    printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2
    exit 1
}

# require_root [ARGS...]: exit with a clear message unless running as root.
# ARGS are the caller's arguments, repeated in the suggested command line.
require_root() {
    if [[ "$(id -u)" -ne 0 ]]; then
        local rel="scripts/$SCRIPT_NAME"
        [[ "$SCRIPT_NAME" == run ]] && rel=".ci/run"
        die "run as root: sudo $rel${*:+ $*}"
    fi
}

# ensure_cargo_path: put ~/.cargo/bin on PATH when cargo is not found.
ensure_cargo_path() {
    if ! command -v cargo >/dev/null 2>&1; then
        if [[ -f "${HOME:-/root}/.cargo/env" ]]; then
            # shellcheck source=/dev/null
            source "${HOME:-/root}/.cargo/env"
        elif [[ -x "${HOME:-/root}/.cargo/bin/cargo" ]]; then
            PATH="${HOME:-/root}/.cargo/bin:$PATH"
            export PATH
        fi
    fi
    command -v cargo >/dev/null 2>&1 ||
        die "cargo not found (looked on PATH and in ~/.cargo); install the Rust toolchain with rustup"
}

# is_uint STRING: true when STRING is a non-negative decimal integer.
is_uint() {
    [[ "$1" =~ ^[0-9]+$ ]]
}

# uint_in_range STRING MIN MAX: true when STRING is an integer in MIN..MAX.
uint_in_range() {
    is_uint "$1" && ((${#1} <= 9 && 10#$1 >= $2 && 10#$1 <= $3))
}

# jq definitions for table cells with a fixed number of decimals (f1, f2,
# f3: 1, 2, 3 decimals, "0.50" rather than jq's "0.5"); prefix a jq program
# with "$JQ_DECIMALS".
# shellcheck disable=SC2034  # used by the scripts that source this file
JQ_DECIMALS='
  def fx($d; $z): (. * $d | round) as $m
          | ($m / $d | floor | tostring) + "." + (($z + ($m % $d | tostring)) | .[-($z | length):]);
  def f1: fx(10; "0");
  def f2: fx(100; "00");
  def f3: fx(1000; "000");
'

# netns_exists NAME: true when the named network namespace exists.
netns_exists() {
    local name _rest
    while read -r name _rest; do
        [[ "$name" == "$1" ]] && return 0
    done < <(ip netns list 2>/dev/null)
    return 1
}

# stop_pid PID [GRACE_SECONDS]: SIGTERM, then SIGKILL after the grace period
# (default STOP_TIMEOUT, else 15 s); reaps PID (a child of this shell) and
# leaves its exit status in STOP_RC. An empty PID is a no-op. Only ever
# given PIDs the calling script started itself.
STOP_RC=0
export STOP_RC  # read by the sourcing scripts
stop_pid() {
    local pid="$1" grace="${2:-${STOP_TIMEOUT:-15}}" i
    STOP_RC=0
    [[ -n "$pid" ]] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        warn "pid $pid ignored SIGTERM for $grace s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || STOP_RC=$?
}

# wait_workers N TIMEOUT: waits for the N background workers whose PIDs are
# WORKER_PIDS[0..N-1], recording each exit status (or "timeout") in the
# caller's associative array STATUS; stops, by PID, those still running after
# TIMEOUT seconds. Empties WORKER_PIDS.
wait_workers() {
    local n="$1" timeout="$2" deadline remaining i rc
    deadline=$((SECONDS + timeout))
    remaining=$n
    while ((remaining > 0)); do
        for ((i = 0; i < n; i++)); do
            [[ -z "${STATUS[$i]:-}" ]] || continue
            if ! kill -0 "${WORKER_PIDS[i]}" 2>/dev/null; then
                rc=0
                wait "${WORKER_PIDS[i]}" || rc=$?
                STATUS[$i]=$rc
                unset 'WORKER_PIDS[i]'
                remaining=$((remaining - 1))
            fi
        done
        ((remaining > 0)) || break
        if ((SECONDS >= deadline)); then
            warn "workers still running after $timeout s; stopping them"
            for ((i = 0; i < n; i++)); do
                if [[ -z "${STATUS[$i]:-}" ]]; then
                    stop_pid "${WORKER_PIDS[i]}"
                    STATUS[$i]="timeout"
                fi
            done
            break
        fi
        sleep 0.1
    done
    WORKER_PIDS=()
}

# random_secret: print a fresh job secret (32 random bytes as 64 hex digits).
random_secret() {
    local s
    s="$(od -An -v -tx1 -N32 /dev/urandom | tr -d ' \n')"
    [[ "${#s}" -eq 64 ]] || die "could not make a secret from /dev/urandom"
    printf '%s' "$s"
}

# start_switchd NETNS SWITCHD_BIN LOG [ARGS...]: start `SWITCHD_BIN ARGS...`
# inside NETNS with output to LOG, set SWITCHD_PID, and wait up to
# READY_TIMEOUT (default 30) s for its "switchd ready" line. If it exits or
# is not ready in time, print the log's tail and die (the caller's EXIT trap
# still stops SWITCHD_PID).
start_switchd() {
    local ns="$1" bin="$2" logfile="$3" deadline rc
    shift 3
    # `ip netns exec` execs the command, so $! is switchd's own PID.
    ip netns exec "$ns" "$bin" "$@" >"$logfile" 2>&1 &
    SWITCHD_PID=$!
    deadline=$((SECONDS + ${READY_TIMEOUT:-30}))
    until grep -qF "switchd ready" "$logfile" 2>/dev/null; do
        if ! kill -0 "$SWITCHD_PID" 2>/dev/null; then
            rc=0
            wait "$SWITCHD_PID" || rc=$?
            SWITCHD_PID=""
            echo "---- switchd log ($logfile) ----" >&2
            tail -n 40 "$logfile" >&2
            die "switchd exited with status $rc before it was ready"
        fi
        if ((SECONDS >= deadline)); then
            echo "---- switchd log ($logfile) ----" >&2
            tail -n 40 "$logfile" >&2
            die "switchd did not log 'switchd ready' within ${READY_TIMEOUT:-30} s"
        fi
        sleep 0.1
    done
}

# pkg_installed PACKAGE: true when the Debian package is installed.
pkg_installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

# build_release: `cargo build --release --workspace --bins` in the repository
# and check that target/release/{switchd,worker,switchctl} are there.
build_release() {
    local b
    ensure_cargo_path
    log "building (cargo build --release --workspace --bins)"
    (cd "$REPO_ROOT" && cargo build --release --workspace --bins)
    for b in switchd worker switchctl aggblast; do
        [[ -x "$REPO_ROOT/target/release/$b" ]] ||
            die "target/release/$b missing (build with: cargo build --release --workspace --bins)"
    done
}

# shape_worker_links PREFIX WORKERS TBF_ARGS...: limit every worker link of
# the testbed PREFIX (scripts/testbed.sh) both ways with `tbf TBF_ARGS`
# (e.g. rate 1gbit burst 256kb latency 50ms): on every worker's eth0 egress
# (worker -> switch), on every switch port sw-wI egress (bridged traffic ->
# worker), and on every worker's eth0 ingress through an ifb device ifb0,
# because switchd's AF_XDP transmit bypasses the qdisc of sw-wI. Used by
# bench.sh and bench_train.sh; the testbed's removal removes it all.
shape_worker_links() {
    local prefix="$1" workers="$2" i ns
    shift 2
    for ((i = 0; i < workers; i++)); do
        ns="$prefix-w$i"
        ip netns exec "$prefix-sw" tc qdisc replace dev "sw-w$i" root tbf "$@"
        ip netns exec "$ns" tc qdisc replace dev eth0 root tbf "$@"
        ip -n "$ns" link add ifb0 type ifb
        ip -n "$ns" link set ifb0 up
        ip netns exec "$ns" tc qdisc add dev eth0 handle ffff: ingress
        if ! ip netns exec "$ns" tc filter add dev eth0 parent ffff: protocol all prio 1 \
            matchall action mirred egress redirect dev ifb0 2>/dev/null; then
            # No cls_matchall in this kernel: a u32 filter that matches all.
            ip netns exec "$ns" tc filter add dev eth0 parent ffff: protocol all prio 1 \
                u32 match u32 0 0 action mirred egress redirect dev ifb0
        fi
        ip netns exec "$ns" tc qdisc replace dev ifb0 root tbf "$@"
    done
}

# The project venv's python (scripts/setup.sh makes the venv).
VENV_PYTHON="$REPO_ROOT/.venv/bin/python"
export VENV_PYTHON

# build_python_package: build the aggswitch package (python/, release) and
# install it into the project venv, editable (maturin develop).
build_python_package() {
    [[ -x "$VENV_PYTHON" && -x "$REPO_ROOT/.venv/bin/maturin" ]] ||
        die "no project venv with maturin in $REPO_ROOT/.venv: run scripts/setup.sh"
    (cd "$REPO_ROOT/python" &&
        VIRTUAL_ENV="$REPO_ROOT/.venv" PATH="$REPO_ROOT/.venv/bin:$PATH" \
            maturin develop --release --quiet) ||
        die "building the aggswitch package failed (maturin develop --release in python/)"
    "$VENV_PYTHON" -c "import aggswitch" ||
        die "aggswitch does not import after building it"
}

# write_testbed_switchd_config FILE WRITER WORKERS SECRET [SWITCH_LINE...]:
# write a switchd config for a scripts/testbed.sh testbed: the worker ports
# sw-w0..sw-w(WORKERS-1), switch address 198.18.0.1, aggregation port 48879,
# and one job (id 1, WORKERS ranks from 198.18.0.0/24, SECRET, 256 slots).
# SWITCH_LINEs (e.g. 'admin_socket = "/tmp/x.sock"') are added to [switch].
# WRITER names the script in the file's first line. Mode 0600: it holds
# the secret.
write_testbed_switchd_config() {
    local file="$1" writer="$2" workers="$3" secret="$4" i
    shift 4
    (
        umask 077
        {
            echo "# Written by $writer."
            echo "[switch]"
            printf 'ports = ['
            for ((i = 0; i < workers; i++)); do
                printf '%s"sw-w%d"' "$( ((i > 0)) && echo ', ')" "$i"
            done
            echo "]"
            echo 'addresses = ["198.18.0.1"]'
            echo "agg_port = 48879"
            if (($# > 0)); then printf '%s\n' "$@"; fi
            echo
            echo "[[job]]"
            echo "id = 1"
            echo "n_workers = $workers"
            echo 'allowed_sources = ["198.18.0.0/24"]'
            echo "secret = \"$secret\""
            echo "pool_slots = 256"
        } >"$file"
    )
    chmod 600 "$file"
}
