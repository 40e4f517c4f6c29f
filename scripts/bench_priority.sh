#!/usr/bin/env bash
#
# bench_priority.sh: does a short job declared `priority = "high"` finish
# about as fast beside a long job as alone, and does the long job keep its
# throughput? (issue 23, priorities between jobs.)
#
# Makes a testbed of 2 workers and 1 host (scripts/testbed.sh, prefix
# "prio"), shapes both worker links to 1 Gbit/s each way as bench.sh does
# (shape_worker_links in lib.sh), and runs switchd with three jobs over the
# same two worker namespaces, so that they share each worker's links:
#
#   job 1  the long job     priority "normal", far more all-reduces than the run
#   job 2  the short job    priority "normal" (the long job's class)
#   job 3  the short job    priority "high"
#
# Five windows of --window seconds each, one after the other, each with a
# sockperf UDP probe from prio-w0 to prio-h0 (open loop, --mps messages per
# second; its requests share prio-w0's egress with both jobs' DATA) and the
# switch's counters at its start and end:
#
#   short_alone     the short job (job 2) alone
#   long_alone      the long job alone (started before, past its slow start)
#   short_equal     the short job (job 2) beside the long job
#   short_priority  the short job (job 3, high) beside the long job
#   long_after      the long job alone again (its baseline is the mean of
#                   long_alone and long_after, so a drift of the machine's
#                   load over the run weighs on both sides)
#
# The short job is --iterations all-reduces of --elements float32 on each
# rank. bench/harness/bench_priority_report.py computes the short job's completion
# time and p99 per all-reduce, the long job's throughput in each window, the
# probe's p99, and the two ratios of the goal:
#   short_job_with_priority_over_alone  (goal <= 1.3)
#   long_job_throughput_kept            (goal >= 0.8: the long job's
#       throughput over the short_priority window over its baseline)
# and writes the table, results/priority-STAMP.json and .png.
#
# Usage:
#   sudo scripts/bench_priority.sh [--window S] [--iterations N] [--elements E]
#                                  [--mps M] [--rate MBIT] [--no-build]
#
#   --window S      seconds of each window (default 10; a window with a short
#                   job lasts until it is done if that takes longer)
#   --iterations N  the short job's all-reduces (default 20)
#   --elements E    float32 elements per all-reduce (default 1048576: 4 MiB)
#   --mps M         probe messages per second (default 1000)
#   --rate MBIT     worker link rate, each way (default 1000: 1 Gbit/s)
#   --no-build      use target/release as it is
#
# Everything runs in the namespaces prio-sw, prio-w0, prio-w1, prio-h0;
# every process started is stopped by PID and the testbed removed on exit,
# also on failure or Ctrl-C. Raw outputs stay under results/priority-STAMP/.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly PREFIX=prio
readonly WORKERS=2
readonly AGG_PORT=48879
readonly SOCKPERF_PORT=11111
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=10
# Seconds a short job may run past its window before the run fails.
readonly SHORT_TIMEOUT=300

usage() {
    sed -n '3,/^$/s/^# \{0,1\}//p' "$0"
}

ORIG_ARGS=("$@")
WINDOW=10
ITERATIONS=20
ELEMENTS=1048576
MPS=1000
RATE_MBIT=1000
BUILD=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --window|--iterations|--elements|--mps|--rate)
            [[ $# -ge 2 ]] || die "$1 needs a value"
            case "$1" in
                --window) WINDOW="$2" ;;
                --iterations) ITERATIONS="$2" ;;
                --elements) ELEMENTS="$2" ;;
                --mps) MPS="$2" ;;
                --rate) RATE_MBIT="$2" ;;
            esac
            shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
uint_in_range "$WINDOW" 2 600 || die "--window must be 2..600 seconds, got '$WINDOW'"
uint_in_range "$ITERATIONS" 1 100000 || die "--iterations must be 1..100000, got '$ITERATIONS'"
uint_in_range "$ELEMENTS" 1 268435456 || die "--elements must be 1..268435456, got '$ELEMENTS'"
uint_in_range "$MPS" 1 100000 || die "--mps must be 1..100000, got '$MPS'"
uint_in_range "$RATE_MBIT" 1 100000 || die "--rate must be 1..100000 (Mbit/s), got '$RATE_MBIT'"
WINDOW=$((10#$WINDOW)); ITERATIONS=$((10#$ITERATIONS)); ELEMENTS=$((10#$ELEMENTS)); MPS=$((10#$MPS))
RATE_MBIT=$((10#$RATE_MBIT))
readonly WINDOW ITERATIONS ELEMENTS MPS BUILD RATE_MBIT
readonly TBF_ARGS=(rate "${RATE_MBIT}mbit" burst 256kb latency 50ms)

require_root "${ORIG_ARGS[@]}"
cd "$REPO_ROOT"

# --- cleanup --------------------------------------------------------------------
RESULTS_DIR=""
BIN_DIR=""
TESTBED_MADE=0
SWITCHD_PID=""
SERVER_PID=""
CLIENT_PID=""
LONG_PIDS=()
SHORT_PIDS=()

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${SHORT_PIDS[@]}" "${LONG_PIDS[@]}" "$CLIENT_PID" "$SERVER_PID" "$SWITCHD_PID"; do
        stop_pid "$pid"
    done
    if [[ "$TESTBED_MADE" -eq 1 ]]; then
        bash "$REPO_ROOT/scripts/testbed.sh" down --prefix "$PREFIX" >/dev/null 2>&1 ||
            warn "testbed down failed; run: scripts/testbed.sh down --prefix $PREFIX"
    fi
    if [[ -n "$BIN_DIR" && -d "$BIN_DIR" ]]; then
        rm -rf -- "$BIN_DIR"
    fi
    if [[ -n "$RESULTS_DIR" && -d "$RESULTS_DIR" ]]; then
        log "logs and raw outputs in ${RESULTS_DIR#"$REPO_ROOT"/}"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- tools and binaries -----------------------------------------------------------
# The report's Python: BENCH_PYTHON, else one with matplotlib (find_python),
# else python3 (the report then writes no PNG and says so).
if [[ -n "${BENCH_PYTHON:-}" ]]; then
    PYTHON="$BENCH_PYTHON"
    ensure_debian_packages 1 sockperf iproute2 jq
else
    ensure_debian_packages 1 sockperf python3-matplotlib iproute2 jq
fi
if ((BUILD == 1)); then
    build_release
fi
# Private copies: a rebuild of target/ during the run must not change what
# is measured.
BIN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/prio-bin.XXXXXX")"
for b in switchd switchctl worker; do
    [[ -x "$REPO_ROOT/target/release/$b" ]] ||
        die "target/release/$b missing (build with: cargo build --release --workspace --bins)"
    cp "$REPO_ROOT/target/release/$b" "$BIN_DIR/$b"
done
SWITCHD="$BIN_DIR/switchd"
SWITCHCTL="$BIN_DIR/switchctl"
WORKER="$BIN_DIR/worker"

STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
RESULTS_DIR="$REPO_ROOT/results/priority-$STAMP"
mkdir -p "$RESULTS_DIR"
CFG="$RESULTS_DIR/switchd.toml"
ADMIN_SOCK="$RESULTS_DIR/switchd.sock"

# --- testbed, switchd, probe server -----------------------------------------------
TESTBED_MADE=1
testbed_up "$RESULTS_DIR/testbed.env" --prefix "$PREFIX" --workers "$WORKERS" --hosts 1 2>/dev/null
SWITCH_ADDR="$(tb switch_addr)"
HOST_ADDR="$(tb host_0_addr)"
readonly SWITCH_ADDR HOST_ADDR
shape_worker_links "$PREFIX" "$WORKERS" "${TBF_ARGS[@]}"
log "worker links shaped: ${TBF_ARGS[*]}, each way"

SECRET="$(random_secret)"
# Jobs 1 and 2 (normal) and 3 (high), each of both workers: written by
# switchd itself (typed config, the testbed's addresses), mode 0600.
AGGSWITCH_TESTBED_SECRET="$SECRET" "$SWITCHD" testbed-config --env "$TESTBED_ENV" --out "$CFG" \
    --writer scripts/bench_priority.sh --host-ports \
    --job 1:all:env:AGGSWITCH_TESTBED_SECRET --job 2:all:env:AGGSWITCH_TESTBED_SECRET \
    --job 3:all:env:AGGSWITCH_TESTBED_SECRET --set job.3.priority=high \
    --set "switch.agg_port=$AGG_PORT" --set "switch.admin_socket=\"$ADMIN_SOCK\"" ||
    die "switchd testbed-config failed"

log "starting switchd in $PREFIX-sw"
start_switchd "$PREFIX-sw" "$SWITCHD" "$RESULTS_DIR/switchd.log" run --config "$CFG"

ip netns exec "$PREFIX-h0" sockperf server -i "$HOST_ADDR" -p "$SOCKPERF_PORT" \
    >"$RESULTS_DIR/sockperf-server.log" 2>&1 &
SERVER_PID=$!
sleep 0.5
kill -0 "$SERVER_PID" 2>/dev/null || { cat "$RESULTS_DIR/sockperf-server.log" >&2; die "sockperf server exited"; }

switch_stats() {
    "$SWITCHCTL" --socket "$ADMIN_SOCK" stats --json 2>/dev/null || echo '{}'
}

# job_active ID: true when job ID has every rank joined.
job_active() {
    [[ "$(switch_stats | jq --argjson id "$1" '[.jobs[]? | select(.id == $id and .state == "active")] | length')" -ge 1 ]]
}

# start_workers ID ITERATIONS OUT_PREFIX ARRAY [--verify]: both ranks of job
# ID in the two worker namespaces, children of this shell; their PIDs go
# into ARRAY. The short job verifies its sums; the long one does not (it
# would spend the shared CPU generating and checking patterns).
start_workers() {
    local id="$1" iters="$2" out="$3" r
    local -n pids="$4"
    local -a verify=("${@:5}")
    pids=()
    for ((r = 0; r < WORKERS; r++)); do
        AGGSWITCH_SECRET="$SECRET" ip netns exec "$PREFIX-w$r" "$WORKER" allreduce \
            --switch "$SWITCH_ADDR" --job "$id" --rank "$r" --workers "$WORKERS" \
            --elements "$ELEMENTS" --iterations "$iters" "${verify[@]}" --json \
            >"$out.w$r.json" 2>"$out.w$r.log" &
        pids+=($!)
    done
}

# window NAME [SHORT_JOB]: one measurement window (probe + switch counters),
# with the short job SHORT_JOB started at its beginning.
window() {
    local name="$1" short="${2:-}" pid rc t_end
    log "window '$name' (${WINDOW} s)${short:+: short job $short}"
    switch_stats >"$RESULTS_DIR/$name.switch-start.json"
    date +%s.%N >"$RESULTS_DIR/$name.t0"
    ip netns exec "$PREFIX-w0" sockperf under-load -i "$HOST_ADDR" -p "$SOCKPERF_PORT" \
        -t "$WINDOW" --msg-size 64 --mps "$MPS" --reply-every 1 \
        >"$RESULTS_DIR/$name.sockperf.txt" 2>&1 &
    CLIENT_PID=$!
    SHORT_PIDS=()
    if [[ -n "$short" ]]; then
        start_workers "$short" "$ITERATIONS" "$RESULTS_DIR/$name.short" SHORT_PIDS --verify
    fi
    t_end=$((SECONDS + WINDOW))
    rc=0
    wait "$CLIENT_PID" || rc=$?
    CLIENT_PID=""
    ((rc == 0)) || warn "window '$name': sockperf exited with status $rc"
    # The window lasts WINDOW seconds, or until the short job is done if it
    # takes longer (the long job's throughput is over the whole of it).
    while ((SECONDS < t_end)); do sleep 0.05; done
    for pid in "${SHORT_PIDS[@]}"; do
        while kill -0 "$pid" 2>/dev/null; do
            ((SECONDS < t_end + SHORT_TIMEOUT)) ||
                die "window '$name': the short job did not finish within $((WINDOW + SHORT_TIMEOUT)) s"
            sleep 0.05
        done
    done
    switch_stats >"$RESULTS_DIR/$name.switch-end.json"
    date +%s.%N >"$RESULTS_DIR/$name.t1"
    for pid in "${SHORT_PIDS[@]}"; do
        rc=0
        wait "$pid" || rc=$?
        ((rc == 0)) || die "window '$name': a short-job worker failed (status $rc, see ${RESULTS_DIR#"$REPO_ROOT"/}/$name.short.w*.log)"
    done
    SHORT_PIDS=()
}

window short_alone 2

log "starting the long job (job 1)"
start_workers 1 100000000 "$RESULTS_DIR/long" LONG_PIDS
deadline=$((SECONDS + READY_TIMEOUT))
until job_active 1; do
    ((SECONDS < deadline)) || die "the long job did not become active within $READY_TIMEOUT s"
    sleep 0.1
done
sleep 2  # past slow start

window long_alone
window short_equal 2
window short_priority 3
window long_after

for pid in "${LONG_PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || die "the long job's worker $pid exited during the run (see ${RESULTS_DIR#"$REPO_ROOT"/}/long.w*.log)"
    stop_pid "$pid"
done
LONG_PIDS=()

LOAD="$(cut -d' ' -f1-3 /proc/loadavg)"
jq -n --arg stamp "$STAMP" --arg commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --arg tbf "${TBF_ARGS[*]}" --arg load "$LOAD" --argjson window "$WINDOW" \
    --argjson iterations "$ITERATIONS" --argjson elements "$ELEMENTS" --argjson mps "$MPS" \
    --argjson cpus "$(nproc)" \
    '{stamp: $stamp, commit: $commit, link: $tbf, loadavg_at_end: $load, window_s: $window,
      short_iterations: $iterations, elements: $elements, probe_mps: $mps, cpus: $cpus}' \
    >"$RESULTS_DIR/meta.json"

[[ -n "${PYTHON:-}" ]] || PYTHON=python3
"$PYTHON" "$REPO_ROOT/bench/harness/bench_priority_report.py" "$RESULTS_DIR" \
    "$REPO_ROOT/results/priority-$STAMP.json" "$REPO_ROOT/results/priority-$STAMP.png"
