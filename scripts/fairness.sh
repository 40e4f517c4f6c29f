#!/usr/bin/env bash
#
# fairness.sh: does the aggregation traffic's congestion control keep a
# latency-sensitive flow's tail latency down? (PANAMA's headline, issue 4.)
#
# Makes a testbed of 4 workers and 1 host (scripts/testbed.sh, prefix "fair"),
# runs two aggregation jobs through switchd (job 1: fair-w0 + fair-w1, job 2:
# fair-w2 + fair-w3) and a sockperf UDP ping-pong from fair-w0 to a sockperf
# server in fair-h0. Every worker's eth0 egress is a rate-limited FIFO that
# marks CE on ECT packets when its queue is long; fair-w0's queue carries both
# job 1's DATA and the ping-pong's requests. Three runs of N seconds each:
#
#   idle    sockperf alone
#   no_cc   sockperf + both jobs all-reducing with --no-congestion-control
#   cc      sockperf + both jobs all-reducing with the DCTCP window (default)
#
# For each run it records sockperf's p50/p99/p99.9 round trip (µs), each
# job's all-reduce throughput (Gbit/s of gradient per rank), Jain's fairness
# index between the two jobs, the workers' final window/alpha/ECE counts, the
# queue's CE marks and mean depth, and the switch's per-job counters. Prints a
# table, writes bench/results/fairness.json and bench/results/fairness.png (plus timestamped
# copies and all raw logs under results/fairness-STAMP/). This script only
# orchestrates and leaves raw counter dumps, sockperf output and worker
# reports in results/fairness-STAMP/; bench/harness/fairness_report.py computes
# every figure, the JSON, the tables and the plot from them.
#
# Usage:
#   sudo scripts/fairness.sh [--seconds N] [--repeat R] [--rate MBIT]
#                            [--mark-min BYTES] [--mark-max BYTES]
#                            [--elements E] [--probe ul|pp] [--mps M|max]
#                            [--runs idle,no_cc,cc] [--no-docs]
#                            [--no-install] [--no-build]
#
#   --seconds N      length of each run's latency measurement (default 20)
#   --repeat R       do the runs R times, interleaved; the table and the plot
#                    show the median over the repeats (default 1)
#   --rate MBIT      egress shaper rate of every worker (default 100 Mbit/s)
#   --mark-min BYTES queue depth above which CE marking starts (default 6000)
#   --mark-max BYTES queue depth at which every ECT packet is marked
#                    (default 18000); linear in between, as RED with
#                    probability 1.0 on the instantaneous queue
#   --elements E     float32 elements per all-reduce (default 4194304, 16 MiB)
#   --probe ul|pp    sockperf mode: ul = under-load with --reply-every 1
#                    (default: open loop, a message every 1/M s whatever the
#                    round trip, so samples are spread evenly over time);
#                    pp = ping-pong (closed loop: the next message waits for
#                    the reply, so long round trips are under-sampled)
#   --mps M|max      sockperf messages per second (default 1000; sockperf
#                    busy-waits one core to pace them)
#   --runs LIST      which runs, comma-separated (default idle,no_cc,cc)
#   --no-docs        write results/ only, leave bench/results/fairness.{json,png} alone
#   --no-install     do not apt-get install missing packages
#   --no-build       do not run cargo build (use target/release as is)
#
# The CE marker is a small tc-BPF program on eth0's egress hook that reads the
# depth of the device's root qdisc (the HTB shaper) and marks ECT packets
# (needs a kernel with BTF and the bpf_cast_to_kern_ctx kfunc, 6.2+). When it
# cannot be loaded, the FIFO is a RED qdisc with `ecn` and the same
# thresholds instead (needs sch_red). The JSON's "marker" says which was used.
#
# FAIRNESS_PREFIX in the environment changes the testbed prefix (default
# fair). Needs root. Everything it starts is stopped by PID, the testbed removed, on
# exit (also on failure or Ctrl-C).

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly PREFIX="${FAIRNESS_PREFIX:-fair}"
readonly AGG_PORT=48879
readonly SOCKPERF_PORT=11111
readonly MSG_SIZE=64
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=10
# Bytes of one full chunk's DATA on the wire (the shaped way, worker egress):
# 358 floats + 22 (header) + 8 (UDP) + 20 (IPv4) + 14 (Ethernet).
readonly CHUNK_PAYLOAD=1432
readonly CHUNK_WIRE=1496

ORIG_ARGS=("$@")
RUN_SECONDS=20
RATE_MBIT=100
MARK_MIN=6000
MARK_MAX=18000
ELEMENTS=4194304
MPS=1000
PROBE=ul
PROBE_PRIO=${FAIR_PROBE_PRIO:-0}
REPEAT=1
RUNS="idle,no_cc,cc"
WRITE_DOCS=1
INSTALL=1
BUILD=1

while [[ $# -gt 0 ]]; do
    case "$1" in
        --seconds|--repeat|--rate|--mark-min|--mark-max|--elements|--probe|--mps|--runs)
            [[ $# -ge 2 ]] || die "$1 needs a value"
            case "$1" in
                --seconds) RUN_SECONDS="$2" ;;
                --repeat) REPEAT="$2" ;;
                --probe) PROBE="$2" ;;
                --rate) RATE_MBIT="$2" ;;
                --mark-min) MARK_MIN="$2" ;;
                --mark-max) MARK_MAX="$2" ;;
                --elements) ELEMENTS="$2" ;;
                --mps) MPS="$2" ;;
                --runs) RUNS="$2" ;;
            esac
            shift 2 ;;
        --no-docs) WRITE_DOCS=0; shift ;;
        --no-install) INSTALL=0; shift ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
uint_in_range "$RUN_SECONDS" 2 3600 || die "--seconds must be 2..3600, got '$RUN_SECONDS'"
uint_in_range "$RATE_MBIT" 1 100000 || die "--rate must be 1..100000 (Mbit/s), got '$RATE_MBIT'"
uint_in_range "$MARK_MIN" 0 100000000 || die "--mark-min must be a byte count, got '$MARK_MIN'"
uint_in_range "$MARK_MAX" 1 100000000 || die "--mark-max must be a byte count, got '$MARK_MAX'"
uint_in_range "$ELEMENTS" 1 268435456 || die "--elements must be 1..268435456, got '$ELEMENTS'"
RUN_SECONDS=$((10#$RUN_SECONDS)); RATE_MBIT=$((10#$RATE_MBIT)); MARK_MIN=$((10#$MARK_MIN))
MARK_MAX=$((10#$MARK_MAX)); ELEMENTS=$((10#$ELEMENTS))
((MARK_MAX > MARK_MIN)) || die "--mark-max ($MARK_MAX) must be above --mark-min ($MARK_MIN)"
uint_in_range "$REPEAT" 1 100 || die "--repeat must be 1..100, got '$REPEAT'"
REPEAT=$((10#$REPEAT))
case "$PROBE" in
    ul) PROBE_MODE=under-load ;;
    pp) PROBE_MODE=ping-pong ;;
    *) die "--probe must be ul (under-load) or pp (ping-pong), got '$PROBE'" ;;
esac
[[ "$MPS" == max ]] || uint_in_range "$MPS" 1 1000000 || die "--mps must be max or 1..1000000, got '$MPS'"
IFS=, read -r -a RUN_LIST <<<"$RUNS"
((${#RUN_LIST[@]} > 0)) || die "--runs is empty"
for r in "${RUN_LIST[@]}"; do
    case "$r" in idle|no_cc|cc) ;; *) die "--runs: unknown run '$r' (idle, no_cc, cc)" ;; esac
done
PROBE_PRIO_CMD=(env)
((PROBE_PRIO > 0)) && PROBE_PRIO_CMD=(chrt -f "$PROBE_PRIO")
readonly RUN_SECONDS RATE_MBIT MARK_MIN MARK_MAX ELEMENTS MPS RUN_LIST WRITE_DOCS REPEAT PROBE PROBE_MODE

require_root "${ORIG_ARGS[@]}"
cd "$REPO_ROOT"

# --- cleanup --------------------------------------------------------------------
RESULTS_DIR=""
BIN_DIR=""
TESTBED_MADE=0
SWITCHD_PID=""
SERVER_PID=""
CLIENT_PID=""
WORKER_PIDS=()

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${WORKER_PIDS[@]}" "$CLIENT_PID" "$SERVER_PID" "$SWITCHD_PID"; do
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

# --- tools ----------------------------------------------------------------------
ensure_tools() {
    ensure_debian_packages "$INSTALL" sockperf python3-matplotlib clang llvm libbpf-dev \
        linux-libc-dev bpftool iproute2 jq
    local p
    for p in sockperf jq tc clang bpftool; do
        command -v "$p" >/dev/null 2>&1 || die "$p not found after installing packages"
    done
}

ensure_tools
if ((BUILD == 1)); then
    build_release
fi
# Private copies of the binaries: a rebuild of target/ while the runs go on
# must not change what is measured.
BIN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/fairness-bin.XXXXXX")"
for b in switchd switchctl worker; do
    [[ -x "$REPO_ROOT/target/release/$b" ]] ||
        die "target/release/$b missing (build with: cargo build --release --workspace --bins)"
    cp "$REPO_ROOT/target/release/$b" "$BIN_DIR/$b"
done
SWITCHD="$BIN_DIR/switchd"
SWITCHCTL="$BIN_DIR/switchctl"
WORKER="$BIN_DIR/worker"

STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
RESULTS_DIR="$REPO_ROOT/results/fairness-$STAMP"
mkdir -p "$RESULTS_DIR"
CFG="$RESULTS_DIR/switchd.toml"
SWITCHD_LOG="$RESULTS_DIR/switchd.log"
ADMIN_SOCK="$RESULTS_DIR/switchd.sock"

# --- the bottleneck: shaper + CE marker (setup_ecn_bottleneck in lib.sh) ----------
MARKER=""
setup_bottleneck() {
    local i devs=()
    for ((i = 0; i < 4; i++)); do devs+=("$PREFIX-w$i:eth0"); done
    setup_ecn_bottleneck "$RESULTS_DIR" "$RATE_MBIT" "$MARK_MIN" "$MARK_MAX" "${devs[@]}"
    MARKER="$ECN_MARKER"
    log "bottleneck: every worker's eth0 egress at $RATE_MBIT Mbit/s, CE marks from $MARK_MIN to $MARK_MAX bytes of queue ($MARKER)"
}

# queue_snapshot NS OUT: the raw counters of NS's eth0 queue so far, for
# fairness_report.py: the qdiscs (OUT.tc.json) and, with the tc-BPF marker,
# its counter map (OUT.map.json).
queue_snapshot() {
    local ns="$1" out="$2" map
    tc -n "$ns" -s -j qdisc show dev eth0 >"$out.tc.json"
    if [[ "$MARKER" == bpf ]]; then
        map="$(ecn_marker_map_id "$ns" eth0)" || die "the CE marker on $ns eth0 is gone"
        bpftool map dump id "$map" -j >"$out.map.json"
    fi
}

# --- testbed, switchd, sockperf server --------------------------------------------
TESTBED_MADE=1
testbed_up "$RESULTS_DIR/testbed.env" --prefix "$PREFIX" --workers 4 --hosts 1 2>/dev/null
SWITCH_ADDR="$(tb switch_addr)"
HOST_ADDR="$(tb host_0_addr)"
readonly SWITCH_ADDR HOST_ADDR
setup_bottleneck

SECRET1="$(random_secret)"
SECRET2="$(random_secret)"

# Job 1: workers 0 and 1, job 2: workers 2 and 3 (written by switchd itself:
# typed config, the testbed's addresses; mode 0600).
printf '%s' "$SECRET1" >"$RESULTS_DIR/secret1"
printf '%s' "$SECRET2" >"$RESULTS_DIR/secret2"
chmod 600 "$RESULTS_DIR/secret1" "$RESULTS_DIR/secret2"
"$SWITCHD" testbed-config --env "$TESTBED_ENV" --out "$CFG" --writer scripts/fairness.sh \
    --host-ports --job "1:0-1:file:$RESULTS_DIR/secret1" --job "2:2-3:file:$RESULTS_DIR/secret2" \
    --set "switch.agg_port=$AGG_PORT" --set "switch.admin_socket=\"$ADMIN_SOCK\"" ||
    die "switchd testbed-config failed"

log "starting switchd in $PREFIX-sw"
start_switchd "$PREFIX-sw" "$SWITCHD" "$SWITCHD_LOG" run --config "$CFG"

ip netns exec "$PREFIX-h0" "${PROBE_PRIO_CMD[@]}" sockperf server -i "$HOST_ADDR" -p "$SOCKPERF_PORT" \
    >"$RESULTS_DIR/sockperf-server.log" 2>&1 &
SERVER_PID=$!
sleep 0.5
kill -0 "$SERVER_PID" 2>/dev/null || { cat "$RESULTS_DIR/sockperf-server.log" >&2; die "sockperf server exited"; }

switch_stats() {
    "$SWITCHCTL" --socket "$ADMIN_SOCK" stats --json 2>/dev/null || echo '{}'
}

# wait_jobs_active: until both jobs are active (every rank joined).
wait_jobs_active() {
    local deadline=$((SECONDS + READY_TIMEOUT)) n
    while :; do
        n="$(switch_stats | jq '[.jobs[]? | select(.state == "active")] | length')"
        [[ "$n" -ge 2 ]] && return 0
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

# --- one run ---------------------------------------------------------------------
# Iterations per worker: enough that even at the shaper's full rate the
# all-reduces outlast the latency measurement (+3 s), so sockperf always
# shares the queue with both jobs; slower jobs simply run longer.
bits_per_iter=$((ELEMENTS * 32))
goodput_bps=$((RATE_MBIT * 1000000 * CHUNK_PAYLOAD / CHUNK_WIRE))
ITERATIONS=$(((RUN_SECONDS + 3) * goodput_bps / bits_per_iter + 2))
readonly ITERATIONS
WORKER_TIMEOUT=$((RUN_SECONDS * 10 + 120))

run_one() {
    local name="$1" repeat="$2" cc_flag="" label i j rank secret
    local dir="$RESULTS_DIR/$name-$repeat"
    mkdir -p "$dir"
    case "$name" in
        idle) label="idle (sockperf alone)" ;;
        no_cc) label="load, no congestion control"; cc_flag="--no-congestion-control" ;;
        cc) label="load, DCTCP congestion control" ;;
    esac
    log "run '$name' ($repeat of $REPEAT): $label, ${RUN_SECONDS} s"

    for ((i = 0; i < 4; i++)); do
        queue_snapshot "$PREFIX-w$i" "$dir/queue-w$i.before"
    done
    switch_stats >"$dir/switch.before.json"

    WORKER_PIDS=()
    if [[ "$name" != idle ]]; then
        for ((i = 0; i < 4; i++)); do
            j=$((i / 2 + 1)); rank=$((i % 2)); secret="$SECRET1"
            ((j == 2)) && secret="$SECRET2"
            # shellcheck disable=SC2086  # cc_flag is empty or one word
            AGGSWITCH_SECRET="$secret" ip netns exec "$PREFIX-w$i" "$WORKER" allreduce --switch "$SWITCH_ADDR" \
                --job "$j" --rank "$rank" --workers 2 \
                --elements "$ELEMENTS" --iterations "$ITERATIONS" --json $cc_flag \
                >"$dir/worker-w$i.json" 2>"$dir/worker-w$i.log" &
            WORKER_PIDS[i]=$!
        done
        wait_jobs_active || die "run '$name': the jobs did not become active within $READY_TIMEOUT s (see ${dir#"$REPO_ROOT"/})"
        sleep 1  # past slow start: the window has met the queue
    fi

    switch_stats >"$dir/switch.start.json"
    date +%s.%N >"$dir/probe.t0"
    local -a probe_args=()
    [[ "$PROBE" == ul ]] && probe_args=(--reply-every 1)
    ip netns exec "$PREFIX-w0" "${PROBE_PRIO_CMD[@]}" sockperf "$PROBE_MODE" -i "$HOST_ADDR" -p "$SOCKPERF_PORT" \
        -t "$RUN_SECONDS" --msg-size "$MSG_SIZE" --full-rtt --mps "$MPS" "${probe_args[@]}" \
        --full-log "$dir/sockperf.csv" >"$dir/sockperf.txt" 2>&1 &
    CLIENT_PID=$!
    local rc=0
    wait "$CLIENT_PID" || rc=$?
    CLIENT_PID=""
    date +%s.%N >"$dir/probe.t1"
    switch_stats >"$dir/switch.end.json"
    ((rc == 0)) || warn "run '$name': sockperf exited with status $rc (see ${dir#"$REPO_ROOT"/}/sockperf.txt)"

    # Let the all-reduces finish (they print their JSON at the end).
    local -a status=()
    if ((${#WORKER_PIDS[@]} > 0)); then
        local deadline=$((SECONDS + WORKER_TIMEOUT)) left
        while :; do
            left=0
            for ((i = 0; i < 4; i++)); do
                [[ -z "${status[i]:-}" ]] || continue
                if kill -0 "${WORKER_PIDS[i]}" 2>/dev/null; then
                    left=$((left + 1))
                else
                    rc=0
                    wait "${WORKER_PIDS[i]}" || rc=$?
                    status[i]=$rc
                fi
            done
            ((left > 0)) || break
            if ((SECONDS >= deadline)); then
                warn "run '$name': workers still running after $WORKER_TIMEOUT s; stopping them"
                for ((i = 0; i < 4; i++)); do
                    if [[ -z "${status[i]:-}" ]]; then
                        stop_pid "${WORKER_PIDS[i]}"
                        status[i]=timeout
                    fi
                done
                break
            fi
            sleep 0.2
        done
        for ((i = 0; i < 4; i++)); do
            printf '%s\n' "${status[i]}" >"$dir/worker-w$i.exit"
            [[ "${status[i]}" == 0 ]] ||
                warn "run '$name': worker $PREFIX-w$i exited with ${status[i]}: $(tail -n 2 "$dir/worker-w$i.log" | tr '\n' ' ')"
        done
    fi
    WORKER_PIDS=()
    switch_stats >"$dir/switch.after.json"
    for ((i = 0; i < 4; i++)); do
        queue_snapshot "$PREFIX-w$i" "$dir/queue-w$i.after"
    done

    sleep 1
}

for ((rep = 1; rep <= REPEAT; rep++)); do
    for r in "${RUN_LIST[@]}"; do
        run_one "$r" "$rep"
    done
done

# --- results: run JSONs, summary JSON, tables and plot (fairness_report.py) ------
OUT_JSON="$REPO_ROOT/results/fairness-$STAMP.json"
OUT_PNG="$REPO_ROOT/results/fairness-$STAMP.png"
echo
"$PYTHON" "$REPO_ROOT/bench/harness/fairness_report.py" report "$RESULTS_DIR" --json "$OUT_JSON" --png "$OUT_PNG" \
    --prefix "$PREFIX" --marker "$MARKER" --rate "$RATE_MBIT" --mark-min "$MARK_MIN" --mark-max "$MARK_MAX" \
    --elements "$ELEMENTS" --iterations "$ITERATIONS" --seconds "$RUN_SECONDS" --repeat "$REPEAT" \
    --runs "$RUNS" --mps "$MPS" --msg-size "$MSG_SIZE" --probe-mode "$PROBE_MODE" --host-addr "$HOST_ADDR" \
    --command "sudo scripts/fairness.sh${ORIG_ARGS[*]:+ ${ORIG_ARGS[*]}}" \
    --commit "$(git -C "$REPO_ROOT" describe --always --dirty 2>/dev/null || echo unknown)" ||
    die "fairness_report.py failed (raw outputs in ${RESULTS_DIR#"$REPO_ROOT"/})"
if ((WRITE_DOCS == 1)); then
    mkdir -p "$REPO_ROOT/docs"
    cp "$OUT_JSON" "$REPO_ROOT/bench/results/fairness.json"
    cp "$OUT_PNG" "$REPO_ROOT/bench/results/fairness.png"
    log "wrote bench/results/fairness.json and bench/results/fairness.png (copies: results/fairness-$STAMP.{json,png})"
else
    log "wrote results/fairness-$STAMP.{json,png}"
fi
