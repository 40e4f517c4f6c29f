#!/usr/bin/env bash
#
# bench.sh: all-reduce through the switch against OpenMPI's MPI_Allreduce, on
# the same veth testbed, in the same run, on unlimited links and on links
# limited to 1 Gbit/s each way. One command from a fresh clone.
#
# Usage:
#   sudo scripts/bench.sh [--mib 64] [--repeats 5] [--quick] [--timeout 900]
#                         [--wait-idle SECS] [--no-docs]
#
#   --mib S       tensor size per worker in MiB of float32 (default 64)
#   --repeats K   timed all-reduces per measurement (default 5)
#   --quick       a fast check: 8 MiB, 3 repeats (unless given), results/ only
#   --timeout T   seconds any one measurement may take (default 900)
#   --wait-idle W before measuring, wait up to W s for the 1-min load average
#                 to fall below half the cores (the times are only meaningful
#                 on a machine nothing else is loading; default 0: no wait)
#   --no-docs     write results/ only, leave docs/bench.{json,png} alone
#
# What it does:
#   1. installs what is missing (one apt-get update, then apt-get install of
#      openmpi-bin libopenmpi-dev python3-matplotlib jq iperf3 and the build
#      dependencies), builds with `cargo build --release --workspace --bins`,
#      compiles bench/mpi_allreduce.c with mpicc;
#   2. makes a testbed of 4 workers (scripts/testbed.sh up --workers 4
#      --prefix bench: namespaces bench-sw, bench-w0..3);
#   3. for each link setting, "unlimited" (plain veth) then "1gbit" (tc tbf
#      1 Gbit/s on every worker's eth0 egress, on every switch port sw-wI
#      egress, and on every worker's eth0 ingress through an ifb device,
#      because switchd's AF_XDP transmit bypasses the qdisc of sw-wI):
#        * iperf3 worker->switch, switch->worker and worker->worker (TCP, 2 s)
#          to show what the links carry;
#        * OpenMPI: mpirun in bench-w0 with a hostfile of the 4 workers and an
#          ssh stand-in that runs each rank's daemon in its namespace; TCP
#          BTL on eth0; one warm-up then K timed MPI_Allreduce (MPI_FLOAT,
#          MPI_SUM) of the tensor; best/median/mean of the slowest rank.
#          Twice: on the testbed as made (worker eth0 transmit checksum
#          offload off, hence no TSO: the switch needs complete checksums),
#          and again with it on (TSO), as TCP would have it on a real NIC;
#        * the switch: switchd in bench-sw (4 ports, job 1 of 4 workers,
#          pool_slots 256, a random secret); the 4 `worker allreduce` run
#          concurrently, once with --iterations K (all-reduce time = the
#          slowest rank's seconds / K) and K times with --iterations 1 (best
#          and median of the slowest rank); ifb/tbf byte counters show that
#          the switch's traffic crossed the shapers;
#   4. prints a table and writes results/bench-STAMP.json (+ logs in
#      results/bench-STAMP/), and unless --quick or --no-docs, docs/bench.json
#      and docs/bench.png (scripts/bench_plot.py).
#
# Times are per all-reduce of the whole tensor. The line-rate bound on
# 1 Gbit/s links is the bytes each link must carry one way (every chunk of
# 362 floats is a 14+20+8+22+1448 = 1512-byte frame) over 1 Gbit/s; tc counts
# frames without FCS, preamble and gap, so that is the bound on this testbed
# ("l2"); "l1" adds 24 bytes a frame as a real Ethernet NIC would.
#
# Everything runs inside the bench-* namespaces; every process started is
# stopped by PID and the testbed removed on exit, also on failure.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly PREFIX=bench
readonly WORKERS=4
readonly SWITCH_ADDR=198.18.0.1
readonly WORKER_BASE=10
readonly AGG_PORT=48879
readonly JOB_ID=1
readonly POOL_SLOTS=256
readonly RATE=1gbit
readonly RATE_BPS=1000000000
readonly TBF_ARGS=(rate "$RATE" burst 256kb latency 50ms)
readonly READY_LINE="switchd ready"
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=15
readonly IPERF_SECS=2
readonly IPERF_PORT=5201
# Build, run and plot dependencies; setup.sh's build list plus the benchmark's.
readonly PACKAGES=(
    clang llvm libbpf-dev linux-libc-dev iproute2 ethtool gcc
    openmpi-bin libopenmpi-dev python3 python3-matplotlib jq iperf3
)

ORIG_ARGS=("$@")
MIB=""
REPEATS=""
QUICK=0
TIMEOUT=900
WAIT_IDLE=0
DOCS=1

usage() {
    awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --mib|--repeats|--timeout|--wait-idle)
            [[ $# -ge 2 ]] || die "$1 needs a value"
            case "$1" in
                --mib) MIB="$2" ;;
                --repeats) REPEATS="$2" ;;
                --timeout) TIMEOUT="$2" ;;
                --wait-idle) WAIT_IDLE="$2" ;;
            esac
            shift 2 ;;
        --mib=*) MIB="${1#*=}"; shift ;;
        --repeats=*) REPEATS="${1#*=}"; shift ;;
        --timeout=*) TIMEOUT="${1#*=}"; shift ;;
        --wait-idle=*) WAIT_IDLE="${1#*=}"; shift ;;
        --quick) QUICK=1; shift ;;
        --no-docs) DOCS=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
if [[ "$QUICK" -eq 1 ]]; then
    MIB="${MIB:-8}"
    REPEATS="${REPEATS:-3}"
    DOCS=0
fi
MIB="${MIB:-64}"
REPEATS="${REPEATS:-5}"
uint_in_range "$MIB" 1 1024 || die "--mib must be 1..1024, got '$MIB'"
uint_in_range "$REPEATS" 1 1000 || die "--repeats must be 1..1000, got '$REPEATS'"
uint_in_range "$TIMEOUT" 10 86400 || die "--timeout must be 10..86400 s, got '$TIMEOUT'"
uint_in_range "$WAIT_IDLE" 0 86400 || die "--wait-idle must be 0..86400 s, got '$WAIT_IDLE'"
MIB=$((10#$MIB)); REPEATS=$((10#$REPEATS)); TIMEOUT=$((10#$TIMEOUT)); WAIT_IDLE=$((10#$WAIT_IDLE))
readonly MIB REPEATS TIMEOUT WAIT_IDLE QUICK DOCS
readonly ELEMENTS=$((MIB * 1024 * 1024 / 4))

require_root "${ORIG_ARGS[@]}"
cd "$REPO_ROOT"

# --- cleanup --------------------------------------------------------------------
TESTBED_MADE=0
SWITCHD_PID=""
BG_PIDS=()   # every other background child (workers, mpirun, iperf3)

# stop_pid PID: SIGTERM, SIGKILL after a grace period, then reap.
stop_pid() {
    local pid="$1" i
    [[ -n "$pid" ]] || return 0
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        warn "pid $pid ignored SIGTERM for ${STOP_TIMEOUT} s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

# stop_ns_leftovers: stop, by PID, anything still running inside this run's
# namespaces (e.g. an OpenMPI daemon whose mpirun was stopped).
stop_ns_leftovers() {
    local ns pid
    local -a spaces=("$PREFIX-sw")
    for ((pid = 0; pid < WORKERS; pid++)); do spaces+=("$PREFIX-w$pid"); done
    for ns in "${spaces[@]}"; do
        netns_exists "$ns" || continue
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -TERM "$pid" 2>/dev/null || true
        done
    done
    sleep 0.5
    for ns in "${spaces[@]}"; do
        netns_exists "$ns" || continue
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -KILL "$pid" 2>/dev/null || true
        done
    done
}

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${BG_PIDS[@]}"; do
        stop_pid "$pid"
    done
    stop_pid "$SWITCHD_PID"
    if [[ "$TESTBED_MADE" -eq 1 ]]; then
        stop_ns_leftovers
        bash "$REPO_ROOT/scripts/testbed.sh" down --prefix "$PREFIX" >/dev/null 2>&1 ||
            warn "testbed down failed; run: scripts/testbed.sh down --prefix $PREFIX"
    fi
    if [[ -n "${MPI_TMP:-}" && -d "$MPI_TMP" ]]; then
        rm -rf -- "$MPI_TMP"
    fi
    if [[ -n "${RUN:-}" ]]; then
        rm -rf -- "${RUN:?}/bin"
        [[ "$rc" -eq 0 ]] || log "failed (status $rc); logs in $RUN"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_pids TIMEOUT PID...: wait for background children up to TIMEOUT s,
# stopping those still running then. Sets WAIT_RCS[i] to the exit status of
# the i-th PID, or 124 on timeout. Returns 0 when every status is 0.
WAIT_RCS=()
wait_pids() {
    local timeout="$1" i rc left deadline
    shift
    local -a pids=("$@")
    WAIT_RCS=()
    deadline=$((SECONDS + timeout))
    left=${#pids[@]}
    while ((left > 0)); do
        for i in "${!pids[@]}"; do
            [[ -z "${WAIT_RCS[i]:-}" ]] || continue
            if ! kill -0 "${pids[i]}" 2>/dev/null; then
                rc=0
                wait "${pids[i]}" || rc=$?
                WAIT_RCS[i]=$rc
                left=$((left - 1))
            fi
        done
        ((left > 0)) || break
        if ((SECONDS >= deadline)); then
            for i in "${!pids[@]}"; do
                if [[ -z "${WAIT_RCS[i]:-}" ]]; then
                    warn "pid ${pids[i]} still running after $timeout s; stopping it"
                    stop_pid "${pids[i]}"
                    WAIT_RCS[i]=124
                fi
            done
            break
        fi
        sleep 0.05
    done
    # They are reaped: forget them.
    local -a keep=()
    local p q gone
    for p in "${BG_PIDS[@]}"; do
        gone=0
        for q in "${pids[@]}"; do [[ "$p" == "$q" ]] && gone=1; done
        [[ "$gone" -eq 1 ]] || keep+=("$p")
    done
    BG_PIDS=("${keep[@]}")
    for rc in "${WAIT_RCS[@]}"; do
        [[ "$rc" -eq 0 ]] || return 1
    done
    return 0
}

# --- install, build -----------------------------------------------------------------
pkg_installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}
missing=()
for p in "${PACKAGES[@]}"; do
    pkg_installed "$p" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
    command -v apt-get >/dev/null 2>&1 || die "missing packages (${missing[*]}) and no apt-get"
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null || die "apt-get update failed"
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
        die "apt-get install ${missing[*]} failed"
fi
for c in mpicc mpirun jq iperf3 python3 tc ip; do
    command -v "$c" >/dev/null 2>&1 || die "$c not found after installing"
done

ensure_cargo_path
log "building (cargo build --release --workspace --bins)"
cargo build --release --workspace --bins
for b in switchd worker; do
    [[ -x "$REPO_ROOT/target/release/$b" ]] || die "target/release/$b missing after the build"
done

STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
readonly STAMP
RUN="$REPO_ROOT/results/bench-$STAMP"
mkdir -p "$RUN/bin"
readonly RUN
# Private copies, so that a rebuild meanwhile cannot change what is measured
# (removed on exit).
cp "$REPO_ROOT/target/release/switchd" "$REPO_ROOT/target/release/worker" "$RUN/bin/"
readonly SWITCHD="$RUN/bin/switchd"
readonly WORKER="$RUN/bin/worker"
MPI_BIN="$RUN/mpi_allreduce"
mpicc -O2 -o "$MPI_BIN" "$REPO_ROOT/bench/mpi_allreduce.c" ||
    die "mpicc failed on bench/mpi_allreduce.c"

# --- testbed, config, ssh stand-in --------------------------------------------------
TESTBED_MADE=1
bash "$REPO_ROOT/scripts/testbed.sh" up --prefix "$PREFIX" --workers "$WORKERS" >"$RUN/testbed.log"

SECRET="$(od -An -v -tx1 -N32 /dev/urandom | tr -d ' \n')"
[[ "${#SECRET}" -eq 64 ]] || die "could not make a secret from /dev/urandom"
readonly SECRET

CFG="$RUN/switchd.toml"
{
    echo "# Written by scripts/bench.sh for testbed '$PREFIX'."
    echo "[switch]"
    printf 'ports = ['
    for ((i = 0; i < WORKERS; i++)); do
        printf '%s"sw-w%d"' "$( ((i > 0)) && echo ', ')" "$i"
    done
    echo "]"
    echo "addresses = [\"$SWITCH_ADDR\"]"
    echo "agg_port = $AGG_PORT"
    echo
    echo "[[job]]"
    echo "id = $JOB_ID"
    echo "n_workers = $WORKERS"
    echo 'allowed_sources = ["198.18.0.0/24"]'
    echo "secret = \"$SECRET\""
    echo "pool_slots = $POOL_SLOTS"
} >"$CFG"
chmod 600 "$CFG"

HOSTFILE="$RUN/hostfile"
RSH="$RUN/netns-ssh.sh"
: >"$HOSTFILE"
cases=""
for ((i = 0; i < WORKERS; i++)); do
    cases+="    198.18.0.$((WORKER_BASE + i))) ns=$PREFIX-w$i ;;"$'\n'
    echo "198.18.0.$((WORKER_BASE + i)) slots=1" >>"$HOSTFILE"
done
# Every namespace has the same hostname, so OpenMPI's session directories
# (TMPDIR/ompi.HOSTNAME.UID/...) would collide and race: each "host" gets its
# own TMPDIR (short paths: PMIx puts Unix sockets in there).
MPI_TMP="$(mktemp -d /tmp/bench-mpi.XXXXXX)"
mkdir -p "$MPI_TMP/mpirun"
cat >"$RSH" <<EOF
#!/bin/sh
# ssh stand-in for mpirun (--mca plm_rsh_agent), written by scripts/bench.sh:
# skip ssh options, map the host address to its network namespace, run the
# command there with a TMPDIR of its own.
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
TMPDIR="$MPI_TMP/\$ns"
export TMPDIR
mkdir -p "\$TMPDIR" || exit 255
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod 755 "$RSH"

# --- measurements -------------------------------------------------------------------
loadavg() { cut -d' ' -f1 /proc/loadavg; }

# shape_links: 1 Gbit/s each way on every worker link (see the header).
shape_links() {
    local i ns
    for ((i = 0; i < WORKERS; i++)); do
        ns="$PREFIX-w$i"
        ip netns exec "$PREFIX-sw" tc qdisc replace dev "sw-w$i" root tbf "${TBF_ARGS[@]}"
        ip netns exec "$ns" tc qdisc replace dev eth0 root tbf "${TBF_ARGS[@]}"
        ip -n "$ns" link add ifb0 type ifb
        ip -n "$ns" link set ifb0 up
        ip netns exec "$ns" tc qdisc add dev eth0 handle ffff: ingress
        if ! ip netns exec "$ns" tc filter add dev eth0 parent ffff: protocol all prio 1 \
            matchall action mirred egress redirect dev ifb0 2>/dev/null; then
            # No cls_matchall in this kernel: a u32 filter that matches all.
            ip netns exec "$ns" tc filter add dev eth0 parent ffff: protocol all prio 1 \
                u32 match u32 0 0 action mirred egress redirect dev ifb0
        fi
        ip netns exec "$ns" tc qdisc replace dev ifb0 root tbf "${TBF_ARGS[@]}"
    done
}

# qdisc_counters NS DEV: "BYTES PACKETS DROPS OVERLIMITS" of DEV's root tbf
# or htb qdisc ("0 0 0 0" when it has none).
qdisc_counters() {
    local out
    out="$(ip netns exec "$1" tc -s qdisc show dev "$2" 2>/dev/null |
        awk '/^qdisc (tbf|htb) .* root/ { root = 1; next }
             /^qdisc/ { root = 0 }
             root && $1 == "Sent" { gsub(/[(),]/, ""); print $2, $4, $7, $9; exit }' || true)"
    echo "${out:-0 0 0 0}"
}

# shaper_snapshot FILE: the counters of every shaper, summed per kind, as JSON.
shaper_snapshot() {
    local i kind ns dev
    local -A sum=()
    local -a c
    for ((i = 0; i < WORKERS; i++)); do
        for kind in worker_egress worker_ingress_ifb switch_port_egress; do
            case "$kind" in
                worker_egress) ns="$PREFIX-w$i" dev=eth0 ;;
                worker_ingress_ifb) ns="$PREFIX-w$i" dev=ifb0 ;;
                switch_port_egress) ns="$PREFIX-sw" dev="sw-w$i" ;;
            esac
            read -r -a c < <(qdisc_counters "$ns" "$dev")
            sum[$kind.bytes]=$((${sum[$kind.bytes]:-0} + c[0]))
            sum[$kind.packets]=$((${sum[$kind.packets]:-0} + c[1]))
            sum[$kind.drops]=$((${sum[$kind.drops]:-0} + c[2]))
            sum[$kind.overlimits]=$((${sum[$kind.overlimits]:-0} + c[3]))
        done
    done
    for kind in worker_egress worker_ingress_ifb switch_port_egress; do
        printf '{"%s":{"bytes":%d,"packets":%d,"drops":%d,"overlimits":%d}}\n' "$kind" \
            "${sum[$kind.bytes]}" "${sum[$kind.packets]}" "${sum[$kind.drops]}" "${sum[$kind.overlimits]}"
    done | jq -s add >"$1"
}

# cpu_ticks: "BUSY TOTAL" jiffies of all CPUs so far (/proc/stat; idle and
# iowait are not busy).
cpu_ticks() {
    awk '$1 == "cpu" { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat
}

# cpu_busy BEFORE_BUSY BEFORE_TOTAL: the busy fraction of all CPUs since then.
cpu_busy() {
    local now
    read -r -a now < <(cpu_ticks)
    awk -v b="$((now[0] - $1))" -v t="$((now[1] - $2))" 'BEGIN { printf "%.3f\n", (t > 0 ? b / t : 0) }'
}

# shaper_delta BEFORE AFTER: AFTER - BEFORE, counter by counter, as JSON.
shaper_delta() {
    jq -n --slurpfile a "$1" --slurpfile b "$2" \
        '$b[0] | with_entries(.key as $k | .value |= with_entries(.value -= $a[0][$k][.key]))'
}

# iperf NAME SERVER_NS ADDR CLIENT_NS [-R]: sets IPERF_RESULT to the TCP
# Gbit/s received (or null); the report goes to $OUT/iperf-NAME.json.
IPERF_RESULT=null
iperf() {
    local name="$1" sns="$2" addr="$3" cns="$4" i spid rc=0
    shift 4
    ip netns exec "$sns" iperf3 -s -1 -p "$IPERF_PORT" >"$OUT/iperf-$name-server.log" 2>&1 &
    spid=$!
    BG_PIDS+=("$spid")
    for ((i = 0; i < 50; i++)); do
        ip netns exec "$sns" ss -ltnH "sport = :$IPERF_PORT" 2>/dev/null | grep -q . && break
        sleep 0.1
    done
    ip netns exec "$cns" iperf3 -c "$addr" -p "$IPERF_PORT" -t "$IPERF_SECS" -J "$@" \
        >"$OUT/iperf-$name.json" 2>&1 || rc=$?
    wait_pids 10 "$spid" || true
    if [[ "$rc" -ne 0 ]]; then
        warn "iperf3 $name failed (status $rc), see $OUT/iperf-$name.json"
        IPERF_RESULT=null
        return 0
    fi
    IPERF_RESULT="$(jq '.end.sum_received.bits_per_second / 1e9' "$OUT/iperf-$name.json")"
}

# set_worker_tx on|off: transmit checksum offload (and with it TSO) of every
# worker's eth0. testbed.sh turns it off, so that the switch sees complete
# UDP checksums as from a real NIC; on veth that also costs TCP its 64 KB
# segments, which a real NIC would keep. OpenMPI is measured both ways.
set_worker_tx() {
    local i
    for ((i = 0; i < WORKERS; i++)); do
        ip netns exec "$PREFIX-w$i" ethtool -K eth0 tx "$1" >/dev/null 2>&1 ||
            warn "ethtool -K eth0 tx $1 failed in $PREFIX-w$i"
    done
}

# run_mpi TAG: K timed MPI_Allreduce across the worker namespaces; the
# result goes to $OUT/TAG.result.json.
run_mpi() {
    local tag="$1" pid cpu0 busy
    shaper_snapshot "$OUT/shaper-$tag-before.json"
    read -r -a cpu0 < <(cpu_ticks)
    log "[$LINK] OpenMPI MPI_Allreduce ($tag): $WORKERS ranks x $MIB MiB, 1 warm-up + $REPEATS timed"
    (
        cd "$OUT"
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        # Every "host" has the same hostname here: keep PMIx off shared memory.
        export PMIX_MCA_gds=hash
        export TMPDIR="$MPI_TMP/mpirun"
        exec ip netns exec "$PREFIX-w0" mpirun --allow-run-as-root \
            -np "$WORKERS" --hostfile "$HOSTFILE" \
            --mca plm_rsh_agent "$RSH" \
            --mca btl tcp,self --mca btl_tcp_if_include eth0 \
            --mca oob_tcp_if_include eth0 --bind-to none \
            "$MPI_BIN" "$ELEMENTS" "$REPEATS"
    ) >"$OUT/$tag.json" 2>"$OUT/$tag.log" &
    pid=$!
    BG_PIDS+=("$pid")
    if ! wait_pids "$TIMEOUT" "$pid"; then
        tail -n 20 "$OUT/$tag.log" >&2
        die "mpirun failed (status ${WAIT_RCS[0]}); see $OUT/$tag.log"
    fi
    local json
    json="$(grep -E '^\{' "$OUT/$tag.json" | tail -n 1)"
    [[ -n "$json" ]] || die "mpirun printed no JSON; see $OUT/$tag.json and $OUT/$tag.log"
    [[ "$(jq -r .verified <<<"$json")" == true ]] || die "MPI_Allreduce gave a wrong sum"
    busy="$(cpu_busy "${cpu0[@]}")"
    shaper_snapshot "$OUT/shaper-$tag-after.json"
    jq -c --argjson sh "$(shaper_delta "$OUT/shaper-$tag-before.json" "$OUT/shaper-$tag-after.json")" \
        --argjson busy "$busy" \
        '. + {shapers: $sh, cpu_busy_fraction: $busy}' <<<"$json" >"$OUT/$tag.result.json"
}

start_switchd() {
    local deadline
    ip netns exec "$PREFIX-sw" "$SWITCHD" run --config "$CFG" --stats-file "$OUT/switchd-stats.json" \
        >"$OUT/switchd.log" 2>&1 &
    SWITCHD_PID=$!
    deadline=$((SECONDS + READY_TIMEOUT))
    until grep -qF "$READY_LINE" "$OUT/switchd.log" 2>/dev/null; do
        if ! kill -0 "$SWITCHD_PID" 2>/dev/null; then
            wait "$SWITCHD_PID" || true
            SWITCHD_PID=""
            tail -n 20 "$OUT/switchd.log" >&2
            die "switchd exited before it was ready; see $OUT/switchd.log"
        fi
        ((SECONDS < deadline)) || die "switchd not ready within $READY_TIMEOUT s; see $OUT/switchd.log"
        sleep 0.1
    done
}

stop_switchd() {
    stop_pid "$SWITCHD_PID"
    SWITCHD_PID=""
}

# run_workers ITERATIONS TAG: the 4 workers at once; sets WORKERS_SLOWEST to
# the slowest rank's seconds (for all ITERATIONS).
WORKERS_SLOWEST=""
run_workers() {
    local iters="$1" tag="$2" r
    local -a pids=()
    for ((r = 0; r < WORKERS; r++)); do
        ip netns exec "$PREFIX-w$r" "$WORKER" allreduce \
            --switch "$SWITCH_ADDR" --job "$JOB_ID" --rank "$r" --workers "$WORKERS" \
            --secret "$SECRET" --elements "$ELEMENTS" --iterations "$iters" --json \
            >"$OUT/$tag-rank$r.json" 2>"$OUT/$tag-rank$r.log" &
        pids+=("$!")
        BG_PIDS+=("$!")
    done
    if ! wait_pids "$TIMEOUT" "${pids[@]}"; then
        for ((r = 0; r < WORKERS; r++)); do
            echo "rank $r: status ${WAIT_RCS[r]}; $(tail -n 3 "$OUT/$tag-rank$r.log")" >&2
        done
        die "switch all-reduce '$tag' failed; see $OUT"
    fi
    WORKERS_SLOWEST="$(jq -s 'map(.seconds) | max' "$OUT/$tag"-rank*.json)"
}

# run_switch: one K-iteration run and K single runs; JSON into $OUT/switch.result.json.
run_switch() {
    local k runs=() kt cpu0 busy
    log "[$LINK] switch: $WORKERS workers x $MIB MiB, $REPEATS iterations in one run, then $REPEATS single runs"
    start_switchd
    shaper_snapshot "$OUT/shaper-switch-before.json"
    read -r -a cpu0 < <(cpu_ticks)
    run_workers "$REPEATS" multi
    kt="$WORKERS_SLOWEST"
    for ((k = 0; k < REPEATS; k++)); do
        run_workers 1 "single$k"
        runs+=("$WORKERS_SLOWEST")
    done
    busy="$(cpu_busy "${cpu0[@]}")"
    shaper_snapshot "$OUT/shaper-switch-after.json"
    stop_switchd
    jq -n \
        --argjson multi_s "$kt" \
        --argjson k "$REPEATS" \
        --argjson runs "$(printf '%s\n' "${runs[@]}" | jq -s .)" \
        --argjson busy "$busy" \
        --argjson shapers "$(shaper_delta "$OUT/shaper-switch-before.json" "$OUT/shaper-switch-after.json")" \
        --argjson bytes "$((ELEMENTS * 4))" \
        --slurpfile ranks <(cat "$OUT"/multi-rank*.json) \
        --slurpfile stats <(cat "$OUT/switchd-stats.json" 2>/dev/null || echo null) \
        '($runs | sort) as $s
         | ($s | length) as $n
         | {
             mean_s: ($multi_s / $k),
             best_s: $s[0],
             median_s: (if $n % 2 == 1 then $s[($n - 1) / 2] else ($s[$n / 2 - 1] + $s[$n / 2]) / 2 end),
             worst_s: $s[-1],
             single_runs_s: $runs,
             multi_run_slowest_rank_s: $multi_s,
             gbit_per_s_slowest_rank: ($bytes * 8 * $k / $multi_s / 1e9),
             elems_per_chunk: $ranks[0].elems_per_chunk,
             chunks_resent_multi_run: ($ranks | map(.stats.chunks_resent // 0) | add),
             per_rank_multi_run: ($ranks | map({rank, seconds, gbit_per_s, chunks_resent: .stats.chunks_resent})),
             shapers: $shapers,
             cpu_busy_fraction: $busy,
             switchd_stats: $stats[0]
           }' >"$OUT/switch.result.json"
}

# measure LINK: everything for one link setting into $OUT/link.json.
measure() {
    LINK="$1"
    OUT="$RUN/$LINK"
    mkdir -p "$OUT"
    local load0 up down w2w
    load0="$(loadavg)"
    log "[$LINK] iperf3 (TCP, $IPERF_SECS s each): worker->switch, switch->worker, worker->worker"
    iperf up "$PREFIX-sw" "$SWITCH_ADDR" "$PREFIX-w0"
    up="$IPERF_RESULT"
    iperf down "$PREFIX-sw" "$SWITCH_ADDR" "$PREFIX-w0" -R
    down="$IPERF_RESULT"
    iperf w2w "$PREFIX-w1" "198.18.0.$((WORKER_BASE + 1))" "$PREFIX-w0"
    w2w="$IPERF_RESULT"
    run_mpi mpi
    set_worker_tx on
    run_mpi mpi_tso
    set_worker_tx off
    run_switch
    jq -n --arg link "$LINK" --argjson up "$up" --argjson down "$down" --argjson w2w "$w2w" \
        --argjson load0 "$load0" --argjson load1 "$(loadavg)" \
        --slurpfile mpi "$OUT/mpi.result.json" --slurpfile tso "$OUT/mpi_tso.result.json" \
        --slurpfile sw "$OUT/switch.result.json" \
        '{link: $link,
          iperf3_gbit_per_s: {worker_to_switch: $up, switch_to_worker: $down, worker_to_worker: $w2w},
          openmpi: $mpi[0], openmpi_tso: $tso[0], switch: $sw[0],
          ratio_switch_over_openmpi: {
            mean: ($sw[0].mean_s / $mpi[0].mean_s),
            median: ($sw[0].median_s / $mpi[0].median_s),
            best: ($sw[0].best_s / $mpi[0].best_s)},
          ratio_switch_over_openmpi_tso: {
            mean: ($sw[0].mean_s / $tso[0].mean_s),
            median: ($sw[0].median_s / $tso[0].median_s),
            best: ($sw[0].best_s / $tso[0].best_s)},
          loadavg_1min: {start: $load0, end: $load1}}' >"$OUT/link.json"
}

# busy_machine: true when the 1-min load average is above half the cores.
busy_machine() {
    awk -v l="$(loadavg)" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'
}
if ((WAIT_IDLE > 0)) && busy_machine; then
    log "waiting up to $WAIT_IDLE s for the 1-min load average ($(loadavg)) to fall below $(nproc)/2"
    idle_deadline=$((SECONDS + WAIT_IDLE))
    while busy_machine && ((SECONDS < idle_deadline)); do
        sleep 5
    done
fi

log "run $STAMP: $WORKERS workers, $MIB MiB ($ELEMENTS float32), $REPEATS repeats; logs in $RUN"
LOAD_START="$(loadavg)"
if busy_machine; then
    warn "1-min load average is $LOAD_START on $(nproc) cores before starting: other work shares the CPUs, expect noisy times"
fi
measure unlimited
shape_links
measure 1gbit

# --- report -------------------------------------------------------------------------
EPC="$(jq -r '.switch.elems_per_chunk' "$RUN/1gbit/link.json")"
uint_in_range "$EPC" 1 1000 || die "no elems_per_chunk in the worker's report"
CHUNKS=$(((ELEMENTS + EPC - 1) / EPC))
HDR=$((14 + 20 + 8 + 22))
WIRE_L2=$((CHUNKS * HDR + ELEMENTS * 4))   # bytes one way, as tc counts them
WIRE_L1=$((WIRE_L2 + CHUNKS * 24))          # + FCS 4, preamble 8, gap 12

MEM_KB="$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)"
MODEL="$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
OUT_JSON="$REPO_ROOT/results/bench-$STAMP.json"
jq -n \
    --arg stamp "$STAMP" \
    --arg kernel "$(uname -r)" \
    --arg model "${MODEL:-unknown}" \
    --argjson nproc "$(nproc)" \
    --argjson mem_kb "${MEM_KB:-0}" \
    --arg os "$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-}")" \
    --arg ompi "$(mpirun --version 2>/dev/null | head -n 1)" \
    --arg commit "$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --argjson dirty "$(git -C "$REPO_ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)" \
    --argjson mib "$MIB" --argjson elements "$ELEMENTS" --argjson k "$REPEATS" \
    --argjson workers "$WORKERS" --argjson quick "$QUICK" \
    --argjson epc "$EPC" --argjson chunks "$CHUNKS" --argjson hdr "$HDR" \
    --argjson l2 "$WIRE_L2" --argjson l1 "$WIRE_L1" --argjson bps "$RATE_BPS" \
    --argjson load0 "$LOAD_START" --argjson load1 "$(loadavg)" \
    --slurpfile unl "$RUN/unlimited/link.json" --slurpfile lim "$RUN/1gbit/link.json" \
    '($l2 * 8 / $bps) as $bound_l2
     | ($l1 * 8 / $bps) as $bound_l1
     | {
        stamp: $stamp, commit: $commit, uncommitted_changes_in_tracked_files: $dirty,
        quick: ($quick == 1),
        machine: {nproc: $nproc, cpu_model: $model, mem_total_kib: $mem_kb, kernel: $kernel, os: $os,
                  loadavg_1min: {start: $load0, end: $load1}},
        setup: {workers: $workers, mib: $mib, elements: $elements, dtype: "float32", repeats: $k,
                openmpi: $ompi,
                openmpi_args: "--mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 --bind-to none",
                shaping: "tbf rate 1gbit burst 256kb latency 50ms on worker eth0 egress, switch port sw-wI egress, and worker eth0 ingress via ifb0",
                switch_time: "slowest rank: seconds / K from one run of K iterations (mean); best/median over K runs of 1 iteration"},
        line_rate_1gbit: {elems_per_chunk: $epc, chunks: $chunks, header_bytes_per_frame: $hdr,
                          frame_bytes: ($hdr + $epc * 4),
                          bytes_one_way_l2: $l2, bytes_one_way_l1: $l1,
                          bound_l2_s: $bound_l2, bound_l1_s: $bound_l1,
                          note: "l2 = frame without FCS, as tc tbf counts it (the bound on this testbed); l1 adds FCS, preamble and inter-frame gap (24 B a frame)"},
        links: [$unl[0], $lim[0]
                | .switch.shapers.expected_bytes_each_way_l2 = (2 * $k * $workers * $l2)
                | .switch.shapers.worker_egress.over_expected =
                    (.switch.shapers.worker_egress.bytes / (2 * $k * $workers * $l2))
                | .switch.shapers.worker_ingress_ifb.over_expected =
                    (.switch.shapers.worker_ingress_ifb.bytes / (2 * $k * $workers * $l2))],
        headline: {
          switch_over_openmpi_unlimited: $unl[0].ratio_switch_over_openmpi.mean,
          switch_over_openmpi_1gbit: $lim[0].ratio_switch_over_openmpi.mean,
          switch_over_openmpi_1gbit_median: $lim[0].ratio_switch_over_openmpi.median,
          switch_over_openmpi_1gbit_goal: 0.67,
          switch_over_openmpi_1gbit_goal_met: ($lim[0].ratio_switch_over_openmpi.mean <= 0.67),
          switch_over_openmpi_tso_unlimited: $unl[0].ratio_switch_over_openmpi_tso.mean,
          switch_over_openmpi_tso_1gbit: $lim[0].ratio_switch_over_openmpi_tso.mean,
          switch_over_line_rate_1gbit: ($lim[0].switch.mean_s / $bound_l2),
          switch_over_line_rate_1gbit_median: ($lim[0].switch.median_s / $bound_l2),
          switch_over_line_rate_goal: 1.10,
          switch_over_line_rate_goal_met: ($lim[0].switch.mean_s / $bound_l2 <= 1.10)
        }
      }' >"$OUT_JSON"

# --- table --------------------------------------------------------------------------
TABLE="$RUN/table.md"
jq -r '
  def fx($d; $z): (. * $d | round) as $m
          | ($m / $d | floor | tostring) + "." + (($z + ($m % $d | tostring)) | .[-($z | length):]);
  def f3: fx(1000; "000");
  def f2: fx(100; "00");
  "| link | method | best s | median s | mean s | mean Gbit/s | iperf3 up/down/w2w Gbit/s |",
  "|---|---|---:|---:|---:|---:|---|",
  (.links[] as $l
   | ($l.iperf3_gbit_per_s | [.worker_to_switch, .switch_to_worker, .worker_to_worker]
      | map(if . == null then "-" else f2 end) | join(" / ")) as $ip
   | "| \($l.link) | switch | \($l.switch.best_s | f3) | \($l.switch.median_s | f3) | \($l.switch.mean_s | f3) | \($l.switch.gbit_per_s_slowest_rank | f2) | \($ip) |",
     "| \($l.link) | OpenMPI | \($l.openmpi.best_s | f3) | \($l.openmpi.median_s | f3) | \($l.openmpi.mean_s | f3) | \(($l.openmpi.bytes * 8 / $l.openmpi.mean_s / 1e9) | f2) | |",
     "| \($l.link) | OpenMPI, worker tx offload on (TSO) | \($l.openmpi_tso.best_s | f3) | \($l.openmpi_tso.median_s | f3) | \($l.openmpi_tso.mean_s | f3) | \(($l.openmpi_tso.bytes * 8 / $l.openmpi_tso.mean_s / 1e9) | f2) | |"),
  "",
  "line-rate bound at 1 Gbit/s: \(.line_rate_1gbit.bound_l2_s | f3) s (L2, \(.line_rate_1gbit.frame_bytes) B frames of \(.line_rate_1gbit.elems_per_chunk) floats, as tc counts), \(.line_rate_1gbit.bound_l1_s | f3) s (L1)",
  "switch / OpenMPI, unlimited: \(.headline.switch_over_openmpi_unlimited | f2) (mean), \(.links[0].ratio_switch_over_openmpi.median | f2) (median), \(.links[0].ratio_switch_over_openmpi.best | f2) (best)",
  "switch / OpenMPI, 1 Gbit/s:  \(.headline.switch_over_openmpi_1gbit | f2) (mean), \(.links[1].ratio_switch_over_openmpi.median | f2) (median), \(.links[1].ratio_switch_over_openmpi.best | f2) (best); goal <= 0.67: \(if .headline.switch_over_openmpi_1gbit_goal_met then "met" else "NOT met" end)",
  "switch / OpenMPI with TSO: \(.headline.switch_over_openmpi_tso_unlimited | f2) unlimited, \(.headline.switch_over_openmpi_tso_1gbit | f2) at 1 Gbit/s (mean)",
  "switch / line rate, 1 Gbit/s: \(.headline.switch_over_line_rate_1gbit | f2) (mean), \(.headline.switch_over_line_rate_1gbit_median | f2) (median); goal <= 1.10: \(if .headline.switch_over_line_rate_goal_met then "met" else "NOT met" end)",
  (.links[] | select(.link == "1gbit") |
   "1 Gbit/s shapers, switch runs: \(.switch.shapers.worker_egress.over_expected | f2)x / \(.switch.shapers.worker_ingress_ifb.over_expected | f2)x the frames due crossed worker egress / ingress (ifb); tbf overlimits \(.switch.shapers.worker_egress.overlimits) / \(.switch.shapers.worker_ingress_ifb.overlimits), drops \(.switch.shapers.worker_egress.drops) / \(.switch.shapers.worker_ingress_ifb.drops)",
   "1 Gbit/s shapers, OpenMPI: tbf overlimits \(.openmpi.shapers.worker_egress.overlimits) egress / \(.openmpi.shapers.switch_port_egress.overlimits) switch port / \(.openmpi.shapers.worker_ingress_ifb.overlimits) ingress (ifb)"),
  "CPU busy (all cores, whole phase incl. start-up): " + ([.links[] | "\(.link) switch \(.switch.cpu_busy_fraction * 100 | round)% / OpenMPI \(.openmpi.cpu_busy_fraction * 100 | round)% / with TSO \(.openmpi_tso.cpu_busy_fraction * 100 | round)%"] | join(", ")),
  "machine: \(.machine.nproc) cores (\(.machine.cpu_model)), \(.machine.mem_total_kib / 1048576 | f2) GiB, kernel \(.machine.kernel); 1-min load \(.machine.loadavg_1min.start) at start, \(.machine.loadavg_1min.end) at end"
' "$OUT_JSON" >"$TABLE"
echo
echo "=== bench $STAMP: $WORKERS workers, $MIB MiB float32 all-reduce, $REPEATS repeats ==="
cat "$TABLE"
echo

PNG="$RUN/bench.png"
# The system Python: Debian's python3-matplotlib lives there, whatever
# python3 comes first on PATH (pyenv, venv).
PYTHON=/usr/bin/python3
[[ -x "$PYTHON" ]] || PYTHON=python3
"$PYTHON" "$REPO_ROOT/scripts/bench_plot.py" "$OUT_JSON" "$PNG" ||
    warn "plot failed (scripts/bench_plot.py)"
if [[ "$DOCS" -eq 1 ]]; then
    mkdir -p "$REPO_ROOT/docs"
    cp "$OUT_JSON" "$REPO_ROOT/docs/bench.json"
    [[ -s "$PNG" ]] && cp "$PNG" "$REPO_ROOT/docs/bench.png"
    log "wrote docs/bench.json, docs/bench.png and $OUT_JSON"
else
    log "wrote $OUT_JSON and $PNG (docs/ left alone)"
fi
