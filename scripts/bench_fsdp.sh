#!/usr/bin/env bash
#
# bench_fsdp.sh: reduce-scatter and all-gather through the switch against
# gloo's reduce_scatter_tensor and all_gather_into_tensor, and FSDP2 training
# step time with the switch's collectives against FSDP2 on gloo, on the same
# veth testbed, in the same run, on unlimited links and on links limited to
# 1 Gbit/s each way (issue 22).
#
# Usage:
#   sudo scripts/bench_fsdp.sh [--mib 64] [--repeats 5] [--steps 10] [--warmup 2]
#                              [--hidden 5000] [--mtu 1500] [--timeout 600] [--no-docs]
#
#   --mib S       collectives: MiB of float32 in each rank's full tensor
#                 (reduce-scatter input, all-gather output; default 64)
#   --repeats K   collectives: timed calls per op after one warm-up (default 5)
#   --steps N     FSDP2: timed steps (default 10)
#   --warmup N    FSDP2: steps left out of the statistics (default 2)
#   --hidden H    FSDP2: width of the MLP's 2 hidden layers (default 5000:
#                 25.38 M float32 parameters, communication-bound)
#   --mtu M       MTU of every testbed link (default 1500; 576..9000): the
#                 switch's chunks and gloo's TCP segments both follow it; with
#                 M != 1500 the docs files are bench/results/bench-fsdp-mtuM.{json,png}
#   --timeout T   seconds one configuration (4 ranks) may take (default 600)
#   --no-docs     write results/ only, leave bench/results/bench-fsdp.{json,png} alone
#   -h, --help    this text
#
# Each configuration runs bench/fsdp_bench.py as 4 ranks, one process per
# worker namespace (testbed prefix "bfs", 4 workers), with gloo's process
# group over the workers' eth0 (GLOO_SOCKET_IFNAME=eth0, OMP_NUM_THREADS=1):
#   link unlimited | 1gbit  x  mode collectives | fsdp  x  comm gloo | switch
# 1 Gbit/s shapes every worker link both ways as bench.sh does
# (shape_worker_links in lib.sh). switchd (job 1 of 4 workers, float32,
# pool_slots 256, a fresh random secret) runs during the switch
# configurations only. bench/fsdp_bench.py's docstring says what is timed;
# bench/harness/bench_fsdp_report.py takes the medians of the slowest rank, the
# ratios switch / gloo (goals at 1 Gbit/s: reduce-scatter <= 0.5, FSDP2 step
# <= 0.8), checks every FSDP2 run's ranks ended with the same parameters,
# and writes the table, results/bench-fsdp-STAMP.json and .png (and unless
# --no-docs, bench/results/bench-fsdp.json and bench/results/bench-fsdp.png).
#
# Everything runs in the namespaces bfs-sw, bfs-w0..3; every process started
# is stopped by PID and the testbed removed on exit, also on failure.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly PREFIX=bfs
readonly WORKERS=4
readonly SEED=0
SWITCH_ADDR=""  # the testbed's (tb switch_addr), once it is up
MASTER_IP=""    # worker 0's address: gloo's rendezvous
readonly MASTER_PORT_BASE=29500
readonly AGG_PORT=48879
readonly JOB_ID=1
readonly TBF_ARGS=(rate 1gbit burst 256kb latency 50ms)
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=15

MIB=64
MTU=1500
REPEATS=5
STEPS=10
WARMUP=2
HIDDEN=5000
TIMEOUT=600
DOCS=1

while [[ $# -gt 0 ]]; do
    case "$1" in
        --mib|--mtu|--repeats|--steps|--warmup|--hidden|--timeout)
            [[ $# -ge 2 ]] || die "$1 needs a value"
            case "$1" in
                --mib) MIB="$2" ;;
                --mtu) MTU="$2" ;;
                --repeats) REPEATS="$2" ;;
                --steps) STEPS="$2" ;;
                --warmup) WARMUP="$2" ;;
                --hidden) HIDDEN="$2" ;;
                --timeout) TIMEOUT="$2" ;;
            esac
            shift 2 ;;
        --no-docs) DOCS=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
uint_in_range "$MIB" 1 1024 || die "--mib must be 1..1024, got '$MIB'"
uint_in_range "$MTU" 576 9000 || die "--mtu must be 576..9000, got '$MTU'"
uint_in_range "$REPEATS" 1 1000 || die "--repeats must be 1..1000, got '$REPEATS'"
uint_in_range "$STEPS" 1 10000 || die "--steps must be 1..10000, got '$STEPS'"
uint_in_range "$WARMUP" 0 1000 || die "--warmup must be 0..1000, got '$WARMUP'"
uint_in_range "$HIDDEN" 1 20000 || die "--hidden must be 1..20000, got '$HIDDEN'"
uint_in_range "$TIMEOUT" 10 86400 || die "--timeout must be 10..86400 s, got '$TIMEOUT'"
MIB=$((10#$MIB)); MTU=$((10#$MTU)); REPEATS=$((10#$REPEATS)); STEPS=$((10#$STEPS)); WARMUP=$((10#$WARMUP))
HIDDEN=$((10#$HIDDEN)); TIMEOUT=$((10#$TIMEOUT))
readonly MIB MTU REPEATS STEPS WARMUP HIDDEN TIMEOUT DOCS

require_root "$@"
BENCH_T0=$SECONDS

prepare_torch_bench bench-fsdp
readonly STAMP RUN SWITCHD
readonly PY="$TORCH_BENCH_PY"

TESTBED_MADE=0
SWITCHD_PID=""
RANK_PIDS=()
trap cleanup_torch_bench EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- testbed, switchd config ---------------------------------------------------------
log "run $STAMP: 4 ranks; collectives of $MIB MiB x $REPEATS; FSDP2 MLP 64-$HIDDEN-$HIDDEN-10, $WARMUP warm-up + $STEPS timed steps; logs in $RUN"
TESTBED_MADE=1
testbed_up "$RUN/testbed.env" --prefix "$PREFIX" --workers "$WORKERS" --mtu "$MTU" 2>"$RUN/testbed.log"
SWITCH_ADDR="$(tb switch_addr)"
MASTER_IP="$(tb worker_0_addr)"
readonly SWITCH_ADDR MASTER_IP

SECRET="$(random_secret)"
readonly SECRET
CFG="$RUN/switchd.toml"
write_testbed_switchd_config "$CFG" "scripts/bench_fsdp.sh" "$WORKERS" "$SECRET"

# --- measurements ------------------------------------------------------------------

# run_config LINK MODE COMM: the 4 ranks of one configuration; results in
# $RUN/LINK-MODE-COMM/.
CONFIG_NO=0
run_config() {
    local link="$1" mode="$2" comm="$3" out="$RUN/$1-$2-$3" r port
    mkdir -p "$out"
    port=$((MASTER_PORT_BASE + CONFIG_NO))
    CONFIG_NO=$((CONFIG_NO + 1))
    if [[ "$comm" == switch ]]; then
        start_switchd "$PREFIX-sw" "$SWITCHD" "$out/switchd.log" run --config "$CFG"
    fi
    log "[$link] $mode, $comm: 4 ranks"
    snapshot "$out/before.jsonl"
    for ((r = 0; r < WORKERS; r++)); do
        (
            export RANK="$r" WORLD_SIZE="$WORKERS" MASTER_ADDR="$MASTER_IP" MASTER_PORT="$port"
            export GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1
            export AGGSWITCH_SWITCH="$SWITCH_ADDR:$AGG_PORT" AGGSWITCH_JOB="$JOB_ID" AGGSWITCH_SECRET="$SECRET"
            cd "$REPO_ROOT"
            exec timeout -k 10 "$TIMEOUT" ip netns exec "$PREFIX-w$r" \
                /usr/bin/time -f '%M %e %U %S' -o "$out/rank$r.time" \
                "$PY" bench/fsdp_bench.py --mode "$mode" --comm "$comm" --mib "$MIB" \
                --repeats "$REPEATS" --steps "$STEPS" --warmup "$WARMUP" --hidden "$HIDDEN" \
                --seed "$SEED" --out "$out/rank$r.json"
        ) >"$out/rank$r.log" 2>&1 &
        RANK_PIDS+=("$!")
    done
    if ! wait_ranks; then
        for ((r = 0; r < WORKERS; r++)); do
            echo "---- rank $r ($out/rank$r.log) ----" >&2
            tail -n 5 "$out/rank$r.log" >&2
        done
        die "[$link] $mode, $comm: failed; see $out"
    fi
    snapshot "$out/after.jsonl"
    if [[ "$comm" == switch ]]; then
        # switchd's CPU-seconds (user + system, all threads) for the report.
        awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$SWITCHD_PID/stat" \
            >"$out/switchd-cpu-seconds" 2>/dev/null || true
        stop_pid "$SWITCHD_PID"
        SWITCHD_PID=""
    fi
    log "[$link] $mode, $comm: done"
}

# busy_machine: true when the 1-min load average is above half the cores.
busy_machine() {
    awk -v l="$(cut -d' ' -f1 /proc/loadavg)" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'
}
if busy_machine; then
    warn "1-min load average is $(cut -d' ' -f1 /proc/loadavg) on $(nproc) cores before starting: other work shares the CPUs, expect noisy times"
fi
for mode in collectives fsdp; do
    for comm in gloo switch; do run_config unlimited "$mode" "$comm"; done
done
shape_worker_links "$PREFIX" "$WORKERS" "${TBF_ARGS[@]}"
for mode in collectives fsdp; do
    for comm in gloo switch; do run_config 1gbit "$mode" "$comm"; done
done

# --- report ------------------------------------------------------------------------
OUT_JSON="$REPO_ROOT/results/bench-fsdp-$STAMP.json"
OUT_PNG="$REPO_ROOT/results/bench-fsdp-$STAMP.png"
report_rc=0
"$PY" "$REPO_ROOT/bench/harness/bench_fsdp_report.py" "$RUN" \
    --json "$OUT_JSON" --table "$RUN/table.md" --png "$OUT_PNG" \
    --stamp "$STAMP" --mib "$MIB" --mtu "$MTU" --repeats "$REPEATS" --warmup "$WARMUP" --steps "$STEPS" \
    --hidden "$HIDDEN" --tbf "${TBF_ARGS[*]}" --bench-seconds $((SECONDS - BENCH_T0)) ||
    report_rc=$?
[[ -s "$OUT_JSON" ]] || die "bench/harness/bench_fsdp_report.py wrote no JSON (status $report_rc)"
echo
echo "=== bench_fsdp $STAMP: 4 ranks; reduce-scatter and all-gather of $MIB MiB; FSDP2 step, hidden $HIDDEN ==="
cat "$RUN/table.md"
echo
[[ "$report_rc" -eq 0 || "$report_rc" -eq 3 ]] || die "bench/harness/bench_fsdp_report.py failed (status $report_rc)"
if [[ "$report_rc" -eq 3 ]]; then
    die "sanity check failed (see the table): bench/results/ left alone; $OUT_JSON"
fi
if [[ "$DOCS" -eq 1 ]]; then
    doc=bench-fsdp
    ((MTU == 1500)) || doc="bench-fsdp-mtu$MTU"
    cp "$OUT_JSON" "$REPO_ROOT/bench/results/$doc.json"
    [[ -s "$OUT_PNG" ]] && cp "$OUT_PNG" "$REPO_ROOT/bench/results/$doc.png"
    log "wrote bench/results/$doc.json, bench/results/$doc.png, $OUT_JSON and $OUT_PNG"
else
    log "wrote $OUT_JSON and $OUT_PNG (bench/results/ left alone)"
fi
log "bench took $((SECONDS - BENCH_T0)) s"
