#!/usr/bin/env bash
#
# bench_efficiency.sh: what a gradient all-reduce costs per byte, in time and
# in CPU: the switch (float32 with each worker transport, bfloat16) against
# OpenMPI's TCP ring with TSO and PyTorch's gloo, in the same run, at each
# MTU, on unlimited links and on links limited to 1 Gbit/s each way.
#
# Usage:
#   sudo scripts/bench_efficiency.sh [--mib 64] [--repeats 5] [--mtus 1500,9000]
#                                    [--dtypes f32,bf16] [--transports mmsg,udp-gso]
#                                    [--no-gloo] [--profile] [--quick] [--timeout 600]
#                                    [--json FILE] [--png FILE] [--no-docs]
#
#   --mib S          tensor per worker in MiB of float32 (default 64)
#   --repeats K      all-reduces per measurement, in one run (default 5)
#   --mtus LIST      MTUs of the testbed's links, one testbed each (default
#                    1500,9000)
#   --dtypes LIST    the switch's element types (default f32,bf16); bf16
#                    reduces the same number of elements in half the bytes
#   --transports LIST  worker transports for the float32 runs (default
#                    auto,mmsg: the worker's own choice, then the plain
#                    sendmmsg/recvmmsg path as the baseline); the narrower
#                    dtypes run with the first
#   --no-gloo        skip gloo (it needs torch in the project venv, which
#                    scripts/setup.sh makes; run here when it is missing)
#   --profile        also record a system-wide profile (perf record -a -g,
#                    Debian's linux-perf) of one more float32 switch run
#                    (first transport) at the largest MTU on unlimited links,
#                    not counted in the results; the summaries by process
#                    and by symbol go to RUN/profile-*.txt
#   --quick          8 MiB, 2 repeats, MTU 1500 only; bench/results/ left alone
#   --timeout T      seconds any one measurement may take (default 600)
#   --json FILE, --png FILE  where to write the results (default
#                    results/efficiency-STAMP.{json,png}); unless --quick or
#                    --no-docs also bench/results/bench-efficiency.{json,png}
#
# Every measurement is K all-reduces of the tensor by 4 workers on the
# veth testbed of scripts/testbed.sh (prefix "eff"), after one untimed
# warm-up all-reduce (as the peers do). Time: the slowest rank's, per
# all-reduce. CPU: the whole machine's busy CPU time (every
# process, the kernel and softirq: /proc/stat) over the all-reduces only,
# start-up excluded (the worker's --machine-cpu; rank 0 of
# bench/mpi_allreduce.c and bench/gloo_allreduce.py around each timed
# all-reduce), in CPU-seconds per GiB of float32 gradient reduced. The
# peers run on the plain bridge with switchd stopped and the workers'
# transmit offload on (TSO, as on a real NIC); the switch runs with switchd
# and the testbed's offload settings. 1 Gbit/s links: tc tbf on every
# worker's eth0 egress and ingress (ifb) and on every switch port
# (shape_worker_links in lib.sh). bench/harness/bench_efficiency_report.py turns
# the runs into the table, the JSON (with the goals' ratios) and the PNG.
#
# Everything runs inside the eff-* namespaces; every process started is
# stopped by PID and the testbed removed on exit, also on failure.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly PREFIX=eff
readonly WORKERS=4
SWITCH_ADDR=""  # the testbed's (tb switch_addr), once it is up
readonly GLOO_PORT=29517
readonly TBF_ARGS=(rate 1gbit burst 256kb latency 50ms)
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=15
readonly PACKAGES=(
    clang llvm libbpf-dev linux-libc-dev iproute2 ethtool gcc
    openmpi-bin libopenmpi-dev python3 python3-matplotlib jq
)

ORIG_ARGS=("$@")
MIB="" REPEATS="" MTUS="" QUICK=0 DOCS=1 GLOO=1 PROFILE=0 TIMEOUT=600
DTYPES="f32,bf16" TRANSPORTS="auto,mmsg" OUT_JSON="" OUT_PNG=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --mib|--repeats|--mtus|--dtypes|--transports|--timeout|--json|--png)
            [[ $# -ge 2 ]] || die "$1 needs a value"
            case "$1" in
                --mib) MIB="$2" ;;
                --repeats) REPEATS="$2" ;;
                --mtus) MTUS="$2" ;;
                --dtypes) DTYPES="$2" ;;
                --transports) TRANSPORTS="$2" ;;
                --timeout) TIMEOUT="$2" ;;
                --json) OUT_JSON="$2" ;;
                --png) OUT_PNG="$2" ;;
            esac
            shift 2 ;;
        --quick) QUICK=1; shift ;;
        --no-gloo) GLOO=0; shift ;;
        --profile) PROFILE=1; shift ;;
        --no-docs) DOCS=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
if [[ "$QUICK" -eq 1 ]]; then
    MIB="${MIB:-8}" REPEATS="${REPEATS:-2}" MTUS="${MTUS:-1500}" DOCS=0
fi
MIB="${MIB:-64}" REPEATS="${REPEATS:-5}" MTUS="${MTUS:-1500,9000}"
uint_in_range "$MIB" 1 1024 || die "--mib must be 1..1024, got '$MIB'"
uint_in_range "$REPEATS" 1 1000 || die "--repeats must be 1..1000, got '$REPEATS'"
uint_in_range "$TIMEOUT" 10 86400 || die "--timeout must be 10..86400 s, got '$TIMEOUT'"
IFS=, read -r -a MTU_LIST <<<"$MTUS"
IFS=, read -r -a DTYPE_LIST <<<"$DTYPES"
IFS=, read -r -a TRANSPORT_LIST <<<"$TRANSPORTS"
for m in "${MTU_LIST[@]}"; do
    uint_in_range "$m" 1280 9000 || die "--mtus: each MTU must be 1280..9000, got '$m'"
done
for d in "${DTYPE_LIST[@]}"; do
    [[ "$d" == f32 || "$d" == bf16 || "$d" == f16 ]] ||
        die "--dtypes: each must be f32, bf16 or f16, got '$d'"
done
for t in "${TRANSPORT_LIST[@]}"; do
    [[ "$t" == auto || "$t" == mmsg || "$t" == udp-gso ]] ||
        die "--transports: each must be auto, mmsg or udp-gso, got '$t'"
done
MIB=$((10#$MIB)); REPEATS=$((10#$REPEATS)); TIMEOUT=$((10#$TIMEOUT))
readonly MIB REPEATS TIMEOUT QUICK GLOO PROFILE MTU_LIST DTYPE_LIST TRANSPORT_LIST
readonly ELEMENTS=$((MIB * 1024 * 1024 / 4))

require_root "${ORIG_ARGS[@]}"
cd "$REPO_ROOT"

# --- cleanup ------------------------------------------------------------------------
TESTBED_MADE=0
SWITCHD_PID=""
BG_PIDS=()
MPI_TMP=""

testbed_down() {
    [[ "$TESTBED_MADE" -eq 1 ]] || return 0
    stop_testbed_processes "$PREFIX" "$WORKERS"
    bash "$REPO_ROOT/scripts/testbed.sh" down --prefix "$PREFIX" >/dev/null 2>&1 ||
        warn "testbed down failed; run: scripts/testbed.sh down --prefix $PREFIX"
    TESTBED_MADE=0
}

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${BG_PIDS[@]}"; do stop_pid "$pid"; done
    stop_pid "$SWITCHD_PID"
    testbed_down
    [[ -n "$MPI_TMP" && -d "$MPI_TMP" ]] && rm -rf -- "$MPI_TMP"
    if [[ -n "${RUN:-}" ]]; then
        rm -rf -- "${RUN:?}/bin"
        [[ "$rc" -eq 0 ]] || log "failed (status $rc); logs in $RUN"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_bg TIMEOUT PID...: wait for these background children; stop those
# still running after TIMEOUT s. False if any failed or timed out.
wait_bg() {
    local timeout="$1" pid ok=0 deadline
    shift
    deadline=$((SECONDS + timeout))
    for pid in "$@"; do
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
        if kill -0 "$pid" 2>/dev/null; then
            warn "pid $pid still running after $timeout s; stopping it"
            stop_pid "$pid"
            ok=1
        else
            wait "$pid" || ok=1
        fi
    done
    BG_PIDS=()
    return "$ok"
}

# --- install, build -----------------------------------------------------------------
ensure_debian_packages 1 "${PACKAGES[@]}"
[[ "$PROFILE" -eq 0 ]] || command -v perf >/dev/null 2>&1 || ensure_debian_packages 1 linux-perf
build_release
if [[ "$GLOO" -eq 1 ]] && ! "$VENV_PYTHON" -c "import torch" 2>/dev/null; then
    log "gloo needs torch in the project venv: running scripts/setup.sh (torch: about 80 s and 5 GB the first time)"
    bash "$REPO_ROOT/scripts/setup.sh" ||
        die "scripts/setup.sh failed; fix what it says, or pass --no-gloo"
    "$VENV_PYTHON" -c "import torch" || die "still no torch in $REPO_ROOT/.venv after scripts/setup.sh"
fi

STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
readonly STAMP
RUN="$REPO_ROOT/results/efficiency-$STAMP"
mkdir -p "$RUN/bin"
readonly RUN
cp "$REPO_ROOT/target/release/switchd" "$REPO_ROOT/target/release/switchctl" \
    "$REPO_ROOT/target/release/worker" "$RUN/bin/"
readonly SWITCHD="$RUN/bin/switchd" WORKER="$RUN/bin/worker"
readonly MPI_BIN="$RUN/bin/mpi_allreduce"
mpicc -O2 -o "$MPI_BIN" "$REPO_ROOT/bench/mpi_allreduce.c" || die "mpicc failed on bench/mpi_allreduce.c"
MPI_TMP="$(mktemp -d /tmp/eff-mpi.XXXXXX)"
readonly HOSTFILE="$RUN/hostfile" RSH="$RUN/netns-ssh.sh"
SECRET="$(random_secret)"
readonly SECRET
: >"$RUN/runs.jsonl"

# job_of DTYPE: the job id the config gives that dtype.
job_of() {
    case "$1" in f32) echo 1 ;; bf16) echo 2 ;; f16) echo 3 ;; esac
}

# write_config FILE: switchd on the testbed, one job of every worker per
# dtype (ids: job_of), written by `switchd testbed-config`.
write_config() {
    local file="$1" d id
    local -a jobs=()
    for d in "${DTYPE_LIST[@]}"; do
        id="$(job_of "$d")"
        jobs+=(--job "$id:all:env:AGGSWITCH_TESTBED_SECRET" --set "job.$id.dtype=$d")
    done
    AGGSWITCH_TESTBED_SECRET="$SECRET" "$SWITCHD" testbed-config --env "$TESTBED_ENV" \
        --out "$file" --writer "scripts/bench_efficiency.sh" "${jobs[@]}" ||
        die "switchd testbed-config failed for $file"
}

# record DIR MTU LINK METHOD DTYPE TRANSPORT: one line of the run manifest.
record() {
    jq -cn --arg dir "$1" --argjson mtu "$2" --arg link "$3" --arg method "$4" \
        --arg dtype "$5" --arg transport "$6" \
        '{dir: $dir, mtu: $mtu, link: $link, method: $method, dtype: $dtype, transport: $transport}' \
        >>"$RUN/runs.jsonl"
}

# run_switch DIR DTYPE TRANSPORT: the 4 workers at once, K all-reduces each.
run_switch() {
    local dir="$1" dtype="$2" transport="$3" r
    local -a pids=() extra=()
    [[ "$dtype" == f32 ]] || extra+=(--dtype "$dtype")
    [[ "$transport" == auto ]] || extra+=(--transport "$transport")
    mkdir -p "$dir"
    for ((r = 0; r < WORKERS; r++)); do
        AGGSWITCH_SECRET="$SECRET" ip netns exec "$PREFIX-w$r" "$WORKER" allreduce \
            --switch "$SWITCH_ADDR" --job "$(job_of "$dtype")" --rank "$r" --workers "$WORKERS" \
            --elements "$ELEMENTS" --warmup 1 --iterations "$REPEATS" --json --machine-cpu \
            "${extra[@]}" >"$dir/rank$r.json" 2>"$dir/rank$r.log" &
        pids+=("$!")
        BG_PIDS+=("$!")
    done
    wait_bg "$TIMEOUT" "${pids[@]}" ||
        die "switch all-reduce ($dtype, transport $transport) failed; see $dir/rank*.log"
}

# run_peer DIR KIND [DTYPE]: OpenMPI or gloo (gloo also bf16, as PyTorch's
# bf16_compress_hook), K timed all-reduces; JSON in DIR/peer.json.
run_peer() {
    local dir="$1" kind="$2" dtype="${3:-f32}" r pid
    local -a pids=()
    mkdir -p "$dir"
    case "$kind" in
        openmpi)
            (cd "$dir" && run_mpirun "$PREFIX" "$WORKERS" "$HOSTFILE" "$RSH" "$MPI_TMP" \
                "$MPI_BIN" "$ELEMENTS" "$REPEATS") >"$dir/peer.out" 2>"$dir/peer.log" &
            pids+=("$!") ;;
        gloo)
            for ((r = 0; r < WORKERS; r++)); do
                ip netns exec "$PREFIX-w$r" env RANK="$r" WORLD_SIZE="$WORKERS" \
                    MASTER_ADDR="$(tb worker_0_addr)" MASTER_PORT="$GLOO_PORT" \
                    GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
                    "$VENV_PYTHON" "$REPO_ROOT/bench/gloo_allreduce.py" "$ELEMENTS" "$REPEATS" "$dtype" \
                    >"$dir/rank$r.out" 2>"$dir/rank$r.log" &
                pids+=("$!")
            done
            ;;
    esac
    BG_PIDS+=("${pids[@]}")
    wait_bg "$TIMEOUT" "${pids[@]}" || die "$kind all-reduce failed; see $dir"
    for pid in "$dir"/peer.out "$dir"/rank0.out; do
        [[ -s "$pid" ]] || continue
        grep -E '^\{' "$pid" | tail -n 1 >"$dir/peer.json"
    done
    [[ -s "$dir/peer.json" ]] || die "$kind printed no JSON; see $dir"
    [[ "$(jq -r .verified "$dir/peer.json")" == true ]] || die "$kind gave a wrong sum; see $dir"
}

# profiled CMD...: CMD under a system-wide perf record; summaries by process
# (comm) and by process and symbol into RUN/profile-{comm,sym}.txt.
profiled() {
    local pid data="$RUN/perf.data"
    perf record -a -g -q -o "$data" >"$RUN/perf-record.log" 2>&1 &
    pid=$!
    BG_PIDS+=("$pid")
    sleep 0.5
    "$@"
    kill -INT "$pid" 2>/dev/null || true
    wait_bg 60 "$pid" || warn "perf record did not end cleanly; see $RUN/perf-record.log"
    perf report -i "$data" --no-children --sort comm --stdio >"$RUN/profile-comm.txt" 2>/dev/null ||
        warn "perf report failed"
    perf report -i "$data" --no-children --sort comm,sym --stdio -g none \
        --percent-limit 0.7 >"$RUN/profile-sym.txt" 2>/dev/null || warn "perf report failed"
    rm -f -- "$data"
    log "profile: $RUN/profile-comm.txt, $RUN/profile-sym.txt"
}

# measure MTU LINK: every method on the testbed as it is now.
measure() {
    local mtu="$1" link="$2" base="$RUN/mtu$1/$2" d t
    log "[MTU $mtu, $link] OpenMPI with TSO"
    set_worker_tx "$PREFIX" "$WORKERS" on
    run_peer "$base/openmpi_tso" openmpi
    record "$base/openmpi_tso" "$mtu" "$link" openmpi_tso f32 tcp
    if [[ "$GLOO" -eq 1 ]]; then
        log "[MTU $mtu, $link] gloo with TSO"
        run_peer "$base/gloo_tso" gloo
        record "$base/gloo_tso" "$mtu" "$link" gloo_tso f32 tcp
        if [[ " ${DTYPE_LIST[*]} " == *" bf16 "* ]]; then
            log "[MTU $mtu, $link] gloo with TSO, bf16 (PyTorch's bf16 compression)"
            run_peer "$base/gloo_tso_bf16" gloo bf16
            record "$base/gloo_tso_bf16" "$mtu" "$link" gloo_tso bf16 tcp
        fi
    fi
    set_worker_tx "$PREFIX" "$WORKERS" off
    start_switchd "$PREFIX-sw" "$SWITCHD" "$base/switchd.log" run --config "$RUN/switchd.toml"
    for d in "${DTYPE_LIST[@]}"; do
        for t in "${TRANSPORT_LIST[@]}"; do
            # One transport is enough to show what the narrower type saves.
            [[ "$d" != f32 && "$t" != "${TRANSPORT_LIST[0]}" ]] && continue
            log "[MTU $mtu, $link] switch, $d, transport $t"
            run_switch "$base/switch-$d-$t" "$d" "$t"
            record "$base/switch-$d-$t" "$mtu" "$link" switch "$d" "$t"
        done
    done
    if [[ "$PROFILE" -eq 1 && "$mtu" == "$PROFILED_MTU" && "$link" == unlimited ]]; then
        # An extra run: perf's own cost must not reach the measured ones.
        log "[MTU $mtu, $link] switch, f32, transport ${TRANSPORT_LIST[0]}, under perf record"
        profiled run_switch "$base/profile-run" f32 "${TRANSPORT_LIST[0]}"
    fi
    stop_pid "$SWITCHD_PID"
    SWITCHD_PID=""
}

PROFILED_MTU="$(printf '%s\n' "${MTU_LIST[@]}" | sort -n | tail -n 1)"
readonly PROFILED_MTU
log "run $STAMP: $WORKERS workers, $MIB MiB, $REPEATS all-reduces per measurement; MTUs ${MTU_LIST[*]}; logs in $RUN"
for mtu in "${MTU_LIST[@]}"; do
    TESTBED_MADE=1
    testbed_up "$RUN/testbed-mtu$mtu.env" --prefix "$PREFIX" --workers "$WORKERS" --mtu "$mtu" \
        2>"$RUN/testbed-mtu$mtu.log"
    SWITCH_ADDR="$(tb switch_addr)"
    write_config "$RUN/switchd.toml"
    write_mpi_hosts "$WORKERS" "$HOSTFILE" "$RSH" "$MPI_TMP"
    measure "$mtu" unlimited
    shape_worker_links "$PREFIX" "$WORKERS" "${TBF_ARGS[@]}"
    measure "$mtu" 1gbit
    testbed_down
done

# --- report -------------------------------------------------------------------------
OUT_JSON="${OUT_JSON:-$REPO_ROOT/results/efficiency-$STAMP.json}"
OUT_PNG="${OUT_PNG:-$REPO_ROOT/results/efficiency-$STAMP.png}"
PLOT_PYTHON=/usr/bin/python3
[[ -x "$PLOT_PYTHON" ]] || PLOT_PYTHON=python3
"$PLOT_PYTHON" "$REPO_ROOT/bench/harness/bench_efficiency_report.py" \
    --runs "$RUN/runs.jsonl" --stamp "$STAMP" --mib "$MIB" --repeats "$REPEATS" \
    --workers "$WORKERS" --json "$OUT_JSON" --png "$OUT_PNG" --table "$RUN/table.md" ||
    die "bench/harness/bench_efficiency_report.py failed"
cat "$RUN/table.md"
if [[ "$DOCS" -eq 1 ]]; then
    cp "$OUT_JSON" "$REPO_ROOT/bench/results/bench-efficiency.json"
    cp "$OUT_PNG" "$REPO_ROOT/bench/results/bench-efficiency.png"
    log "wrote bench/results/bench-efficiency.{json,png}, $OUT_JSON and $OUT_PNG"
else
    log "wrote $OUT_JSON and $OUT_PNG (bench/results/ left alone)"
fi
