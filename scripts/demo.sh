#!/usr/bin/env bash
#
# demo.sh: the whole thing in one command. Builds the switch and the worker,
# makes a testbed (scripts/testbed.sh, prefix "agg"), starts switchd in the
# switch namespace, runs an all-reduce of float32 tensors across the workers
# through it (verified), pings between two plain hosts meanwhile to show that
# ordinary traffic crosses the same switch, then prints a table of per-rank
# time, throughput and verification, the switch's main counters
# (bench/harness/demo_report.py), the path of the full JSON and DEMO PASSED /
# DEMO FAILED.
#
# Usage:
#   sudo scripts/demo.sh [--workers 4] [--hosts 2] [--mib 64] [--iterations 5]
#                        [--queues 1] [--mtu 1500] [--timeout 600] [--prefix agg]
#                        [--keep-logs] [--json FILE]
#   sudo scripts/demo.sh --leaves L --spines K [--workers W per leaf] ...
#                        the demo over an aggregation tree: scripts/demo_tree.sh
#
#   --workers N     ranks in the job (1..64), each in namespace agg-wI
#   --hosts M       plain hosts agg-hJ (the ping needs 2; 0 or 1 skips it)
#   --mib S         tensor size per worker in MiB of float32 (S*1024*1024/4
#                   elements)
#   --iterations K  all-reduce rounds per worker
#   --queues Q      veth queues (testbed.sh --queues)
#   --mtu M         MTU of every testbed link, 576..9000 (testbed.sh --mtu);
#                   switchd sizes its chunks from it (2233 floats at 9000)
#   --timeout T     seconds the workers get before they are stopped
#   --prefix P      testbed namespace prefix (default agg: agg-sw, agg-w0, ...)
#   --keep-logs     keep the folder of logs and config also on success
#   --json FILE     where the full JSON goes: every worker's report and the
#                   switch's counters (default results/demo-STAMP.json)
#
# Exits 0 only if every worker exited 0 and reported "verified": true.
# Everything it starts is stopped by PID, and the testbed removed, on exit.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SWITCH_ADDR=""  # the testbed's (tb switch_addr), once it is up
readonly AGG_PORT=48879
readonly JOB_ID=1
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=15

ORIG_ARGS=("$@")
# An aggregation tree is its own demo.
for arg in "$@"; do
    if [[ "$arg" == --leaves || "$arg" == --spines ]]; then
        exec bash "$(dirname "${BASH_SOURCE[0]}")/demo_tree.sh" "$@"
    fi
done
PREFIX=agg
WORKERS=4
HOSTS=2
MIB=64
ITERATIONS=5
QUEUES=1
MTU=1500
TIMEOUT=600
KEEP_LOGS=0
JSON_OUT=""

while [[ $# -gt 0 ]]; do
    case "$1" in
        --workers|--hosts|--mib|--iterations|--queues|--mtu|--timeout|--prefix|--json)
            [[ $# -ge 2 ]] || die "$1 needs a value"
            case "$1" in
                --workers) WORKERS="$2" ;;
                --hosts) HOSTS="$2" ;;
                --mib) MIB="$2" ;;
                --iterations) ITERATIONS="$2" ;;
                --queues) QUEUES="$2" ;;
                --mtu) MTU="$2" ;;
                --timeout) TIMEOUT="$2" ;;
                --prefix) PREFIX="$2" ;;
                --json) JSON_OUT="$2" ;;
            esac
            shift 2 ;;
        --keep-logs) KEEP_LOGS=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
uint_in_range "$WORKERS" 1 64 || die "--workers must be 1..64, got '$WORKERS'"
uint_in_range "$HOSTS" 0 155 || die "--hosts must be 0..155, got '$HOSTS'"
uint_in_range "$MIB" 1 4096 || die "--mib must be 1..4096, got '$MIB'"
uint_in_range "$ITERATIONS" 1 1000000 || die "--iterations must be >= 1, got '$ITERATIONS'"
uint_in_range "$QUEUES" 1 256 || die "--queues must be 1..256, got '$QUEUES'"
uint_in_range "$MTU" 576 9000 || die "--mtu must be 576..9000, got '$MTU'"
uint_in_range "$TIMEOUT" 1 86400 || die "--timeout must be 1..86400 s, got '$TIMEOUT'"
WORKERS=$((10#$WORKERS)); HOSTS=$((10#$HOSTS)); MIB=$((10#$MIB))
ITERATIONS=$((10#$ITERATIONS)); QUEUES=$((10#$QUEUES)); TIMEOUT=$((10#$TIMEOUT))
MTU=$((10#$MTU))
readonly ELEMENTS=$((MIB * 1024 * 1024 / 4))

[[ "$PREFIX" =~ ^[A-Za-z0-9_][A-Za-z0-9_-]{0,30}$ ]] || die "bad --prefix '$PREFIX'"
readonly PREFIX
require_root "${ORIG_ARGS[@]}"
if [[ -z "$JSON_OUT" ]]; then
    JSON_OUT="$REPO_ROOT/results/demo-$(date -u +%Y%m%dT%H%M%SZ).json"
elif [[ "$JSON_OUT" != /* ]]; then
    JSON_OUT="$PWD/$JSON_OUT"
fi
readonly JSON_OUT
cd "$REPO_ROOT"

# --- cleanup --------------------------------------------------------------------
WORK=""
TESTBED_MADE=0
SWITCHD_PID=""
PING_PID=""
WORKER_PIDS=()
PASSED=0

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${WORKER_PIDS[@]}" "$PING_PID" "$SWITCHD_PID"; do
        stop_pid "$pid"
    done
    if [[ "$TESTBED_MADE" -eq 1 ]]; then
        bash "$REPO_ROOT/scripts/testbed.sh" down --prefix "$PREFIX" >/dev/null 2>&1 ||
            warn "testbed down failed; run: scripts/testbed.sh down --prefix $PREFIX"
    fi
    if [[ -n "$WORK" && -d "$WORK" ]]; then
        if [[ "$PASSED" -eq 1 && "$KEEP_LOGS" -eq 0 ]]; then
            rm -rf -- "$WORK"
        else
            log "logs, config and outputs kept in $WORK"
        fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- build and testbed ------------------------------------------------------------
log "checking the tools (scripts/setup.sh)"
bash "$REPO_ROOT/scripts/setup.sh"
build_release
SWITCHD="$REPO_ROOT/target/release/switchd"
WORKER="$REPO_ROOT/target/release/worker"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/agg-demo.XXXXXX")"
CFG="$WORK/switchd.toml"
STATS="$WORK/stats.json"
SWITCHD_LOG="$WORK/switchd.log"

TESTBED_MADE=1
testbed_up "$WORK/testbed.env" --prefix "$PREFIX" --workers "$WORKERS" \
    --hosts "$HOSTS" --queues "$QUEUES" --mtu "$MTU"
SWITCH_ADDR="$(tb switch_addr)"

# --- switchd config -------------------------------------------------------------
# A fresh random job secret (32 bytes, hex) for this run; written by switchd
# itself (its typed config, the testbed's addresses), mode 0600.
SECRET="$(random_secret)"
AGGSWITCH_TESTBED_SECRET="$SECRET" "$SWITCHD" testbed-config --env "$TESTBED_ENV" --out "$CFG" \
    --writer scripts/demo.sh --host-ports --job "$JOB_ID:all:env:AGGSWITCH_TESTBED_SECRET" \
    --set "switch.agg_port=$AGG_PORT" || die "switchd testbed-config failed"

# --- switchd ----------------------------------------------------------------------
log "starting switchd in $PREFIX-sw (log: $SWITCHD_LOG)"
start_switchd "$PREFIX-sw" "$SWITCHD" "$SWITCHD_LOG" run --config "$CFG" --stats-file "$STATS"
log "switchd ready (pid $SWITCHD_PID)"

# --- workers, and a ping alongside ----------------------------------------------
log "all-reduce: $WORKERS workers x $ELEMENTS float32 ($MIB MiB) x $ITERATIONS iterations"
for ((i = 0; i < WORKERS; i++)); do
    AGGSWITCH_SECRET="$SECRET" ip netns exec "$PREFIX-w$i" "$WORKER" allreduce \
        --switch "$SWITCH_ADDR" --job "$JOB_ID" --rank "$i" --workers "$WORKERS" \
        --elements "$ELEMENTS" --iterations "$ITERATIONS" \
        --verify --json >"$WORK/worker$i.json" 2>"$WORK/worker$i.log" &
    WORKER_PIDS[i]=$!
done

PING_RESULT="not run (needs --hosts 2 or more)"
if ((HOSTS >= 2)); then
    PING_TO="$(tb host_1_addr)"
    ip netns exec "$PREFIX-h0" ping -c 5 -i 0.2 -W 2 "$PING_TO" >"$WORK/ping.log" 2>&1 &
    PING_PID=$!
fi

# Wait for every worker, up to the timeout; collect each exit status.
declare -A STATUS=()
wait_workers "$WORKERS" "$TIMEOUT"

if [[ -n "$PING_PID" ]]; then
    rc=0
    wait "$PING_PID" || rc=$?
    PING_PID=""
    received="$(sed -n 's/.* \([0-9]*\) received.*/\1/p' "$WORK/ping.log")"
    if [[ "$rc" -eq 0 && "${received:-0}" -gt 0 ]]; then
        PING_RESULT="yes: $PREFIX-h0 -> $PING_TO, ${received}/5 replies"
    else
        PING_RESULT="NO: $PREFIX-h0 -> $PING_TO, ${received:-0}/5 replies (see $WORK/ping.log)"
    fi
fi

# --- stop switchd; it writes its counters on exit ----------------------------------
log "stopping switchd (SIGTERM to pid $SWITCHD_PID)"
stop_pid "$SWITCHD_PID"
SWITCHD_RC=$STOP_RC
SWITCHD_PID=""

# --- summary ----------------------------------------------------------------------
# The tables and the full JSON: bench/harness/demo_report.py (exit 0 = every rank
# exited 0 and verified).
statuses=()
for ((i = 0; i < WORKERS; i++)); do statuses+=("${STATUS[$i]:-?}"); done
status_csv="$(IFS=,; echo "${statuses[*]}")"
ALL_OK=1
python3 "$REPO_ROOT/bench/harness/demo_report.py" "$WORK" --workers "$WORKERS" --stats "$STATS" \
    --status "$status_csv" --switchd-status "$SWITCHD_RC" --ping "$PING_RESULT" \
    --json "$JSON_OUT" --mib "$MIB" --iterations "$ITERATIONS" --job "$JOB_ID" ||
    ALL_OK=0

if [[ "$ALL_OK" -eq 1 ]]; then
    PASSED=1
    echo "DEMO PASSED"
else
    echo "DEMO FAILED"
    exit 1
fi
