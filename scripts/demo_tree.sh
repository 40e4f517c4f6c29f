#!/usr/bin/env bash
#
# demo_tree.sh: the demo over an aggregation tree (scripts/demo.sh --leaves L
# --spines K runs this). Makes a leaf–spine testbed (scripts/testbed.sh up
# --leaves), starts a switchd in every spine and every leaf, runs an
# all-reduce across the workers of every leaf (verified against the
# tree-order sum: ranks within a leaf, then leaves), pings from a host under
# leaf 0 to a host under leaf 1 across the fabric meanwhile, then prints the
# per-rank table, the counters of leaf 0, the chunks each spine summed
# (seq mod K) and DEMO PASSED / DEMO FAILED.
#
# Usage:
#   sudo scripts/demo_tree.sh [--leaves 2] [--spines 2] [--workers W] [--mib 16]
#                             [--iterations 3] [--timeout 600] [--prefix tree]
#                             [--keep-logs] [--json FILE]
#
#   --leaves L      leaf switches (2..8, default 2), each with its own workers
#   --spines K      spine switches (1..8, default 2): chunk seq s is summed at
#                   spine s mod K
#   --workers W     workers per leaf (1..16, default 2)
#   --mib S         tensor size per worker in MiB of float32
#   --iterations N  all-reduce rounds per worker
#   --timeout T     seconds the workers get before they are stopped
#   --prefix P      testbed namespace prefix (default tree)
#   --keep-logs     keep the folder of logs and configs also on success
#   --json FILE     the full JSON (default results/demo-tree-STAMP.json)
#
# Exits 0 only if every worker exited 0 and verified. Everything it starts
# is stopped by PID, and the testbed removed, on exit.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly AGG_PORT=48879
readonly UPLINK_PORT=40000
readonly JOB_ID=1
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=15

ORIG_ARGS=("$@")
PREFIX=tree
LEAVES=2
SPINES=2
WPL=2
MIB=16
ITERATIONS=3
TIMEOUT=600
KEEP_LOGS=0
JSON_OUT=""

while [[ $# -gt 0 ]]; do
    case "$1" in
        --leaves|--spines|--workers|--mib|--iterations|--timeout|--prefix|--json)
            [[ $# -ge 2 ]] || die "$1 needs a value"
            case "$1" in
                --leaves) LEAVES="$2" ;;
                --spines) SPINES="$2" ;;
                --workers) WPL="$2" ;;
                --mib) MIB="$2" ;;
                --iterations) ITERATIONS="$2" ;;
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
uint_in_range "$LEAVES" 2 8 || die "--leaves must be 2..8, got '$LEAVES'"
uint_in_range "$SPINES" 1 8 || die "--spines must be 1..8, got '$SPINES'"
uint_in_range "$WPL" 1 16 || die "--workers (per leaf) must be 1..16, got '$WPL'"
uint_in_range "$MIB" 1 1024 || die "--mib must be 1..1024, got '$MIB'"
uint_in_range "$ITERATIONS" 1 1000000 || die "--iterations must be >= 1, got '$ITERATIONS'"
uint_in_range "$TIMEOUT" 1 86400 || die "--timeout must be 1..86400 s, got '$TIMEOUT'"
LEAVES=$((10#$LEAVES)); SPINES=$((10#$SPINES)); WPL=$((10#$WPL))
MIB=$((10#$MIB)); ITERATIONS=$((10#$ITERATIONS)); TIMEOUT=$((10#$TIMEOUT))
readonly ELEMENTS=$((MIB * 1024 * 1024 / 4))
readonly WORKERS=$((LEAVES * WPL))
[[ "$PREFIX" =~ ^[A-Za-z0-9_][A-Za-z0-9_-]{0,20}$ ]] || die "bad --prefix '$PREFIX'"
readonly PREFIX
require_root "${ORIG_ARGS[@]}"
if [[ -z "$JSON_OUT" ]]; then
    JSON_OUT="$REPO_ROOT/results/demo-tree-$(date -u +%Y%m%dT%H%M%SZ).json"
elif [[ "$JSON_OUT" != /* ]]; then
    JSON_OUT="$PWD/$JSON_OUT"
fi
readonly JSON_OUT
cd "$REPO_ROOT"

# --- cleanup --------------------------------------------------------------------
WORK=""
TESTBED_MADE=0
SWITCHD_PIDS=()
PING_PID=""
WORKER_PIDS=()
PASSED=0

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${WORKER_PIDS[@]}" "$PING_PID" "${SWITCHD_PIDS[@]}"; do
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
            log "logs, configs and outputs kept in $WORK"
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
WORK="$(mktemp -d "${TMPDIR:-/tmp}/agg-demo-tree.XXXXXX")"

TESTBED_MADE=1
bash "$REPO_ROOT/scripts/testbed.sh" up --prefix "$PREFIX" --leaves "$LEAVES" \
    --spines "$SPINES" --workers-per-leaf "$WPL" --hosts-per-leaf 1 \
    --print-env >"$WORK/fabric.env"
# env KEY: a value testbed.sh printed.
env_of() {
    sed -n "s/^$1=//p" "$WORK/fabric.env"
}

SECRET="$(random_secret)"

# --- spines, then leaves -------------------------------------------------------------
# fabric_config ROLE FILE ARGS...: switchd's config for one switch of the
# fabric (`switchd testbed-config --topology leaf-spine`, typed and checked).
fabric_config() {
    local role="$1" file="$2"
    shift 2
    AGGSWITCH_TESTBED_SECRET="$SECRET" "$SWITCHD" testbed-config --topology leaf-spine \
        --role "$role" --env "$WORK/fabric.env" --out "$file" --writer scripts/demo_tree.sh \
        --agg-port "$AGG_PORT" --uplink-port "$UPLINK_PORT" \
        --job "$JOB_ID:all:env:AGGSWITCH_TESTBED_SECRET" "$@" ||
        die "switchd testbed-config --role $role failed"
}
for ((j = 0; j < SPINES; j++)); do
    fabric_config "spine:$j" "$WORK/spine$j.toml" --set "switch.admin_socket=\"$WORK/spine$j.sock\""
    log "starting switchd in $(env_of "spine_${j}_ns") (spine $j, $(env_of "spine_${j}_addr"))"
    start_switchd "$(env_of "spine_${j}_ns")" "$SWITCHD" "$WORK/spine$j.log" \
        run --config "$WORK/spine$j.toml" --stats-file "$WORK/spine$j-stats.json"
    SWITCHD_PIDS+=("$SWITCHD_PID")
done
for ((i = 0; i < LEAVES; i++)); do
    fabric_config "leaf:$i" "$WORK/leaf$i.toml" --host-ports \
        --set "switch.admin_socket=\"$WORK/leaf$i.sock\""
    log "starting switchd in $(env_of "leaf_${i}_ns") (leaf $i, $(env_of "leaf_${i}_gateway"))"
    start_switchd "$(env_of "leaf_${i}_ns")" "$SWITCHD" "$WORK/leaf$i.log" \
        run --config "$WORK/leaf$i.toml" --stats-file "$WORK/leaf$i-stats.json"
    SWITCHD_PIDS+=("$SWITCHD_PID")
done

# --- workers, and a ping across the fabric --------------------------------------------
log "all-reduce: $LEAVES leaves x $WPL workers x $ELEMENTS float32 ($MIB MiB) x $ITERATIONS iterations, $SPINES spines"
sizes="$(printf "$WPL,%.0s" $(seq "$LEAVES"))"
sizes="${sizes%,}"
for ((i = 0; i < LEAVES; i++)); do
    for ((k = 0; k < WPL; k++)); do
        g=$((i * WPL + k))
        AGGSWITCH_SECRET="$SECRET" ip netns exec "$(env_of "leaf_${i}_worker_${k}_ns")" "$WORKER" allreduce \
            --switch "$(env_of "leaf_${i}_gateway")" --job "$JOB_ID" --rank "$k" \
            --workers "$WPL" --tree-leaves "$sizes" --leaf "$i" \
            --elements "$ELEMENTS" --iterations "$ITERATIONS" --verify --json \
            >"$WORK/worker$g.json" 2>"$WORK/worker$g.log" &
        WORKER_PIDS[g]=$!
    done
done
far_host="$(env_of "leaf_1_host_0_addr")"
ip netns exec "$(env_of "leaf_0_host_0_ns")" ping -c 5 -i 0.2 -W 2 "$far_host" \
    >"$WORK/ping.log" 2>&1 &
PING_PID=$!

declare -A STATUS=()
wait_workers "$WORKERS" "$TIMEOUT"

rc=0
wait "$PING_PID" || rc=$?
PING_PID=""
received="$(sed -n 's/.* \([0-9]*\) received.*/\1/p' "$WORK/ping.log")"
if [[ "$rc" -eq 0 && "${received:-0}" -gt 0 ]]; then
    PING_RESULT="yes: leaf 0 host -> $far_host under leaf 1, ${received}/5 replies"
else
    PING_RESULT="NO: leaf 0 host -> $far_host, ${received:-0}/5 replies (see $WORK/ping.log)"
fi

# --- stop every switchd; each writes its counters on exit -------------------------------
SWITCHD_RC=0
for pid in "${SWITCHD_PIDS[@]}"; do
    stop_pid "$pid"
    ((STOP_RC == 0)) || SWITCHD_RC=$STOP_RC
done
SWITCHD_PIDS=()

# --- summary ------------------------------------------------------------------------
statuses=()
for ((g = 0; g < WORKERS; g++)); do statuses+=("${STATUS[$g]:-?}"); done
status_csv="$(IFS=,; echo "${statuses[*]}")"
spine_args=()
for ((j = 0; j < SPINES; j++)); do spine_args+=(--spine-stats "$WORK/spine$j-stats.json"); done
ALL_OK=1
python3 "$REPO_ROOT/bench/harness/demo_report.py" "$WORK" --workers "$WORKERS" \
    --stats "$WORK/leaf0-stats.json" --status "$status_csv" --switchd-status "$SWITCHD_RC" \
    --ping "$PING_RESULT" --json "$JSON_OUT" --mib "$MIB" --iterations "$ITERATIONS" \
    --job "$JOB_ID" "${spine_args[@]}" || ALL_OK=0

if [[ "$ALL_OK" -eq 1 && "$SWITCHD_RC" -eq 0 ]]; then
    PASSED=1
    echo "DEMO PASSED"
else
    echo "DEMO FAILED"
    exit 1
fi
