#!/usr/bin/env bash
#
# soak.sh: a long run of three concurrent jobs through one switchd, with 1 %
# packet loss on every worker link, to catch what short tests do not: leaks,
# slow drift, rare hangs, wrong sums.
#
# Usage:
#   sudo scripts/soak.sh [MINUTES]        (default 10)
#
# Builds the release binaries, makes testbed "soak" (6 workers, no hosts),
# drops 1 % of the frames in each direction of every worker link, starts
# switchd with three jobs (job 1: ranks 0-1 on soak-w0, soak-w1; job 2:
# soak-w2, soak-w3; job 3: soak-w4, soak-w5; each job allows only its
# workers' /32s and has its own random secret), then runs rounds until
# MINUTES have passed. In a round the three jobs run at once, every worker
# `allreduce --elements 1000000 --iterations 5 --verify --json`; the script
# fails at once when a worker exits non-zero, reports verified != true, or
# takes longer than 300 s.
#
# The loss: scripts/impair.sh --udp-port 48879 --loss 1 on each worker's eth0,
# egress (worker -> switch) and --ingress (switch -> worker); a tc-BPF
# program, as CI kernels may lack sch_netem. Not on the switch-side ports:
# switchd sends through AF_XDP, which bypasses their egress hooks.
#
# At the end it prints minutes, rounds, collectives verified (a job's
# all-reduce, checked by both its ranks), switchd's resident memory (VmRSS)
# after ready, after the first round and at the end, and the per-job counters
# from the stats file, and the frames impair.sh dropped. Exits 0 only if every
# collective verified and frames were dropped in both directions.
# Everything it starts is stopped by PID and the testbed removed on exit; the
# logs are kept on failure.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly PREFIX=soak
readonly WORKERS=6
readonly JOBS=3
SWITCH_ADDR=""  # the testbed's (tb switch_addr), once it is up
readonly AGG_PORT=48879
readonly ELEMENTS=1000000
readonly ITERATIONS=5
readonly LOSS_PCT=1
readonly ROUND_TIMEOUT=300
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=15

case "${1:-}" in
    -h|--help) usage; exit 0 ;;
esac
[[ $# -le 1 ]] || die "usage: soak.sh [MINUTES]"
MINUTES="${1:-10}"
uint_in_range "$MINUTES" 1 100000 || die "MINUTES must be a whole number >= 1, got '$MINUTES'"
MINUTES=$((10#$MINUTES))
readonly MINUTES
require_root "$@"
cd "$REPO_ROOT"
for tool in ip tc jq bpftool "${CLANG:-clang}"; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found: run scripts/setup.sh"
done

# --- cleanup --------------------------------------------------------------------
WORK=""
TESTBED_MADE=0
SWITCHD_PID=""
WORKER_PIDS=()
PASSED=0

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${WORKER_PIDS[@]}" "$SWITCHD_PID"; do
        stop_pid "$pid"
    done
    if [[ "$TESTBED_MADE" -eq 1 ]]; then
        bash "$REPO_ROOT/scripts/testbed.sh" down --prefix "$PREFIX" >/dev/null 2>&1 ||
            warn "testbed down failed; run: scripts/testbed.sh down --prefix $PREFIX"
    fi
    if [[ -n "$WORK" && -d "$WORK" ]]; then
        if [[ "$PASSED" -eq 1 ]]; then
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
build_release
SWITCHD="$REPO_ROOT/target/release/switchd"
WORKER="$REPO_ROOT/target/release/worker"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/agg-soak.XXXXXX")"
CFG="$WORK/switchd.toml"
STATS="$WORK/stats.json"
SWITCHD_LOG="$WORK/switchd.log"

TESTBED_MADE=1
testbed_up "$WORK/testbed.env" --prefix "$PREFIX" --workers "$WORKERS"
SWITCH_ADDR="$(tb switch_addr)"

# --- 1 % loss on every worker link --------------------------------------------------
IMPAIR="$REPO_ROOT/scripts/impair.sh"
# impair NS ARGS...: scripts/impair.sh NS eth0 ARGS..., quiet unless it fails.
impair() {
    local ns="$1" out
    shift
    out="$(bash "$IMPAIR" "$ns" eth0 "$@" 2>&1)" || { echo "$out" >&2; die "scripts/impair.sh $ns eth0 $* failed"; }
    [[ -z "$out" ]] || echo "$out"
}
for ((i = 0; i < WORKERS; i++)); do
    impair "$PREFIX-w$i" --udp-port "$AGG_PORT" --loss "$LOSS_PCT" >/dev/null
    impair "$PREFIX-w$i" --udp-port "$AGG_PORT" --loss "$LOSS_PCT" --ingress >/dev/null
done
log "$LOSS_PCT % loss on both directions of $PREFIX-w0..$PREFIX-w$((WORKERS - 1)) (scripts/impair.sh)"

# dropped_frames [--ingress]: "dropped seen" summed over the workers' eth0
# egress (or ingress), from impair.sh --stats.
dropped_frames() {
    local i dropped=0 seen=0 kv line
    for ((i = 0; i < WORKERS; i++)); do
        line="$(impair "$PREFIX-w$i" --stats "$@")" || return 1
        for kv in $line; do
            case "${kv%%=*}" in
                dropped) dropped=$((dropped + ${kv#*=})) ;;
                seen) seen=$((seen + ${kv#*=})) ;;
            esac
        done
    done
    echo "$dropped $seen"
}

# --- switchd ----------------------------------------------------------------------
SECRETS=()
# One job per pair of workers (j: workers 2(j-1) and 2(j-1)+1), each its own
# secret, written by switchd itself (typed config, the testbed's addresses).
job_args=()
for ((j = 1; j <= JOBS; j++)); do
    SECRETS[j]="$(random_secret)"
    printf '%s' "${SECRETS[j]}" >"$WORK/secret$j"
    chmod 600 "$WORK/secret$j"
    job_args+=(--job "$j:$((2 * (j - 1)))-$((2 * (j - 1) + 1)):file:$WORK/secret$j")
done
"$SWITCHD" testbed-config --env "$TESTBED_ENV" --out "$CFG" --writer scripts/soak.sh \
    "${job_args[@]}" --set "switch.agg_port=$AGG_PORT" --set switch.summary_interval_secs=5.0 ||
    die "switchd testbed-config failed"
"$SWITCHD" check-config --config "$CFG" >/dev/null || die "switchd refused $CFG"

log "starting switchd in $PREFIX-sw (log: $SWITCHD_LOG)"
start_switchd "$PREFIX-sw" "$SWITCHD" "$SWITCHD_LOG" run --config "$CFG" --stats-file "$STATS"

# rss_kib: switchd's VmRSS in KiB.
rss_kib() {
    awk '/^VmRSS:/ { print $2 }' "/proc/$SWITCHD_PID/status"
}
RSS_START="$(rss_kib)"
log "switchd ready (pid $SWITCHD_PID), VmRSS $RSS_START KiB"

# --- rounds -----------------------------------------------------------------------
# fail_round MSG: print what is known about the failed round and exit 1.
fail_round() {
    echo "---- switchd log (last 20 lines) ----" >&2
    tail -n 20 "$SWITCHD_LOG" >&2
    die "round $ROUND: $1"
}

ROUND=0
COLLECTIVES=0
RESENT=0
RSS_ROUND1=""
START=$SECONDS
END=$((START + MINUTES * 60))
while ((SECONDS < END)); do
    ROUND=$((ROUND + 1))
    WORKER_PIDS=()
    for ((i = 0; i < WORKERS; i++)); do
        j=$((i / 2 + 1))
        AGGSWITCH_SECRET="${SECRETS[j]}" ip netns exec "$PREFIX-w$i" "$WORKER" allreduce \
            --switch "$SWITCH_ADDR" --job "$j" --rank "$((i % 2))" --workers 2 \
            --elements "$ELEMENTS" --iterations "$ITERATIONS" \
            --verify --json --stall-timeout 20 \
            >"$WORK/w$i.json" 2>"$WORK/w$i.log" &
        WORKER_PIDS[i]=$!
    done
    deadline=$((SECONDS + ROUND_TIMEOUT))
    remaining=$WORKERS
    while ((remaining > 0)); do
        for ((i = 0; i < WORKERS; i++)); do
            pid="${WORKER_PIDS[i]:-}"
            [[ -n "$pid" ]] || continue
            kill -0 "$pid" 2>/dev/null && continue
            rc=0
            wait "$pid" || rc=$?
            unset 'WORKER_PIDS[i]'
            remaining=$((remaining - 1))
            j=$((i / 2 + 1))
            if [[ "$rc" -ne 0 ]]; then
                tail -n 5 "$WORK/w$i.log" >&2
                fail_round "job $j rank $((i % 2)) ($PREFIX-w$i) exited with status $rc"
            fi
            verified="$(grep -E '^\{' "$WORK/w$i.json" | tail -n 1 | jq -r '.verified' 2>/dev/null || true)"
            if [[ "$verified" != true ]]; then
                cat "$WORK/w$i.json" "$WORK/w$i.log" >&2
                fail_round "job $j rank $((i % 2)) ($PREFIX-w$i) reported verified=${verified:-nothing}"
            fi
            RESENT=$((RESENT + $(jq -r '.stats.chunks_resent' "$WORK/w$i.json")))
        done
        ((remaining > 0)) || break
        ((SECONDS < deadline)) || fail_round "workers still running after $ROUND_TIMEOUT s"
        sleep 0.1
    done
    WORKER_PIDS=()
    COLLECTIVES=$((COLLECTIVES + JOBS * ITERATIONS))
    [[ -n "$RSS_ROUND1" ]] || RSS_ROUND1="$(rss_kib)"
    if ((ROUND % 10 == 0)); then
        log "round $ROUND: $COLLECTIVES collectives verified, $(((SECONDS - START) / 60)) of $MINUTES min, VmRSS $(rss_kib) KiB"
    fi
done
RSS_END="$(rss_kib)"
ELAPSED=$((SECONDS - START))

COUNTS_OUT="$(dropped_frames)" || die "scripts/impair.sh --stats failed"
COUNTS_IN="$(dropped_frames --ingress)" || die "scripts/impair.sh --stats --ingress failed"
read -r DROPPED_OUT SEEN_OUT <<<"$COUNTS_OUT"
read -r DROPPED_IN SEEN_IN <<<"$COUNTS_IN"

log "stopping switchd (SIGTERM to pid $SWITCHD_PID)"
stop_pid "$SWITCHD_PID"
SWITCHD_RC=$STOP_RC
SWITCHD_PID=""

# --- summary ----------------------------------------------------------------------
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
echo
echo "=== soak: $MINUTES min requested, $((ELAPSED / 60)) min $((ELAPSED % 60)) s run ==="
echo "loss:                 $LOSS_PCT % each way on every worker link: dropped $DROPPED_OUT of $SEEN_OUT" \
    "worker->switch, $DROPPED_IN of $SEEN_IN switch->worker aggregation frames"
echo "rounds:               $ROUND (3 jobs x 2 ranks x $ELEMENTS float32 x $ITERATIONS iterations each)"
echo "collectives verified: $COLLECTIVES (chunks resent by workers: $RESENT)"
echo "switchd VmRSS:        start $(mib "$RSS_START") MiB, after round 1 $(mib "$RSS_ROUND1") MiB, end $(mib "$RSS_END") MiB;" \
    "end/start $(awk -v a="$RSS_END" -v b="$RSS_START" 'BEGIN { printf "%.3f", a / b }')," \
    "end/round 1 $(awk -v a="$RSS_END" -v b="$RSS_ROUND1" 'BEGIN { printf "%.3f", a / b }')"
echo "switchd exit status:  $SWITCHD_RC"
if [[ -s "$STATS" ]]; then
    echo "per-job counters:"
    jq -r '.jobs[] | "  job \(.id): \(.state), chunks \(.chunks_completed), bytes \(.bytes_aggregated),"
        + " contributions \(.contributions), results \(.results_sent), retransmits served \(.retransmits_served),"
        + " joins \(.joins), activations \(.activations), nacks \(.nacks), drops "
        + (.drops | to_entries | map(select(.value > 0) | "\(.key)=\(.value)") | join(",")
           | if . == "" then "none" else . end)' "$STATS"
    echo "switch: $(jq -c '{rx_frames, tx_frames, tx_ring_full, results_sent, malformed_total, unknown_job}' "$STATS")"
else
    echo "per-job counters: none ($STATS was not written)"
fi
echo
[[ "$SWITCHD_RC" -eq 0 ]] || die "switchd exited with status $SWITCHD_RC"
((DROPPED_OUT > 0 && DROPPED_IN > 0)) || die "no frames were dropped in one direction: the loss was not there"
PASSED=1
echo "SOAK PASSED"
