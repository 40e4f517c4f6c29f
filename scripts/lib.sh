# shellcheck shell=bash
#
# lib.sh: helpers shared by the scripts in scripts/. Sourced, never run:
#
#   # shellcheck source=scripts/lib.sh
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Defines: REPO_ROOT, log, warn, die, require_root, ensure_cargo_path,
# is_uint, uint_in_range, netns_exists, stop_pid, random_secret,
# start_switchd, pkg_installed, find_python, ensure_debian_packages,
# build_release, shape_worker_links,
# redirect_ingress_to_ifb,
# build_ecn_marker, shape_htb, shape_ecn_bpf,
# shape_ecn_red, setup_ecn_bottleneck, ecn_marker_map_id.

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
# READY_TIMEOUT (default 30) s until that switchd answers on its admin
# socket (`switchctl ready --pid`: the one named by ARGS' --config, asked
# with the switchctl next to SWITCHD_BIN, or $SWITCHCTL). If it exits or is
# not ready in time, print the log's tail and die (the caller's EXIT trap
# still stops SWITCHD_PID).
start_switchd() {
    local ns="$1" bin="$2" logfile="$3" deadline rc cfg="" ctl a prev=""
    shift 3
    for a in "$@"; do
        [[ "$prev" == --config ]] && cfg="$a"
        prev="$a"
    done
    [[ -n "$cfg" ]] || die "start_switchd: no --config in: $*"
    ctl="${SWITCHCTL:-$(dirname "$bin")/switchctl}"
    [[ -x "$ctl" ]] || die "start_switchd: $ctl not found (build with cargo build --release --workspace --bins)"
    # `ip netns exec` execs the command, so $! is switchd's own PID.
    ip netns exec "$ns" "$bin" "$@" >"$logfile" 2>&1 &
    SWITCHD_PID=$!
    deadline=$((SECONDS + ${READY_TIMEOUT:-30}))
    until "$ctl" --config "$cfg" ready --pid "$SWITCHD_PID" >/dev/null 2>"$logfile.ready"; do
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
            die "switchd was not ready within ${READY_TIMEOUT:-30} s: $(cat "$logfile.ready")"
        fi
        sleep 0.1
    done
    rm -f "$logfile.ready"
}

# pkg_installed PACKAGE: true when the Debian package is installed.
pkg_installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

# find_python: set PYTHON to an interpreter that imports matplotlib
# (Debian's python3-matplotlib installs into /usr/bin/python3's path, which
# may not be the first python3 on PATH); false when there is none.
PYTHON=""
export PYTHON  # read by the sourcing scripts
find_python() {
    local p
    for p in python3 /usr/bin/python3; do
        if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import matplotlib' >/dev/null 2>&1; then
            PYTHON="$(command -v "$p")"
            return 0
        fi
    done
    return 1
}

# ensure_debian_packages INSTALL PACKAGE...: apt-get install the PACKAGEs
# not installed (one apt-get update first), or die naming them when INSTALL
# is 0. python3-matplotlib counts as installed when find_python finds one;
# PYTHON is set on return.
ensure_debian_packages() {
    local install="$1" p
    local -a missing=()
    shift
    for p in "$@"; do
        if [[ "$p" == python3-matplotlib ]]; then
            find_python || missing+=("$p")
        elif ! pkg_installed "$p"; then
            missing+=("$p")
        fi
    done
    if ((${#missing[@]} > 0)); then
        ((install == 1)) || die "missing packages: ${missing[*]} (run without --no-install, or apt-get install them)"
        log "installing Debian packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >/dev/null || die "apt-get update failed"
        apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
            die "apt-get install ${missing[*]} failed"
    fi
    if [[ " $* " == *" python3-matplotlib "* ]]; then
        find_python || die "no python3 with matplotlib (apt-get install python3-matplotlib)"
    fi
}

# stop_testbed_processes PREFIX WORKERS: stop, by PID, anything still running
# inside the testbed's namespaces PREFIX-sw and PREFIX-w0..WORKERS-1 (e.g. a
# rank whose `timeout` wrapper was stopped): TERM, half a second, KILL.
stop_testbed_processes() {
    local prefix="$1" workers="$2" ns pid sig i
    local -a spaces=("$prefix-sw")
    for ((i = 0; i < workers; i++)); do spaces+=("$prefix-w$i"); done
    for sig in TERM KILL; do
        for ns in "${spaces[@]}"; do
            netns_exists "$ns" || continue
            for pid in $(ip netns pids "$ns" 2>/dev/null); do
                kill -"$sig" "$pid" 2>/dev/null || true
            done
        done
        [[ "$sig" == KILL ]] || sleep 0.5
    done
}

# set_worker_tx PREFIX WORKERS on|off: transmit checksum offload (and with
# it TSO) of every worker's eth0. testbed.sh turns it off, so that the
# switch sees complete UDP checksums as from a real NIC; on veth that also
# costs TCP its 64 KB segments, which a real NIC would keep, so the TCP
# peers (OpenMPI, gloo) are measured with it on. Dies if ethtool fails: a
# peer measured without the offload it was meant to have is a wrong figure.
set_worker_tx() {
    local prefix="$1" workers="$2" mode="$3" i
    for ((i = 0; i < workers; i++)); do
        ip netns exec "$prefix-w$i" ethtool -K eth0 tx "$mode" >/dev/null ||
            die "ethtool -K eth0 tx $mode failed in $prefix-w$i"
    done
}

# wait_ranks: wait for the caller's RANK_PIDS (one per rank, in rank order;
# TIMEOUT names the per-configuration limit in the message); when one fails,
# stop the others (they would wait on it until the timeout). Returns 0 when
# all exited with 0; RANK_PIDS is empty afterwards.
wait_ranks() {
    local i rc left failed=0
    local -a done_=()
    left=${#RANK_PIDS[@]}
    while ((left > 0)); do
        for i in "${!RANK_PIDS[@]}"; do
            [[ -z "${done_[i]:-}" ]] || continue
            kill -0 "${RANK_PIDS[i]}" 2>/dev/null && continue
            rc=0
            wait "${RANK_PIDS[i]}" || rc=$?
            done_[i]=$rc
            left=$((left - 1))
            if [[ "$rc" -ne 0 ]]; then
                warn "rank $i exited with status $rc$( [[ "$rc" -eq 124 ]] && echo " (timeout after $TIMEOUT s)")"
                failed=1
            fi
        done
        if ((failed && left > 0)); then
            for i in "${!RANK_PIDS[@]}"; do
                [[ -n "${done_[i]:-}" ]] || stop_pid "${RANK_PIDS[i]}" 5
            done
            break
        fi
        ((left > 0)) && sleep 0.2
    done
    RANK_PIDS=()
    return "$failed"
}

# --- the torch benchmarks (scripts/bench_train.sh, scripts/bench_fsdp.sh) ---------------
# They share what they need, their run folder, their clean-up and their
# snapshots. Callers set PREFIX and WORKERS (the testbed) and use RANK_PIDS,
# SWITCHD_PID and TESTBED_MADE as cleanup_torch_bench reads them.
readonly TORCH_BENCH_PACKAGES=(clang llvm libbpf-dev linux-libc-dev iproute2 ethtool gcc time)
TORCH_BENCH_VENV="$REPO_ROOT/.venv"
# AGGSWITCH_BENCH_PYTHON: another interpreter that imports torch, sklearn and
# aggswitch (e.g. a machine's own torch install with PYTHONPATH=python).
TORCH_BENCH_PY="${AGGSWITCH_BENCH_PYTHON:-$TORCH_BENCH_VENV/bin/python}"

# prepare_torch_bench NAME [BUILD]: check the project venv (torch, scikit-learn,
# aggswitch; matplotlib installed into it when missing, for the plot); unless
# BUILD is 0 (the scripts' --no-build: binaries built elsewhere and copied to
# target/release), install the Debian packages that are missing and build;
# make the run folder
# results/NAME-STAMP with a private copy of switchd (so that a rebuild
# meanwhile cannot change what is measured). Sets STAMP, RUN and SWITCHD.
prepare_torch_bench() {
    local name="$1" build="${2:-1}" c b py="$TORCH_BENCH_PY" venv="$TORCH_BENCH_VENV"
    [[ -x "$py" ]] || die "no Python at $py: run scripts/setup.sh (or set AGGSWITCH_BENCH_PYTHON)"
    "$py" -c 'import torch, sklearn, aggswitch.torch' 2>/dev/null ||
        die "$py cannot import torch, scikit-learn or aggswitch ($py -c 'import torch, sklearn, aggswitch.torch' fails): run scripts/setup.sh"
    if ! "$py" -c 'import matplotlib' 2>/dev/null; then
        log "installing matplotlib into $venv (for the plot)"
        "$py" -m pip install -q matplotlib >/dev/null ||
            warn "pip install matplotlib failed; the plot will be skipped"
    fi
    if [[ "$build" -eq 1 ]]; then
        ensure_debian_packages 1 "${TORCH_BENCH_PACKAGES[@]}"
        build_release
    else
        for b in switchd switchctl; do
            [[ -x "$REPO_ROOT/target/release/$b" ]] ||
                die "--no-build: target/release/$b missing (build with: cargo build --release --workspace --bins)"
        done
    fi
    for c in tc ip timeout /usr/bin/time; do
        command -v "$c" >/dev/null 2>&1 || die "$c not found (apt-get install iproute2 coreutils time)"
    done
    STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
    RUN="$REPO_ROOT/results/$name-$STAMP"
    mkdir -p "$RUN/bin"
    # switchctl beside switchd: start_switchd asks it whether switchd is ready.
    cp "$REPO_ROOT/target/release/switchd" "$REPO_ROOT/target/release/switchctl" "$RUN/bin/"
    # shellcheck disable=SC2034  # read by the sourcing script
    SWITCHD="$RUN/bin/switchd"
}

# cleanup_torch_bench: the EXIT trap of the torch benchmarks: stop the ranks
# and switchd by PID, anything left in the testbed's namespaces, remove the
# testbed and the private binaries; keeps the exit status.
cleanup_torch_bench() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${RANK_PIDS[@]}"; do
        stop_pid "$pid" 5
    done
    stop_pid "$SWITCHD_PID"
    if [[ "$TESTBED_MADE" -eq 1 ]]; then
        stop_testbed_processes "$PREFIX" "$WORKERS"
        bash "$REPO_ROOT/scripts/testbed.sh" down --prefix "$PREFIX" >/dev/null 2>&1 ||
            warn "testbed down failed; run: scripts/testbed.sh down --prefix $PREFIX"
    fi
    [[ -n "${RUN:-}" ]] && rm -rf -- "${RUN:?}/bin"
    [[ "$rc" -eq 0 ]] || log "failed (status $rc); logs in ${RUN:-results/}"
    exit "$rc"
}

# snapshot FILE: (the torch benchmarks) /proc/stat's cpu line, the load average and every shaper's
# counters (tc -s -j), as JSON lines; the report takes the differences.
snapshot() {
    local i
    {
        printf '{"t": %s, "stat": "%s", "loadavg": "%s"}\n' "$(date +%s.%N)" \
            "$(head -n 1 /proc/stat)" "$(cut -d' ' -f1-3 /proc/loadavg)"
        for ((i = 0; i < WORKERS; i++)); do
            printf '{"kind": "worker_egress", "rank": %d, "tc": %s}\n' "$i" \
                "$(ip netns exec "$PREFIX-w$i" tc -s -j qdisc show dev eth0)"
            printf '{"kind": "switch_port_egress", "rank": %d, "tc": %s}\n' "$i" \
                "$(ip netns exec "$PREFIX-sw" tc -s -j qdisc show dev "sw-w$i")"
            if ip -n "$PREFIX-w$i" link show ifb0 >/dev/null 2>&1; then
                printf '{"kind": "worker_ingress_ifb", "rank": %d, "tc": %s}\n' "$i" \
                    "$(ip netns exec "$PREFIX-w$i" tc -s -j qdisc show dev ifb0)"
            fi
        done
    } >"$1"
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

# redirect_ingress_to_ifb NS DEV IFB: make the ifb device IFB in NS and
# send everything DEV receives through IFB's egress first, so that a qdisc on
# IFB shapes DEV's ingress (also frames an AF_XDP socket sent from the other
# end, which no egress qdisc there sees).
redirect_ingress_to_ifb() {
    local ns="$1" dev="$2" ifb="$3"
    ip -n "$ns" link add "$ifb" type ifb
    ip -n "$ns" link set "$ifb" up
    # clsact rather than ingress, so that an egress filter (shape_ecn_bpf)
    # can share the device.
    ip netns exec "$ns" tc qdisc replace dev "$dev" clsact
    if ! ip netns exec "$ns" tc filter add dev "$dev" ingress protocol all prio 1 \
        matchall action mirred egress redirect dev "$ifb" 2>/dev/null; then
        # No cls_matchall in this kernel: a u32 filter that matches all.
        ip netns exec "$ns" tc filter add dev "$dev" ingress protocol all prio 1 \
            u32 match u32 0 0 action mirred egress redirect dev "$ifb"
    fi
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
        # A second call (another rate) keeps the redirect it made.
        ip -n "$ns" link show ifb0 >/dev/null 2>&1 || redirect_ingress_to_ifb "$ns" eth0 ifb0
        ip netns exec "$ns" tc qdisc replace dev ifb0 root tbf "$@"
    done
}

# unshape_worker_links PREFIX WORKERS: remove the tbf qdiscs that
# shape_worker_links set (the ifb redirect stays, unshaped); nothing to do on
# links never shaped.
unshape_worker_links() {
    local prefix="$1" workers="$2" i ns
    for ((i = 0; i < workers; i++)); do
        ns="$prefix-w$i"
        ip netns exec "$prefix-sw" tc qdisc del dev "sw-w$i" root 2>/dev/null || true
        ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
        ip netns exec "$ns" tc qdisc del dev ifb0 root 2>/dev/null || true
    done
}

# write_mpi_hosts WORKERS HOSTFILE RSH MPI_TMP: let mpirun, started in worker
# 0's namespace, run one rank in each of the first WORKERS workers'
# namespaces of the testbed testbed_up made (`tb`) as if they were remote
# hosts: write a
# HOSTFILE of the worker addresses and RSH, an ssh stand-in for
# `--mca plm_rsh_agent RSH` that skips ssh options, maps the host address to
# its namespace and runs the command there. Every namespace has the same
# hostname, so OpenMPI's session directories (TMPDIR/ompi.HOSTNAME.UID/...)
# would collide and race: each "host" gets its own TMPDIR under MPI_TMP
# (short paths: PMIx puts Unix sockets in there), mpirun itself
# MPI_TMP/mpirun. The caller removes MPI_TMP.
write_mpi_hosts() {
    local workers="$1" hostfile="$2" rsh="$3" mpi_tmp="$4" i addr cases=""
    : >"$hostfile"
    for ((i = 0; i < workers; i++)); do
        addr="$(tb "worker_${i}_addr")"
        cases+="    $addr) ns=$(tb "worker_${i}_ns") ;;"$'\n'
        echo "$addr slots=1" >>"$hostfile"
    done
    mkdir -p "$mpi_tmp/mpirun"
    cat >"$rsh" <<EOF
#!/bin/sh
# ssh stand-in for mpirun (--mca plm_rsh_agent), written by scripts/lib.sh
# write_mpi_hosts: skip ssh options, map the host address to its network
# namespace, run the command there with a TMPDIR of its own.
while [ \$# -gt 0 ]; do
    case "\$1" in
        -[BbcDEeFIiJLlmOopQRSWw]) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
[ \$# -ge 2 ] || { echo "netns-ssh: usage: [OPTIONS] HOST COMMAND..." >&2; exit 255; }
host="\$1"
shift
case "\$host" in
${cases}    *) echo "netns-ssh: unknown host \$host" >&2; exit 255 ;;
esac
TMPDIR="$mpi_tmp/\$ns"
export TMPDIR
mkdir -p "\$TMPDIR" || exit 255
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
    chmod 755 "$rsh"
}

# run_mpirun PREFIX WORKERS HOSTFILE RSH MPI_TMP PROGRAM ARGS...: exec mpirun
# PROGRAM over the worker namespaces of write_mpi_hosts, TCP BTL on eth0
# (call it in a subshell, in the background to bound its time).
run_mpirun() {
    local prefix="$1" workers="$2" hostfile="$3" rsh="$4" mpi_tmp="$5"
    shift 5
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # Every "host" has the same hostname here: keep PMIx off shared memory.
    export PMIX_MCA_gds=hash
    export TMPDIR="$mpi_tmp/mpirun"
    exec ip netns exec "$prefix-w0" mpirun --allow-run-as-root \
        -np "$workers" --hostfile "$hostfile" \
        --mca plm_rsh_agent "$rsh" \
        --mca btl tcp,self --mca btl_tcp_if_include eth0 \
        --mca oob_tcp_if_include eth0 --bind-to none \
        "$@"
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

# testbed_up ENV_FILE ARGS...: scripts/testbed.sh up ARGS --print-env, its
# key=value description of the testbed (addresses, ports, namespaces) into
# ENV_FILE and TESTBED_ENV set to it; the summary goes to stderr. Scripts
# read addresses with `tb KEY` instead of repeating the address plan.
TESTBED_ENV=""
testbed_up() {
    local env_file="$1"
    shift
    bash "$REPO_ROOT/scripts/testbed.sh" up "$@" --print-env >"$env_file" ||
        die "scripts/testbed.sh up $* failed"
    TESTBED_ENV="$env_file"
}

# tb KEY: a value of the testbed that testbed_up made (e.g. switch_addr,
# subnet, worker_2_addr, worker_2_ns).
tb() {
    [[ -n "$TESTBED_ENV" ]] || die "tb $1: no testbed (bring it up with testbed_up)"
    awk -F= -v k="$1" '$1 == k { sub(/^[^=]*=/, ""); print; found = 1; exit }
        END { exit !found }' "$TESTBED_ENV" || die "the testbed has no '$1' (see $TESTBED_ENV)"
}

# write_testbed_switchd_config FILE WRITER WORKERS SECRET [SWITCH_LINE...]:
# a switchd config for the testbed testbed_up made, written by `switchd
# testbed-config` (switchd's typed sections; addresses from the testbed):
# its worker ports, its switch address, and one job (id 1, WORKERS ranks,
# the first WORKERS workers, SECRET, 256 slots). SWITCH_LINEs (e.g.
# 'admin_socket = "/tmp/x.sock"') set [switch] keys; one that starts with
# "job:" sets a job key (e.g. 'job:dtype = "bf16"'); a key switchd does not
# know is an error. WRITER names the script in the file's first line. Mode
# 0600: it holds the secret. Uses $SWITCHD (default target/release/switchd).
write_testbed_switchd_config() {
    local file="$1" writer="$2" workers="$3" secret="$4" line key
    shift 4
    local -a sets=()
    for line in "$@"; do
        key="switch."
        if [[ "$line" == job:* ]]; then
            key="job.1."
            line="${line#job:}"
        fi
        [[ "$line" == *=* ]] || die "write_testbed_switchd_config: '$line' is not KEY = VALUE"
        sets+=(--set "$key$(sed -E 's/^ *([^ =]+) *= */\1=/' <<<"$line")")
    done
    AGGSWITCH_TESTBED_SECRET="$secret" "${SWITCHD:-$REPO_ROOT/target/release/switchd}" \
        testbed-config --env "$TESTBED_ENV" --out "$file" --writer "$writer" \
        --job "1:0-$((workers - 1)):env:AGGSWITCH_TESTBED_SECRET" "${sets[@]}" ||
        die "switchd testbed-config failed for $file"
}

# --- a shaped, CE-marking bottleneck (scripts/bench fairness and tree, through scripts/net.sh) ----------

# build_ecn_marker DIR MIN_BYTES MAX_BYTES: compile the CE marker
# (scripts/bpf/ecn_mark.bpf.c: marks ECT packets by the depth of the
# device's root qdisc, between MIN_BYTES and MAX_BYTES) into
# DIR/ecn_mark.o, compiler output in DIR/ecn_mark.build.log. Fails when
# clang or the headers are missing.
build_ecn_marker() {
    local dir="$1" min="$2" max="$3"
    clang -O2 -g -target bpf -I"/usr/include/$(uname -m)-linux-gnu" \
        -DMIN_BYTES="${min}U" -DMAX_BYTES="${max}U" \
        -c "$REPO_ROOT/scripts/bpf/ecn_mark.bpf.c" -o "$dir/ecn_mark.o" \
        >"$dir/ecn_mark.build.log" 2>&1
}

# shape_htb NS DEV RATE_MBIT: DEV's egress in NS limited to RATE_MBIT by an
# HTB class with a plain FIFO (10000 packets) under it.
shape_htb() {
    local ns="$1" dev="$2" rate="$3"
    tc -n "$ns" qdisc replace dev "$dev" root handle 1: htb default 1 r2q 100
    tc -n "$ns" class replace dev "$dev" parent 1: classid 1:1 htb \
        rate "${rate}mbit" ceil "${rate}mbit" quantum 60000
    tc -n "$ns" qdisc replace dev "$dev" parent 1:1 handle 10: pfifo limit 10000
}

# shape_ecn_bpf NS DEV RATE_MBIT OBJ LOG: shape_htb, and the marker OBJ
# (build_ecn_marker) on DEV's clsact egress hook, before the HTB.
shape_ecn_bpf() {
    local ns="$1" dev="$2" rate="$3" obj="$4" logfile="$5"
    shape_htb "$ns" "$dev" "$rate"
    tc -n "$ns" qdisc replace dev "$dev" clsact
    tc -n "$ns" filter replace dev "$dev" egress pref 1 handle 1 bpf da \
        obj "$obj" sec tc >"$logfile" 2>&1
}

# shape_ecn_red NS DEV RATE_MBIT MIN_BYTES MAX_BYTES LOG: HTB at RATE_MBIT
# with RED and ecn under it (the kernel's own marker, on the average queue).
shape_ecn_red() {
    local ns="$1" dev="$2" rate="$3" min="$4" max="$5" logfile="$6"
    local burst=$(((2 * min + max) / (3 * 1514) + 1))
    tc -n "$ns" filter del dev "$dev" egress 2>/dev/null || true
    tc -n "$ns" qdisc replace dev "$dev" root handle 1: htb default 1 r2q 100
    tc -n "$ns" class replace dev "$dev" parent 1: classid 1:1 htb \
        rate "${rate}mbit" ceil "${rate}mbit" quantum 60000
    tc -n "$ns" qdisc replace dev "$dev" parent 1:1 handle 10: red limit 16000000 \
        min "$min" max "$max" avpkt 1514 burst "$burst" \
        bandwidth "${rate}mbit" probability 1.0 ecn 2>"$logfile"
}

# setup_ecn_bottleneck DIR RATE_MBIT MIN_BYTES MAX_BYTES NS:DEV...: make the
# egress of every NS:DEV a RATE_MBIT shaper whose FIFO marks CE from MIN to
# MAX bytes of queue: the tc-BPF marker (kernel 6.2+ with BTF and
# bpf_cast_to_kern_ctx) on every device or, when it does not build or load
# on one, RED with ecn on every device. Sets ECN_MARKER to bpf or red; build
# and tc logs go to DIR. Dies when neither works.
ECN_MARKER=""
export ECN_MARKER  # read by the sourcing scripts
setup_ecn_bottleneck() {
    local dir="$1" rate="$2" min="$3" max="$4" nd ns dev
    shift 4
    ECN_MARKER=""
    if build_ecn_marker "$dir" "$min" "$max"; then
        ECN_MARKER=bpf
        for nd in "$@"; do
            ns="${nd%%:*}" dev="${nd#*:}"
            if ! shape_ecn_bpf "$ns" "$dev" "$rate" "$dir/ecn_mark.o" "$dir/tc-bpf-$ns-$dev.log"; then
                warn "the tc-BPF marker did not load on $ns $dev ($(tail -n 3 "$dir/tc-bpf-$ns-$dev.log" | tr '\n' ' ')); trying RED"
                ECN_MARKER=""
                break
            fi
        done
    else
        warn "the tc-BPF marker did not build (see $dir/ecn_mark.build.log); trying RED"
    fi
    if [[ -z "$ECN_MARKER" ]]; then
        ECN_MARKER=red
        for nd in "$@"; do
            ns="${nd%%:*}" dev="${nd#*:}"
            shape_ecn_red "$ns" "$dev" "$rate" "$min" "$max" "$dir/tc-red-$ns-$dev.log" ||
                die "neither the tc-BPF marker (kernel 6.2+ with BTF) nor sch_red (tc qdisc red on $ns $dev: $(cat "$dir/tc-red-$ns-$dev.log")) is available: no ECN-marking bottleneck"
        done
    fi
}

# ecn_marker_map_id NS DEV: the id of the ecn_counters map of the marker on
# DEV's egress in NS (dump it with `bpftool map dump id ID -j`).
ecn_marker_map_id() {
    local ns="$1" dev="$2" prog
    prog="$(tc -n "$ns" filter show dev "$dev" egress | sed -n 's/.* id \([0-9]*\) .*/\1/p' | head -n 1)"
    [[ -n "$prog" ]] || return 1
    bpftool prog show id "$prog" -j | python3 -c 'import json, sys; print(json.load(sys.stdin)["map_ids"][0])'
}

# usage: prints the calling script's header comment (its --help), from the
# third line to the first line that is not a comment.
usage() {
    awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}
