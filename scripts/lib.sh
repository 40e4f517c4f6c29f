# shellcheck shell=bash
#
# lib.sh: helpers shared by the scripts in scripts/. Sourced, never run:
#
#   # shellcheck source=scripts/lib.sh
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Defines: REPO_ROOT, log, warn, die, require_root, ensure_cargo_path,
# is_uint, uint_in_range, netns_exists, pkg_installed, set_worker_tx,
# redirect_ingress_to_ifb, shape_worker_links, unshape_worker_links,
# write_mpi_hosts, run_mpirun, build_python_package, tb, build_ecn_marker,
# shape_htb, shape_ecn_bpf, shape_ecn_red, setup_ecn_bottleneck,
# ecn_marker_map_id, usage.
# The benchmarks and the demos (scripts/bench, scripts/demo: bench/harness/)
# use the ip/tc ones through scripts/net.sh.

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

# pkg_installed PACKAGE: true when the Debian package is installed.
pkg_installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
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

# ingress_ifb0 NS: NS's eth0 ingress through the ifb device ifb0, made the
# first time (later calls keep the redirect made).
ingress_ifb0() {
    ip -n "$1" link show ifb0 >/dev/null 2>&1 || redirect_ingress_to_ifb "$1" eth0 ifb0
}

# shape_worker_links PREFIX WORKERS TBF_ARGS...: limit every worker link of
# the testbed PREFIX (scripts/testbed.sh) both ways with `tbf TBF_ARGS`
# (e.g. rate 1gbit burst 256kb latency 50ms): on every worker's eth0 egress
# (worker -> switch), on every switch port sw-wI egress (bridged traffic ->
# worker), and on every worker's eth0 ingress through an ifb device ifb0,
# because switchd's AF_XDP transmit bypasses the qdisc of sw-wI. Used by
# scripts/bench (through scripts/net.sh); the testbed's removal removes it all.
shape_worker_links() {
    local prefix="$1" workers="$2" i ns
    shift 2
    for ((i = 0; i < workers; i++)); do
        ns="$prefix-w$i"
        ip netns exec "$prefix-sw" tc qdisc replace dev "sw-w$i" root tbf "$@"
        ip netns exec "$ns" tc qdisc replace dev eth0 root tbf "$@"
        # A second call (another rate) keeps the redirect it made.
        ingress_ifb0 "$ns"
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

# slow_ingress NS MBIT: everything into NS's eth0 goes through a tbf of
# MBIT Mbit/s with a deep queue (200 ms; on an ifb device ifb0, made if
# missing): a bottleneck that builds a queue on the way to one worker.
# It replaces a shaper on ifb0. unslow_ingress NS removes it.
slow_ingress() {
    local ns="$1" mbit="$2"
    ingress_ifb0 "$ns"
    ip netns exec "$ns" tc qdisc replace dev ifb0 root tbf rate "${mbit}mbit" burst 64kb latency 200ms
}

unslow_ingress() {
    ip netns exec "$1" tc qdisc del dev ifb0 root 2>/dev/null || true
}

# write_mpi_hosts WORKERS HOSTFILE RSH MPI_TMP: let mpirun, started in worker
# 0's namespace, run one rank in each of the first WORKERS workers'
# namespaces of the testbed TESTBED_ENV describes (`tb`) as if they were remote
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

# tb KEY: a value of the testbed whose key=value description
# (`scripts/testbed.sh up --print-env`) is in the file TESTBED_ENV (net.sh
# mpi-hosts sets it), e.g. worker_2_addr, worker_2_ns.
TESTBED_ENV=""
tb() {
    [[ -n "$TESTBED_ENV" ]] || die "tb $1: no testbed (TESTBED_ENV is not set)"
    awk -F= -v k="$1" '$1 == k { sub(/^[^=]*=/, ""); print; found = 1; exit }
        END { exit !found }' "$TESTBED_ENV" || die "the testbed has no '$1' (see $TESTBED_ENV)"
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
