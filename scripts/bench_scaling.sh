#!/usr/bin/env bash
#
# bench_scaling.sh: how the switch's engine scales over cores, with no kernel
# (issue 21): `engine_scaling` (bench/src/bin/engine_scaling.rs) runs T
# threads that feed pre-built DATA datagrams in memory to the engine and
# encode its RESULTs, checking sampled RESULTs bit for bit against the
# rank-order reference sum. For each backend that is built (table-lock: one
# Mutex<JobTable> per batch, switchd before issue 21; lockfree: the lock-free
# DATA path; lanes: lockfree behind software seq lanes) and each layout (rss
# and rank-blocks: one job of 4 ranks whose ranks arrive on different
# threads; steered: one job whose seqs arrive by lane, as switchd's seq
# lanes with NIC rules make them; job-per-thread: T jobs), it reports DATA Mpps, payload GB/s summed, RESULTs/s and DATA per
# CPU-second of the feeding threads, the median of the repeats, and the
# lowest share of their CPUs the threads got.
#
# Usage:
#   scripts/bench_scaling.sh [--seconds S] [--repeats N] [--threads LIST]
#                            [--quick] [--no-build]
#
#   --seconds S     seconds per measurement (default 3)
#   --repeats N     measurements per configuration, interleaved (default 3)
#   --threads LIST  comma-separated thread counts (default: 1, 2, then
#                   4, 8, … and the number of CPUs, up to it)
#   --quick         a fast check: --seconds 0.5 --repeats 1 (unless given)
#   --no-build      do not run cargo build (use target/release as is)
#
# Prints the table (Markdown) and writes results/scaling-STAMP.json (its key
# engine_2_over_1: median Mpps at 2 threads over 1, rss layout, lockfree, or
# table-lock while lockfree is not built, named by engine_2_over_1_backend;
# and engine_2_over_1_seq_lanes, the same for the steered layout)
# and results/scaling-STAMP.png (bench/harness/bench_scaling_report.py, with the
# project venv's Python). No root needed; nothing touches the network.
# Warns when the 1-min load average says the machine is busy: the threads
# are pinned one per CPU, and other load on those CPUs is measured too.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    sed -n '/^# Usage:/,/^# Prints/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' | sed '$d'
}

SECONDS_EACH=""
REPEATS=""
THREADS=""
QUICK=0
BUILD=1

while [[ $# -gt 0 ]]; do
    case "$1" in
        --seconds) [[ $# -ge 2 ]] || die "--seconds needs a value"; SECONDS_EACH="$2"; shift 2 ;;
        --repeats) [[ $# -ge 2 ]] || die "--repeats needs a value"; REPEATS="$2"; shift 2 ;;
        --threads) [[ $# -ge 2 ]] || die "--threads needs a list, e.g. 1,2,4"; THREADS="$2"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

NPROC="$(nproc)"
if [[ "$QUICK" -eq 1 ]]; then
    : "${SECONDS_EACH:=0.5}" "${REPEATS:=1}"
fi
: "${SECONDS_EACH:=3}" "${REPEATS:=3}"
if [[ -z "$THREADS" ]]; then
    THREADS=1
    t=2
    while ((t <= NPROC)); do
        THREADS+=",$t"
        t=$((t * 2))
    done
    ((NPROC > 1 && NPROC & (NPROC - 1))) && THREADS+=",$NPROC"
fi
[[ "$SECONDS_EACH" =~ ^([0-9]+(\.[0-9]*)?|\.[0-9]+)$ ]] && [[ ! "$SECONDS_EACH" =~ ^[0.]+$ ]] ||
    die "--seconds must be a positive number of seconds, got '$SECONDS_EACH'"
uint_in_range "$REPEATS" 1 100 || die "--repeats must be 1..100, got '$REPEATS'"
[[ "$THREADS" =~ ^[1-9][0-9]{0,3}(,[1-9][0-9]{0,3})*$ ]] ||
    die "--threads must be a comma-separated list of thread counts (1 or more), got '$THREADS'"

cd "$REPO_ROOT"
if [[ "$BUILD" -eq 1 ]]; then
    ensure_cargo_path
    log "building (cargo build --release -p agg-bench --bins)"
    cargo build --release -p agg-bench --bins
fi
readonly BIN="$REPO_ROOT/target/release/engine_scaling"
[[ -x "$BIN" ]] || die "$BIN missing (build with: cargo build --release -p agg-bench --bins)"

# The project venv's Python draws the PNG (scripts/setup.sh makes it);
# any python3 writes the JSON and the table.
PY="$REPO_ROOT/.venv/bin/python"
[[ -x "$PY" ]] || PY="$(command -v python3 || true)"
[[ -n "$PY" ]] || die "python3 not found (run scripts/setup.sh for the project venv)"

loadavg() { cut -d' ' -f1 /proc/loadavg; }
LOAD_START="$(loadavg)"
if awk -v l="$LOAD_START" 'BEGIN { exit !(l >= 0.5) }'; then
    warn "the machine is busy (1-min load average $LOAD_START on $NPROC CPUs): the threads share their CPUs with that load, so the numbers are noisy; rerun when it is idle"
fi

STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
readonly STAMP
mkdir -p "$REPO_ROOT/results"
readonly OUT_JSON="$REPO_ROOT/results/scaling-$STAMP.json"
readonly OUT_PNG="$REPO_ROOT/results/scaling-$STAMP.png"
RAW="$(mktemp "${TMPDIR:-/tmp}/bench_scaling.XXXXXX.json")"
readonly RAW

cleanup() {
    rm -f -- "$RAW"
}
trap cleanup EXIT

log "engine_scaling: threads $THREADS, ${SECONDS_EACH} s x $REPEATS repeats per configuration, every layout, every built backend"
"$BIN" --threads "$THREADS" --seconds "$SECONDS_EACH" --repeats "$REPEATS" \
    --backend all --layout all --json "$RAW" >/dev/null ||
    die "engine_scaling failed (see above): a wrong RESULT or refused DATA is a bug in the engine"
LOAD_END="$(loadavg)"

"$PY" "$REPO_ROOT/bench/harness/bench_scaling_report.py" "$RAW" "$OUT_JSON" "$OUT_PNG" \
    --stamp "$STAMP" --load-start "$LOAD_START" --load-end "$LOAD_END" ||
    die "bench/harness/bench_scaling_report.py failed (see above)"
if [[ -s "$OUT_PNG" ]]; then
    log "wrote $OUT_JSON and $OUT_PNG"
else
    log "wrote $OUT_JSON (no PNG: see the warning above)"
fi
