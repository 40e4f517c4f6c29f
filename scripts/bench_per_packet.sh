#!/usr/bin/env bash
#
# bench_per_packet.sh: the cost of one DATA packet through the switch's
# engine against a plain copy of its payload (criterion, in memory, no I/O).
# Run by scripts/bench.sh, or alone.
#
# Usage:
#   scripts/bench_per_packet.sh [--json FILE] [--secs S] [--cpu N]
#
#   --json FILE  also write the results as JSON to FILE
#   --secs S     criterion measurement time per benchmark (default 3)
#   --cpu N      pin the benchmark to CPU N (default: the last CPU)
#
# It runs `cargo bench -p agg-proto --bench data_path -- data_packet` (the
# benchmarks are described in proto/benches/data_path.rs): for 64, 256, 362
# and 870 float32 per packet,
#   engine    header parse + validation + JobTable::handle (job lookup,
#             membership, window, duplicate and rank-order checks, the sum
#             into the slot, counters), per packet of a 4-rank job;
#   copy      a copy of the same payload into one buffer: the limit;
#   sum_only  the engine's arithmetic alone (rank 0 copies into the slot,
#             ranks 1..3 add), without any protocol work.
# and reports criterion's median per benchmark, engine / copy (the goal is
# <= 1.5) and sum_only / copy (bench/harness/bench_per_packet_report.py reads
# criterion's estimates and writes the JSON and the table). No root needed;
# nothing touches the network.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

JSON=""
SECS=3
CPU=$(($(nproc) - 1))

while [[ $# -gt 0 ]]; do
    case "$1" in
        --json) [[ $# -ge 2 ]] || die "--json needs a file"; JSON="$2"; shift 2 ;;
        --secs) [[ $# -ge 2 ]] || die "--secs needs a value"; SECS="$2"; shift 2 ;;
        --cpu) [[ $# -ge 2 ]] || die "--cpu needs a value"; CPU="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
uint_in_range "$SECS" 1 600 || die "--secs must be 1..600, got '$SECS'"
uint_in_range "$CPU" 0 $(($(nproc) - 1)) || die "--cpu must be 0..$(($(nproc) - 1)) (this machine's CPUs), got '$CPU'"
command -v taskset >/dev/null 2>&1 || die "taskset not found (apt-get install util-linux)"

cd "$REPO_ROOT"
readonly OUT_DIR="$REPO_ROOT/target/criterion/data_packet"
readonly CRITERION_LOG="$REPO_ROOT/target/criterion/bench_per_packet.log"
# Stale estimates from an earlier run must not stand in for a failed one.
rm -rf -- "$OUT_DIR"
mkdir -p "$(dirname "$CRITERION_LOG")"
log "criterion data_path (data_packet), ${SECS} s per benchmark, pinned to CPU $CPU (log: $CRITERION_LOG)"
cargo bench -q -p agg-proto --bench data_path --no-run >"$CRITERION_LOG" 2>&1 || {
    tail -n 20 "$CRITERION_LOG" >&2
    die "cargo bench --no-run failed (see above)"
}
taskset -c "$CPU" cargo bench -q -p agg-proto --bench data_path -- data_packet \
    --warm-up-time 1 --measurement-time "$SECS" >>"$CRITERION_LOG" 2>&1 || {
    tail -n 20 "$CRITERION_LOG" >&2
    die "cargo bench -p agg-proto --bench data_path failed (see above)"
}

report_args=("$OUT_DIR" --secs "$SECS" --cpu "$CPU")
[[ -n "$JSON" ]] && report_args+=(--json "$JSON")
python3 "$REPO_ROOT/bench/harness/bench_per_packet_report.py" "${report_args[@]}" ||
    die "bench/harness/bench_per_packet_report.py failed on $OUT_DIR (see above; criterion's log: $CRITERION_LOG)"
