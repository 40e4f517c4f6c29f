#!/usr/bin/env bash
#
# bench_transports.sh: the worker's UDP data paths compared on one veth
# testbed, interleaved run by run: all-reduce time and the whole machine's
# CPU-seconds per transport.
#
# Usage:
#   scripts/bench_transports.sh [--prefix gs] [--workers 4] [--elements N]
#                               [--iterations K] [--runs R]
#                               [--transports "mmsg udp-gso"] [--worker-tx off|on]
#
#   --prefix P      testbed namespace prefix (default gs)
#   --workers W     ranks, one namespace each (default 4)
#   --elements N    float32 elements per tensor (default 16777216: 64 MiB)
#   --iterations K  all-reduces per worker run (default 3)
#   --runs R        runs per transport, interleaved (default 3)
#   --transports T  the transports to compare, space-separated
#   --worker-tx X   transmit checksum offload of the workers' eth0 (default
#                   off, as testbed.sh leaves it; with "on" a veth puts
#                   partial checksums in the frames, which switchd drops as
#                   bad_udp_checksum: the all-reduces stall)
#
# Per run it prints one JSON line: the transport, the slowest rank's seconds
# for the K all-reduces, the CPU-seconds of the whole machine from the
# workers' start to their end (user+nice+system+irq+softirq+steal jiffies of
# /proc/stat over all CPUs / CLK_TCK; on a shared machine this counts the
# others' work too), that window's wall seconds, the CPU-seconds of the
# worker processes themselves (user+system, with the softirq work their
# sends run inline) and of switchd in the window, and the ranks' coalescing
# counters; then the medians per transport. bench/harness/bench_transports_report.py
# does that arithmetic from the raw readings this script leaves in its
# folder (the workers' JSON and each window's edges). The testbed is
# removed at the end, also on failure. Needs root and
# target/release/{switchd,worker}.

set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PREFIX=gs WORKERS=4 ELEMENTS=16777216 ITERATIONS=3 RUNS=3
TRANSPORTS="mmsg udp-gso" WORKER_TX=off
while (($# > 0)); do
    case "$1" in
        --prefix) PREFIX="$2"; shift 2 ;;
        --workers) WORKERS="$2"; shift 2 ;;
        --elements) ELEMENTS="$2"; shift 2 ;;
        --iterations) ITERATIONS="$2"; shift 2 ;;
        --runs) RUNS="$2"; shift 2 ;;
        --transports) TRANSPORTS="$2"; shift 2 ;;
        --worker-tx) WORKER_TX="$2"; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
for v in WORKERS ELEMENTS ITERATIONS RUNS; do
    is_uint "${!v}" || die "--${v,,} must be a number, got ${!v}"
done
[[ "$WORKER_TX" == on || "$WORKER_TX" == off ]] || die "--worker-tx is on or off"
require_root
SWITCHD="$REPO_ROOT/target/release/switchd"
WORKER="$REPO_ROOT/target/release/worker"
[[ -x "$SWITCHD" && -x "$WORKER" ]] ||
    die "build first: cargo build --release -p switchd -p agg-worker --bins"

OUT="$(mktemp -d "/tmp/bench-transports.XXXXXX")"
SWITCHD_PID=""
WORKER_PIDS=()
cleanup() {
    local p
    for p in "${WORKER_PIDS[@]}"; do stop_pid "$p" 2; done
    stop_pid "$SWITCHD_PID"
    bash "$REPO_ROOT/scripts/testbed.sh" down --prefix "$PREFIX" >/dev/null 2>&1 ||
        warn "testbed.sh down --prefix $PREFIX failed"
}
trap cleanup EXIT

testbed_up "$OUT/testbed.env" --workers "$WORKERS" --prefix "$PREFIX" 2>/dev/null
set_worker_tx "$PREFIX" "$WORKERS" "$WORKER_TX"
SECRET="$(random_secret)"
# Its own admin socket: another switchd may hold the default one.
write_testbed_switchd_config "$OUT/switchd.toml" "$SCRIPT_NAME" "$WORKERS" "$SECRET" \
    "admin_socket = \"$OUT/switchd.sock\""
start_switchd "$PREFIX-sw" "$SWITCHD" "$OUT/switchd.log" run --config "$OUT/switchd.toml"

# mark FILE PART...: one edge of a run's window, a "PART VALUE" line per
# part in the order given (the innermost nearest the workers): wall (the
# clock), stat (/proc/stat's cpu line), switchd (its /proc/PID/stat) and
# children (the children's line of `times`: user+system of this shell's
# waited-for children, i.e. the workers; `times` writes to a file, because
# in a command substitution it would report the substitution's own).
mark() {
    local f="$1" p
    shift
    : >"$f"
    for p in "$@"; do
        case "$p" in
            wall) echo "wall $(date +%s.%N)" ;;
            stat) echo "stat $(head -n 1 /proc/stat)" ;;
            switchd) echo "switchd $(<"/proc/$SWITCHD_PID/stat")" ;;
            children) times >"$OUT/times"; echo "children $(tail -n 1 "$OUT/times")" ;;
        esac >>"$f"
    done
}

# one_run TRANSPORT RUN: the workers at once; prints the run's JSON line.
one_run() {
    local t="$1" run="$2" r rc=0
    mark "$OUT/$t-$run.before" children switchd wall stat
    WORKER_PIDS=()
    for ((r = 0; r < WORKERS; r++)); do
        AGGSWITCH_SECRET="$SECRET" ip netns exec "$PREFIX-w$r" "$WORKER" allreduce --switch "$(tb switch_addr)" --job 1 \
            --rank "$r" --workers "$WORKERS" --elements "$ELEMENTS" \
            --iterations "$ITERATIONS" --transport "$t" --json \
            >"$OUT/$t-$run-rank$r.json" 2>"$OUT/$t-$run-rank$r.log" &
        WORKER_PIDS+=("$!")
    done
    for r in "${!WORKER_PIDS[@]}"; do
        wait "${WORKER_PIDS[r]}" || rc=$?
    done
    WORKER_PIDS=()
    mark "$OUT/$t-$run.after" stat wall switchd children
    ((rc == 0)) || die "a worker failed ($t run $run, status $rc); see $OUT"
    python3 "$REPO_ROOT/bench/harness/bench_transports_report.py" run "$OUT" "$t" "$run" --workers "$WORKERS" ||
        die "bench/harness/bench_transports_report.py run failed on $OUT ($t run $run)"
}

for ((run = 0; run < RUNS; run++)); do
    for t in $TRANSPORTS; do
        one_run "$t" "$run" | tee -a "$OUT/runs.jsonl"
    done
done
python3 "$REPO_ROOT/bench/harness/bench_transports_report.py" summary "$OUT/runs.jsonl" ||
    die "bench/harness/bench_transports_report.py summary failed on $OUT/runs.jsonl"
log "worker tx offload $WORKER_TX; runs in $OUT"
