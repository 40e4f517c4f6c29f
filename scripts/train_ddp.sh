#!/usr/bin/env bash
#
# train_ddp.sh: train examples/train_ddp.py with PyTorch DDP across the
# worker namespaces of a testbed, gradients summed in the switch. Builds
# switchd and the aggswitch package, makes a testbed (prefix "train"),
# starts switchd with one job, launches one `torchrun` per worker namespace
# (--nnodes N, rendezvous at worker 0's address through the switch), and
# prints each rank's final loss and weight digest: TRAIN PASSED when every
# rank ended with the same weights.
#
# Usage:
#   sudo scripts/train_ddp.sh [--comm switch|gloo] [--workers 4] [--steps 100]
#                             [--prefix train] [--timeout 600] [-- TRAIN_ARGS...]
#
#   --comm C      switch: the aggswitch DDP hook; gloo: DDP's default
#                 all-reduce (its traffic crosses the switch's forwarding path)
#   --workers N   ranks (1..16), one per namespace PREFIX-wI
#   --steps K     training steps
#   TRAIN_ARGS    more options for examples/train_ddp.py (--hidden, --batch, ...)
#
# Needs scripts/setup.sh's venv (.venv). Everything it starts is stopped by
# PID, and the testbed removed, on exit.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly JOB_ID=1
readonly MASTER_PORT=29500

ORIG_ARGS=("$@")
COMM=switch
WORKERS=4
STEPS=100
PREFIX=train
TIMEOUT=600
TRAIN_ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --comm|--workers|--steps|--prefix|--timeout)
            [[ $# -ge 2 ]] || die "$1 needs a value"
            case "$1" in
                --comm) COMM="$2" ;;
                --workers) WORKERS="$2" ;;
                --steps) STEPS="$2" ;;
                --prefix) PREFIX="$2" ;;
                --timeout) TIMEOUT="$2" ;;
            esac
            shift 2 ;;
        --) shift; TRAIN_ARGS=("$@"); break ;;
        -h|--help)
            usage
            exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ "$COMM" == switch || "$COMM" == gloo ]] || die "--comm must be switch or gloo, got '$COMM'"
uint_in_range "$WORKERS" 1 16 || die "--workers must be 1..16, got '$WORKERS'"
uint_in_range "$STEPS" 1 1000000 || die "--steps must be 1..1000000, got '$STEPS'"
uint_in_range "$TIMEOUT" 1 86400 || die "--timeout must be 1..86400 seconds, got '$TIMEOUT'"
require_root "${ORIG_ARGS[@]}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/agg-train.XXXXXX")"
SWITCHD_PID=""
RANK_PIDS=()
cleanup() {
    local rc=$? pid
    for pid in "${RANK_PIDS[@]}"; do stop_pid "$pid" 5; done
    [[ -z "$SWITCHD_PID" ]] || stop_pid "$SWITCHD_PID"
    bash "$REPO_ROOT/scripts/testbed.sh" down --prefix "$PREFIX" >/dev/null 2>&1 || true
    if [[ "$rc" -ne 0 ]]; then
        log "logs kept in $WORK"
    else
        rm -rf -- "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT

bash "$REPO_ROOT/scripts/setup.sh"
build_release
build_python_package
testbed_up "$WORK/testbed.env" --prefix "$PREFIX" --workers "$WORKERS"
SWITCH_ADDR="$(tb switch_addr)"
MASTER_ADDR="$(tb worker_0_addr)"
readonly SWITCH_ADDR MASTER_ADDR

SECRET="$(random_secret)"
write_testbed_switchd_config "$WORK/switch.toml" "scripts/train_ddp.sh" \
    "$WORKERS" "$SECRET" "admin_socket = \"$WORK/admin.sock\""
start_switchd "$PREFIX-sw" "$REPO_ROOT/target/release/switchd" "$WORK/switchd.log" \
    run --config "$WORK/switch.toml" --stats-file "$WORK/stats.json"
log "switchd ready; training with --comm $COMM, $WORKERS ranks, $STEPS steps"

for ((i = 0; i < WORKERS; i++)); do
    ip netns exec "$PREFIX-w$i" env AGGSWITCH_SWITCH="$SWITCH_ADDR" AGGSWITCH_JOB="$JOB_ID" \
        AGGSWITCH_SECRET="$SECRET" GLOO_SOCKET_IFNAME=eth0 \
        "$REPO_ROOT/.venv/bin/torchrun" --nnodes="$WORKERS" --nproc-per-node=1 \
        --node-rank="$i" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" \
        "$REPO_ROOT/examples/train_ddp.py" --comm "$COMM" --steps "$STEPS" \
        --out "$WORK/rank$i.json" "${TRAIN_ARGS[@]}" >"$WORK/rank$i.log" 2>&1 &
    RANK_PIDS[i]=$!
done
# Rank 0's progress on the terminal.
tail -n +1 -f "$WORK/rank0.log" --pid "${RANK_PIDS[0]}" | grep --line-buffered -E '^(step|rank)' &

failed=0
deadline=$((SECONDS + TIMEOUT))
for ((i = 0; i < WORKERS; i++)); do
    while kill -0 "${RANK_PIDS[i]}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
    rc=0
    if kill -0 "${RANK_PIDS[i]}" 2>/dev/null; then
        warn "rank $i still running after $TIMEOUT s; stopping it"
        stop_pid "${RANK_PIDS[i]}" 5
        rc=124
    else
        wait "${RANK_PIDS[i]}" || rc=$?
    fi
    if [[ "$rc" -ne 0 ]]; then
        warn "rank $i failed (status $rc); its log:"
        tail -n 15 "$WORK/rank$i.log" >&2
        failed=1
    fi
done
RANK_PIDS=()
((failed == 0)) || die "TRAIN FAILED"

"$VENV_PYTHON" "$REPO_ROOT/bench/harness/train_ddp_report.py" "$WORK"/rank*.json
if [[ "$COMM" == switch ]]; then
    "$REPO_ROOT/target/release/switchctl" --socket "$WORK/admin.sock" stats "$JOB_ID" 2>/dev/null || true
fi
