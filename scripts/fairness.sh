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
# table, writes docs/fairness.json and docs/fairness.png (plus timestamped
# copies and all raw logs under results/fairness-STAMP/).
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
#   --no-docs        write results/ only, leave docs/fairness.{json,png} alone
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
# Bytes of one full chunk on the wire: 362 floats + 22 (header) + 8 (UDP)
# + 20 (IPv4) + 14 (Ethernet).
readonly CHUNK_PAYLOAD=1448
readonly CHUNK_WIRE=1512

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

# marker_counters NS: one JSON object of the queue's counters so far.
marker_counters() {
    local ns="$1" qd sent pkts drops
    qd="$(tc -n "$ns" -s -j qdisc show dev eth0)"
    read -r sent pkts drops < <(jq -r '[.[] | select(.kind == "htb")][0] | "\(.bytes // 0) \(.packets // 0) \(.drops // 0)"' <<<"$qd")
    if [[ "$MARKER" == bpf ]]; then
        local map
        map="$(ecn_marker_map_id "$ns" eth0)"
        bpftool map dump id "$map" -j | jq -c --argjson sent "$sent" --argjson pkts "$pkts" --argjson drops "$drops" '
            [.[] | (.formatted // .) | {(.key | tostring): .value}] | add
            | {ect: .["0"], marked: .["1"], other: .["2"], backlog_sum_ect: .["3"],
               backlog_sum_other: .["4"], backlog_max: .["5"],
               sent_bytes: $sent, sent_packets: $pkts, drops: $drops}'
    else
        jq -c --argjson sent "$sent" --argjson pkts "$pkts" --argjson drops "$drops" '
            [.[] | select(.kind == "red")][0]
            | {ect: null, marked: (.marked // 0), other: null, backlog_sum_ect: null,
               backlog_sum_other: null, backlog_max: null,
               sent_bytes: $sent, sent_packets: $pkts, drops: $drops}' <<<"$qd"
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

# quantiles CSV...: sockperf --full-log rtt column(s) → a JSON CDF {q: [...], rtt_us: [...]}.
quantiles() {
    awk -F', *' 'FNR == 1 { f = 0 } f && $4 != "" && $1 ~ /^[0-9]+$/ { print $4 } /^packet, txTime/ { f = 1 }' "$@" |
        sort -g |
        awk 'BEGIN {
                 nq = 0
                 for (i = 0; i < 99; i++) Q[++nq] = i
                 for (i = 990; i < 999; i++) Q[++nq] = i / 10
                 for (i = 9990; i <= 10000; i++) Q[++nq] = i / 100
             }
             { v[NR] = $1 }
             END {
                 if (NR == 0) { print "{\"q\": [], \"rtt_us\": []}"; exit }
                 qs = ""; rs = ""
                 for (i = 1; i <= nq; i++) {
                     k = int(Q[i] / 100 * (NR - 1) + 0.5) + 1
                     qs = qs (i > 1 ? ", " : "") Q[i]
                     rs = rs (i > 1 ? ", " : "") v[k]
                 }
                 printf "{\"q\": [%s], \"rtt_us\": [%s], \"samples\": %d}\n", qs, rs, NR
             }'
}

# sockperf_summary OUT: JSON of sockperf's own statistics (first block).
sockperf_summary() {
    awk '
        /percentile 50.000 =/ && !p50 { p50 = $NF }
        /percentile 99.000 =/ && !p99 { p99 = $NF }
        /percentile 99.900 =/ && !p999 { p999 = $NF }
        /<MAX> observation =/ && !mx { mx = $NF }
        /<MIN> observation =/ && !mn { mn = $NF }
        /avg-rtt=/ && !avg { s = $0; sub(/.*avg-rtt=/, "", s); sub(/[^0-9.].*/, "", s); avg = s }
        /# dropped messages =/ && drop == "" { s = $0; sub(/.*# dropped messages = /, "", s); sub(/;.*/, "", s); drop = s }
        /\[Valid Duration\]/ && !rx { s = $0; sub(/.*ReceivedMessages=/, "", s); sub(/[^0-9].*/, "", s); rx = s }
        END {
            if (p50 == "") { print "null"; exit }
            printf "{\"p50\": %s, \"p99\": %s, \"p999\": %s, \"max\": %s, \"min\": %s, \"avg\": %s, \"samples\": %s, \"dropped\": %s}\n",
                p50, p99, p999, (mx == "" ? "null" : mx), (mn == "" ? "null" : mn),
                (avg == "" ? "null" : avg), (rx == "" ? "null" : rx), (drop == "" ? "null" : drop)
        }' "$1"
}

declare -a RUN_JSONS=()

run_one() {
    local name="$1" repeat="$2" cc_flag="" label i j rank secret t0 t1
    local dir="$RESULTS_DIR/$name-$repeat"
    mkdir -p "$dir"
    case "$name" in
        idle) label="idle (sockperf alone)" ;;
        no_cc) label="load, no congestion control"; cc_flag="--no-congestion-control" ;;
        cc) label="load, DCTCP congestion control" ;;
    esac
    log "run '$name' ($repeat of $REPEAT): $label, ${RUN_SECONDS} s"

    for ((i = 0; i < 4; i++)); do
        marker_counters "$PREFIX-w$i" >"$dir/queue-w$i.before.json"
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
    t0="$(date +%s.%N)"
    local -a probe_args=()
    [[ "$PROBE" == ul ]] && probe_args=(--reply-every 1)
    ip netns exec "$PREFIX-w0" "${PROBE_PRIO_CMD[@]}" sockperf "$PROBE_MODE" -i "$HOST_ADDR" -p "$SOCKPERF_PORT" \
        -t "$RUN_SECONDS" --msg-size "$MSG_SIZE" --full-rtt --mps "$MPS" "${probe_args[@]}" \
        --full-log "$dir/sockperf.csv" >"$dir/sockperf.txt" 2>&1 &
    CLIENT_PID=$!
    local rc=0
    wait "$CLIENT_PID" || rc=$?
    CLIENT_PID=""
    t1="$(date +%s.%N)"
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
            [[ "${status[i]}" == 0 ]] ||
                warn "run '$name': worker fair-w$i exited with ${status[i]}: $(tail -n 2 "$dir/worker-w$i.log" | tr '\n' ' ')"
        done
    fi
    WORKER_PIDS=()
    switch_stats >"$dir/switch.after.json"
    for ((i = 0; i < 4; i++)); do
        marker_counters "$PREFIX-w$i" >"$dir/queue-w$i.after.json"
    done

    # --- this run's JSON ---
    local lat cdf workers_json="[]" queues_json="[]" w cc_json=null
    [[ "$name" == cc ]] && cc_json=true
    [[ "$name" == no_cc ]] && cc_json=false
    lat="$(sockperf_summary "$dir/sockperf.txt")"
    cdf='{"q": [], "rtt_us": []}'
    [[ -s "$dir/sockperf.csv" ]] && cdf="$(quantiles "$dir/sockperf.csv")"
    if [[ "$name" != idle ]]; then
        workers_json="$(for ((i = 0; i < 4; i++)); do
            w="$(grep -E '^[[:space:]]*\{' "$dir/worker-w$i.json" 2>/dev/null | tail -n 1 || true)"
            jq -cn --arg ns "$PREFIX-w$i" --arg st "${status[i]}" --argjson w "${w:-null}" \
                '{ns: $ns, exit: $st, report: $w}'
        done | jq -cs .)"
    fi
    queues_json="$(for ((i = 0; i < 4; i++)); do
        jq -cn --arg ns "$PREFIX-w$i" --slurpfile a "$dir/queue-w$i.before.json" \
            --slurpfile b "$dir/queue-w$i.after.json" '
            def d(k): if ($b[0][k] == null or $a[0][k] == null) then null else $b[0][k] - $a[0][k] end;
            {ns: $ns, ect_packets: d("ect"), ce_marked: d("marked"), other_packets: d("other"),
             mean_backlog_ect_bytes: (if (d("ect") // 0) > 0 then d("backlog_sum_ect") / d("ect") else null end),
             mean_backlog_other_bytes: (if (d("other") // 0) > 0 then d("backlog_sum_other") / d("other") else null end),
             max_backlog_bytes_ever: $b[0].backlog_max,
             sent_packets: d("sent_packets"), drops: d("drops")}'
    done | jq -cs .)"

    jq -n --arg name "$name" --argjson repeat "$repeat" --arg lbl "$label" --argjson seconds "$RUN_SECONDS" \
        --argjson t0 "$t0" --argjson t1 "$t1" \
        --argjson lat "$lat" --argjson cdf "$cdf" --argjson workers "$workers_json" \
        --argjson queues "$queues_json" \
        --slurpfile s0 "$dir/switch.before.json" --slurpfile ss "$dir/switch.start.json" \
        --slurpfile se "$dir/switch.end.json" --slurpfile s1 "$dir/switch.after.json" \
        --argjson cc "$cc_json" '
        def job(s; id): ((s[0].jobs // []) | map(select(.id == id)) | .[0]) // {};
        def jain(x): if (x | length) == 2 and (x | all(. != null)) and ((x[0] * x[0] + x[1] * x[1]) > 0)
                     then ((x[0] + x[1]) * (x[0] + x[1])) / (2 * (x[0] * x[0] + x[1] * x[1])) else null end;
        ($workers | map(select(.report != null) | .report)) as $reps
        | ([1, 2] | map(. as $id
            | ($reps | map(select(.job == $id))) as $r
            | {id: $id,
               ranks: ($r | map({rank, gbit_per_s, seconds, iterations,
                                 window: .stats.window, alpha: .stats.alpha,
                                 ece_results: .stats.ece_results, results: .stats.results,
                                 chunks_sent: .stats.chunks_sent, chunks_resent: .stats.chunks_resent,
                                 srtt_us: .stats.srtt_us, rto_us: .stats.rto_us})),
               gbit_per_s: (if ($r | length) > 0 then ($r | map(.gbit_per_s) | add / length) else null end),
               gbit_per_s_during_probe: (
                   ((job($se; $id).bytes_aggregated // 0) - (job($ss; $id).bytes_aggregated // 0)) as $db
                   | if ($t1 - $t0) > 0 and (job($ss; $id).n_workers // 0) > 0
                     then $db * 8 / (job($ss; $id).n_workers) / ($t1 - $t0) / 1e9 else null end),
               switch: {ece_marked: ((job($s1; $id).ece_marked // 0) - (job($s0; $id).ece_marked // 0)),
                        results_sent: ((job($s1; $id).results_sent // 0) - (job($s0; $id).results_sent // 0)),
                        retransmits_served: ((job($s1; $id).retransmits_served // 0) - (job($s0; $id).retransmits_served // 0)),
                        chunks_completed: ((job($s1; $id).chunks_completed // 0) - (job($s0; $id).chunks_completed // 0))}}
            )) as $jobs
        | {name: $name, repeat: $repeat, label: $lbl, congestion_control: $cc, seconds: $seconds,
           latency_us: $lat, cdf: $cdf,
           jobs: (if $name == "idle" then [] else $jobs end),
           jain: (if $name == "idle" then null else jain($jobs | map(.gbit_per_s)) end),
           jain_during_probe: (if $name == "idle" then null else jain($jobs | map(.gbit_per_s_during_probe)) end),
           queues: $queues,
           switch_ring_congested_frames: (($s1[0].ring_congested_frames // 0) - ($s0[0].ring_congested_frames // 0)),
           workers: $workers}' >"$dir/run.json"
    RUN_JSONS+=("$dir/run.json")
    sleep 1
}

for ((rep = 1; rep <= REPEAT; rep++)); do
    for r in "${RUN_LIST[@]}"; do
        run_one "$r" "$rep"
    done
done

# --- results -----------------------------------------------------------------------
# Pooled round-trip distribution of each kind of run over its repeats.
POOLED="$RESULTS_DIR/pooled-cdf.json"
for r in "${RUN_LIST[@]}"; do
    csvs=()
    for ((rep = 1; rep <= REPEAT; rep++)); do
        [[ -s "$RESULTS_DIR/$r-$rep/sockperf.csv" ]] && csvs+=("$RESULTS_DIR/$r-$rep/sockperf.csv")
    done
    if ((${#csvs[@]} > 0)); then
        jq -cn --arg n "$r" --argjson c "$(quantiles "${csvs[@]}")" '{($n): $c}'
    fi
done | jq -s 'add // {}' >"$POOLED"

OUT_JSON="$REPO_ROOT/results/fairness-$STAMP.json"
names_json="$(printf '%s\n' "${RUN_LIST[@]}" | jq -R . | jq -cs .)"
jq -s --arg stamp "$STAMP" --arg kernel "$(uname -r)" --arg marker "$MARKER" \
    --argjson rate "$RATE_MBIT" --argjson mmin "$MARK_MIN" --argjson mmax "$MARK_MAX" \
    --argjson elements "$ELEMENTS" --argjson iterations "$ITERATIONS" \
    --argjson seconds "$RUN_SECONDS" --arg mps "$MPS" --argjson cpus "$(nproc)" \
    --argjson repeat "$REPEAT" --arg probe "sockperf $PROBE_MODE" --argjson names "$names_json" \
    --arg host_addr "$HOST_ADDR" \
    --slurpfile pooled "$POOLED" \
    --arg cmdline "sudo scripts/fairness.sh${ORIG_ARGS[*]:+ ${ORIG_ARGS[*]}}" \
    --arg commit "$(git -C "$REPO_ROOT" describe --always --dirty 2>/dev/null || echo unknown)" '
    def median: map(select(. != null)) | sort
        | if length == 0 then null
          elif length % 2 == 1 then .[(length - 1) / 2]
          else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    . as $runs
    | {generated: $stamp, commit: $commit, kernel: $kernel, cpus: $cpus, command: $cmdline,
       setup: {workers: 4,
               jobs: [{id: 1, ranks: ["fair-w0", "fair-w1"]}, {id: 2, ranks: ["fair-w2", "fair-w3"]}],
               probe: {tool: $probe, client: "fair-w0", server: ("fair-h0 " + $host_addr),
                       msg_size: 64, mps: $mps, metric: "round trip (--full-rtt), microseconds"},
               bottleneck: {where: "egress of every worker eth0", rate_mbit: $rate, marker: $marker,
                            mark_min_bytes: $mmin, mark_max_bytes: $mmax},
               elements: $elements, iterations_per_worker: $iterations,
               seconds_per_run: $seconds, repeats: $repeat,
               switch: {pool_slots: 256, ecn_ring_threshold: "default"}},
       summary: [$names[] as $n | [$runs[] | select(.name == $n)] as $rs | select(($rs | length) > 0)
           | {name: $n, label: $rs[0].label, congestion_control: $rs[0].congestion_control,
              repeats: ($rs | length),
              latency_us: {p50: ($rs | map(.latency_us.p50) | median),
                           p99: ($rs | map(.latency_us.p99) | median),
                           p999: ($rs | map(.latency_us.p999) | median),
                           max: ($rs | map(.latency_us.max) | median),
                           avg: ($rs | map(.latency_us.avg) | median),
                           samples: ($rs | map(.latency_us.samples // 0) | add),
                           dropped: ($rs | map(.latency_us.dropped // 0) | add)},
              cdf: ($pooled[0][$n] // {q: [], rtt_us: []}),
              jobs: (if $n == "idle" then [] else [1, 2] | map(. as $id
                  | ($rs | map(.jobs[] | select(.id == $id))) as $js
                  | {id: $id,
                     gbit_per_s: ($js | map(.gbit_per_s) | median),
                     gbit_per_s_during_probe: ($js | map(.gbit_per_s_during_probe) | median),
                     final_windows: ($js | map(.ranks[].window)),
                     final_alphas: ($js | map(.ranks[].alpha)),
                     ece_results: ($js | map(.ranks[].ece_results)),
                     results: ($js | map(.ranks[].results)),
                     chunks_resent: ($js | map(.ranks[].chunks_resent)),
                     switch_ece_marked: ($js | map(.switch.ece_marked) | add)}) end),
              jain: ($rs | map(.jain) | median),
              jain_during_probe: ($rs | map(.jain_during_probe) | median),
              w0_queue: {ce_marked_fraction: ($rs | map(.queues[0] | if (.ect_packets // 0) > 0 then .ce_marked / .ect_packets else null end) | median),
                         mean_backlog_probe_bytes: ($rs | map(.queues[0].mean_backlog_other_bytes) | median),
                         mean_backlog_data_bytes: ($rs | map(.queues[0].mean_backlog_ect_bytes) | median)}}],
       runs: $runs}' "${RUN_JSONS[@]}" >"$OUT_JSON"

# --- table ---
echo
echo "=== fairness: $RATE_MBIT Mbit/s per worker egress, CE marks ${MARK_MIN}-${MARK_MAX} B ($MARKER), sockperf $PROBE_MODE ${MSG_SIZE} B at $MPS msg/s from fair-w0, ${RUN_SECONDS} s per run$( ((REPEAT > 1)) && echo ", median of $REPEAT repeats") ==="
jq -r '
    def f(x; n): if x == null then "-" else (x * pow(10; n) | round / pow(10; n) | tostring) end;
    (["run", "p50_us", "p99_us", "p99.9_us", "max_us", "job1_Gbps", "job2_Gbps", "Jain", "w0_probe_queue_B", "w0_DATA_CE%"] | @tsv),
    (.summary[] | [.name, f(.latency_us.p50; 1), f(.latency_us.p99; 1), f(.latency_us.p999; 1), f(.latency_us.max; 1),
                   f(.jobs[0].gbit_per_s; 4), f(.jobs[1].gbit_per_s; 4), f(.jain; 4),
                   f(.w0_queue.mean_backlog_probe_bytes; 0),
                   (if .w0_queue.ce_marked_fraction == null then "-" else f(100 * .w0_queue.ce_marked_fraction; 1) end)] | @tsv)
' "$OUT_JSON" | column -t -s $'\t'
echo
jq -r '
    def f(x; n): if x == null then "-" else (x * pow(10; n) | round / pow(10; n) | tostring) end;
    (["run", "rep", "worker", "job", "rank", "Gbps", "window", "alpha", "ece_results", "results", "resent", "srtt_us", "CE_marked"] | @tsv),
    (.runs[] | select(.name != "idle") as $r | $r.workers | to_entries[] | .key as $k | .value as $w
        | ($w.report // {}) as $p
        | [$r.name, ($r.repeat | tostring), $w.ns, ($p.job // "-" | tostring), ($p.rank // "-" | tostring), f($p.gbit_per_s; 4),
           ($p.stats.window // "-" | tostring), f($p.stats.alpha; 3), ($p.stats.ece_results // "-" | tostring),
           ($p.stats.results // "-" | tostring), ($p.stats.chunks_resent // "-" | tostring),
           ($p.stats.srtt_us // "-" | tostring), ($r.queues[$k].ce_marked // "-" | tostring)] | @tsv)
' "$OUT_JSON" | column -t -s $'\t'
echo

OUT_PNG="$REPO_ROOT/results/fairness-$STAMP.png"
"$PYTHON" "$REPO_ROOT/scripts/fairness_plot.py" "$OUT_JSON" "$OUT_PNG"
if ((WRITE_DOCS == 1)); then
    mkdir -p "$REPO_ROOT/docs"
    cp "$OUT_JSON" "$REPO_ROOT/docs/fairness.json"
    cp "$OUT_PNG" "$REPO_ROOT/docs/fairness.png"
    log "wrote docs/fairness.json and docs/fairness.png (copies: results/fairness-$STAMP.{json,png})"
else
    log "wrote results/fairness-$STAMP.{json,png}"
fi
