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
# counters; then the medians per transport. The testbed is removed at the end, also on
# failure. Needs root and target/release/{switchd,worker}.

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
command -v jq >/dev/null || die "needs jq"

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

# busy_jiffies: busy jiffies of all CPUs so far (scripts/benchkit.py's
# definition, as every report's).
busy_jiffies() {
    python3 "$REPO_ROOT/scripts/benchkit.py" cpu-ticks | cut -d' ' -f1
}
HZ="$(getconf CLK_TCK)"

# switchd_jiffies: switchd's user+system time so far.
switchd_jiffies() {
    python3 "$REPO_ROOT/scripts/benchkit.py" proc-jiffies "$SWITCHD_PID"
}

# children_jiffies: user+system of this shell's waited-for children so far
# (`times` writes to a file: in a command substitution it would report the
# substitution's own children).
children_jiffies() {
    local c
    times >"$OUT/times"
    c="$(tail -n 1 "$OUT/times")"
    awk -v hz="$HZ" '{ u = $1; s = $2; gsub(/[ms]/, " ", u); gsub(/[ms]/, " ", s)
        split(u, a, " "); split(s, b, " "); printf "%d\n", (a[1] * 60 + a[2] + b[1] * 60 + b[2]) * hz }' <<<"$c"
}

# one_run TRANSPORT RUN: the workers at once; prints the run's JSON line.
one_run() {
    local t="$1" run="$2" r b0 b1 s0 s1 c0 c1 w0 w1 rc=0
    children_jiffies >"$OUT/c0"
    c0="$(<"$OUT/c0")"
    s0="$(switchd_jiffies)"
    w0="$(date +%s.%N)"
    b0="$(busy_jiffies)"
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
    b1="$(busy_jiffies)"
    w1="$(date +%s.%N)"
    s1="$(switchd_jiffies)"
    children_jiffies >"$OUT/c1"
    c1="$(<"$OUT/c1")"
    ((rc == 0)) || die "a worker failed ($t run $run, status $rc); see $OUT"
    jq -s -c --arg t "$t" --argjson run "$run" --argjson cpu "$((b1 - b0))" --argjson hz "$HZ" \
        --argjson wall "$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.3f", b - a }')" \
        --argjson sw "$((s1 - s0))" --argjson wk "$((c1 - c0))" \
        '{transport: $t, ran: (map(.transport) | unique), run: $run,
          seconds: (map(.seconds) | max), cpu_s: ($cpu / $hz), wall_s: $wall,
          workers_cpu_s: ($wk / $hz), switchd_cpu_s: ($sw / $hz),
          tx_coalesced: (map(.stats.tx_coalesced) | add),
          rx_coalesced: (map(.stats.rx_coalesced) | add),
          chunks_sent: (map(.stats.chunks_sent) | add),
          resent: (map(.stats.chunks_resent) | add)}' "$OUT/$t-$run"-rank*.json
}

for ((run = 0; run < RUNS; run++)); do
    for t in $TRANSPORTS; do
        one_run "$t" "$run" | tee -a "$OUT/runs.jsonl"
    done
done
jq -s -c 'group_by(.transport)[] | {transport: .[0].transport,
    median_seconds: (map(.seconds) | sort | .[length / 2 | floor]),
    median_cpu_s: (map(.cpu_s) | sort | .[length / 2 | floor]),
    median_workers_cpu_s: (map(.workers_cpu_s) | sort | .[length / 2 | floor]),
    median_switchd_cpu_s: (map(.switchd_cpu_s) | sort | .[length / 2 | floor])}' "$OUT/runs.jsonl"
log "worker tx offload $WORKER_TX; runs in $OUT"
