#!/usr/bin/env bash
#
# bench_tree.sh: the all-reduce and PANAMA's fairness experiment on the
# leaf-spine testbed, with the leaf-spine links limited to a rate R (the
# bottleneck, as in an oversubscribed fabric). Two parts:
#
#   trees     2 leaves x 2 workers, 2 spines (scripts/testbed.sh --leaves 2
#             --spines 2). One job of 4 ranks all-reduces MIB MiB x N
#             iterations (verified against the tree-order sum) once over 1
#             tree (both leaves list only spine 0) and once over 2 trees
#             (spines 0 and 1: chunk seq s is summed at spine s mod 2),
#             interleaved over --repeat repeats; first once of each on
#             unshaped links, to show what the CPU alone allows. The shaped
#             links mark CE as in the fairness part (unless --trees-no-ecn),
#             as a DCTCP fabric would. Reports the
#             median time per all-reduce, the ratio 2 trees / 1 tree (goal
#             <= 0.55), the chunks each spine summed, the leaves' partials
#             resent and the machine's CPU use.
#   fairness  2 leaves x 2 workers + 1 host each, 1 spine. Job 1 = l0w0 +
#             l1w0, job 2 = l0w1 + l1w1 (one rank per leaf each), and a
#             sockperf latency probe from l0h0 to l1h0: all cross the same
#             shaped leaf-spine links, whose FIFOs mark CE both ways (the
#             tc-BPF marker of scripts/fairness.sh, RED as the fallback). Runs idle
#             (probe alone) / no_cc (--no-congestion-control) / cc (DCTCP);
#             reports the probe's p50/p99/p99.9, each job's throughput and
#             Jain's index.
#
# Every leaf-spine link is limited both ways: HTB at R on the egress of up-sJ
# in each leaf (leaf -> spine) and on an ifb carrying up-sJ's ingress (spine
# -> leaf; a spine's RESULTs leave through AF_XDP, which no egress qdisc of
# dn-lI would see).
#
# Usage:
#   sudo scripts/bench_tree.sh [--parts trees,fairness] [--rate MBIT]
#                              [--mib S] [--iterations N] [--repeat R]
#                              [--seconds N] [--fair-mib S] [--mps M]
#                              [--mark-min BYTES] [--mark-max BYTES]
#                              [--no-unshaped] [--trees-no-ecn] [--prefix P]
#                              [--no-docs]
#                              [--no-install] [--no-build]
#
#   --parts LIST     trees, fairness or both (default trees,fairness)
#   --rate MBIT      rate of every leaf-spine link, each way (default 30)
#   --mib S          trees: tensor per worker in MiB of float32 (default 16)
#   --iterations N   trees: all-reduces per run (default 2)
#   --repeat R       repeats of each kind of run, interleaved (default 3)
#   --seconds N      fairness: length of the probe's measurement (default 20)
#   --fair-mib S     fairness: tensor per worker in MiB (default 4)
#   --mps M          fairness: probe messages per second (default 1000)
#   --mark-min BYTES fairness: queue depth where CE marking starts (6000)
#   --mark-max BYTES fairness: queue depth where every ECT packet is marked
#                    (default 18000)
#   --no-unshaped    trees: skip the reference runs on unshaped links
#   --trees-no-ecn   trees: shaped links without CE marking (plain FIFOs;
#                    the workers' windows then grow to the pool, 256 chunks)
#   --prefix P       testbed namespace prefix (default tbch)
#   --no-docs        write results/ only, leave bench/results/bench-tree.* alone
#   --no-install     do not apt-get install missing packages
#   --no-build       do not run cargo build (use target/release as is)
#
# Prints the table, writes results/bench-tree-STAMP/bench-tree.{json,png}
# beside every raw log, worker report, switch counter file and qdisc
# snapshot of the run, and (unless --no-docs) bench/results/bench-tree.json and
# bench/results/bench-tree.png. bench/harness/bench_tree_report.py makes the table, JSON and
# plot from that folder (run it again to redo them). Needs root. Everything
# it starts is stopped by PID, and the testbed removed, on exit.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly AGG_PORT=48879
readonly UPLINK_PORT=40000
readonly SOCKPERF_PORT=11111
readonly MSG_SIZE=64
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=10
readonly LEAVES=2
readonly WPL=2
# Bytes of one full chunk's RESULT, the longer way of a leaf-spine link
# (both are shaped): 358 floats + 16 (the RESULT's token) + 22 (header) + 8
# (UDP) + 20 (IPv4) + 14 (Ethernet); the partial going up is 16 shorter.
readonly CHUNK_PAYLOAD=1432
readonly CHUNK_WIRE=1512

ORIG_ARGS=("$@")
PARTS="trees,fairness"
RATE_MBIT=30
MIB=16
ITERATIONS=2
REPEAT=3
RUN_SECONDS=20
FAIR_MIB=4
MPS=1000
MARK_MIN=6000
MARK_MAX=18000
UNSHAPED=1
TREES_ECN=1
PREFIX=tbch
WRITE_DOCS=1
INSTALL=1
BUILD=1

while [[ $# -gt 0 ]]; do
    case "$1" in
        --parts|--rate|--mib|--iterations|--repeat|--seconds|--fair-mib|--mps|--mark-min|--mark-max|--prefix)
            [[ $# -ge 2 ]] || die "$1 needs a value"
            case "$1" in
                --parts) PARTS="$2" ;;
                --rate) RATE_MBIT="$2" ;;
                --mib) MIB="$2" ;;
                --iterations) ITERATIONS="$2" ;;
                --repeat) REPEAT="$2" ;;
                --seconds) RUN_SECONDS="$2" ;;
                --fair-mib) FAIR_MIB="$2" ;;
                --mps) MPS="$2" ;;
                --mark-min) MARK_MIN="$2" ;;
                --mark-max) MARK_MAX="$2" ;;
                --prefix) PREFIX="$2" ;;
            esac
            shift 2 ;;
        --no-unshaped) UNSHAPED=0; shift ;;
        --trees-no-ecn) TREES_ECN=0; shift ;;
        --no-docs) WRITE_DOCS=0; shift ;;
        --no-install) INSTALL=0; shift ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
uint_in_range "$RATE_MBIT" 1 100000 || die "--rate must be 1..100000 (Mbit/s), got '$RATE_MBIT'"
uint_in_range "$MIB" 1 1024 || die "--mib must be 1..1024, got '$MIB'"
uint_in_range "$ITERATIONS" 1 1000 || die "--iterations must be 1..1000, got '$ITERATIONS'"
uint_in_range "$REPEAT" 1 100 || die "--repeat must be 1..100, got '$REPEAT'"
uint_in_range "$RUN_SECONDS" 2 3600 || die "--seconds must be 2..3600, got '$RUN_SECONDS'"
uint_in_range "$FAIR_MIB" 1 1024 || die "--fair-mib must be 1..1024, got '$FAIR_MIB'"
uint_in_range "$MPS" 1 1000000 || die "--mps must be 1..1000000, got '$MPS'"
uint_in_range "$MARK_MIN" 0 100000000 || die "--mark-min must be a byte count, got '$MARK_MIN'"
uint_in_range "$MARK_MAX" 1 100000000 || die "--mark-max must be a byte count, got '$MARK_MAX'"
RATE_MBIT=$((10#$RATE_MBIT)); MIB=$((10#$MIB)); ITERATIONS=$((10#$ITERATIONS))
REPEAT=$((10#$REPEAT)); RUN_SECONDS=$((10#$RUN_SECONDS)); FAIR_MIB=$((10#$FAIR_MIB))
MPS=$((10#$MPS)); MARK_MIN=$((10#$MARK_MIN)); MARK_MAX=$((10#$MARK_MAX))
((MARK_MAX > MARK_MIN)) || die "--mark-max ($MARK_MAX) must be above --mark-min ($MARK_MIN)"
[[ "$PREFIX" =~ ^[A-Za-z0-9_][A-Za-z0-9_-]{0,12}$ ]] || die "bad --prefix '$PREFIX'"
DO_TREES=0
DO_FAIR=0
IFS=, read -r -a part_list <<<"$PARTS"
((${#part_list[@]} > 0)) || die "--parts is empty"
for p in "${part_list[@]}"; do
    case "$p" in
        trees) DO_TREES=1 ;;
        fairness) DO_FAIR=1 ;;
        *) die "--parts: unknown part '$p' (trees, fairness)" ;;
    esac
done
readonly RATE_MBIT MIB ITERATIONS REPEAT RUN_SECONDS FAIR_MIB MPS MARK_MIN MARK_MAX
readonly UNSHAPED TREES_ECN PREFIX WRITE_DOCS INSTALL BUILD DO_TREES DO_FAIR
readonly ELEMENTS=$((MIB * 1024 * 1024 / 4))
readonly FAIR_ELEMENTS=$((FAIR_MIB * 1024 * 1024 / 4))

require_root "${ORIG_ARGS[@]}"
cd "$REPO_ROOT"

# --- cleanup --------------------------------------------------------------------
RESULTS_DIR=""
BIN_DIR=""
TESTBED_MADE=0
SWITCHD_PIDS=()
SERVER_PID=""
CLIENT_PID=""
WORKER_PIDS=()

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${WORKER_PIDS[@]}" "$CLIENT_PID" "$SERVER_PID" "${SWITCHD_PIDS[@]}"; do
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

# --- tools, build ------------------------------------------------------------------
ensure_debian_packages "$INSTALL" python3-matplotlib iproute2 sockperf clang llvm \
    libbpf-dev linux-libc-dev bpftool
for t in tc clang bpftool sockperf; do
    command -v "$t" >/dev/null 2>&1 || die "$t not found after installing packages"
done
((BUILD == 1)) && build_release
# Private copies of the binaries: a rebuild of target/ while the runs go on
# must not change what is measured.
BIN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/bench-tree-bin.XXXXXX")"
for b in switchd switchctl worker; do
    [[ -x "$REPO_ROOT/target/release/$b" ]] ||
        die "target/release/$b missing (build with: cargo build --release --workspace --bins)"
    cp "$REPO_ROOT/target/release/$b" "$BIN_DIR/$b"
done
SWITCHD="$BIN_DIR/switchd"
SWITCHCTL="$BIN_DIR/switchctl"
WORKER="$BIN_DIR/worker"

STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
RESULTS_DIR="$REPO_ROOT/results/bench-tree-$STAMP"
mkdir -p "$RESULTS_DIR"

# --- the fabric ----------------------------------------------------------------------
FABRIC_ENV=""
N_SPINES=0

# make_testbed SPINES: the leaf-spine testbed, 2 leaves x 2 workers + 1 host.
make_testbed() {
    N_SPINES="$1"
    FABRIC_ENV="$RESULTS_DIR/fabric-${N_SPINES}spines.env"
    TESTBED_MADE=1
    log "testbed $PREFIX: $LEAVES leaves x $WPL workers + 1 host, $N_SPINES spines"
    bash "$REPO_ROOT/scripts/testbed.sh" up --prefix "$PREFIX" --leaves "$LEAVES" \
        --spines "$N_SPINES" --workers-per-leaf "$WPL" --hosts-per-leaf 1 \
        --print-env >"$FABRIC_ENV" 2>"$RESULTS_DIR/testbed-${N_SPINES}spines.log"
}

# env_of KEY: a value testbed.sh printed.
env_of() {
    sed -n "s/^$1=//p" "$FABRIC_ENV"
}

# shape_fabric MARK: limit every leaf-spine link both ways to RATE_MBIT. With
# MARK=1 the leaf->spine FIFOs also mark CE (setup_ecn_bottleneck).
shape_fabric() {
    local mark="$1" i j ns
    local -a up=()
    for ((i = 0; i < LEAVES; i++)); do
        ns="$(env_of "leaf_${i}_ns")"
        for ((j = 0; j < N_SPINES; j++)); do
            up+=("$ns:up-s$j" "$ns:ifb-s$j")
            redirect_ingress_to_ifb "$ns" "up-s$j" "ifb-s$j"
        done
    done
    if ((mark == 1)); then
        setup_ecn_bottleneck "$RESULTS_DIR" "$RATE_MBIT" "$MARK_MIN" "$MARK_MAX" "${up[@]}"
        log "leaf-spine links at $RATE_MBIT Mbit/s each way; their FIFOs mark CE from $MARK_MIN to $MARK_MAX bytes ($ECN_MARKER)"
    else
        for nd in "${up[@]}"; do shape_htb "${nd%%:*}" "${nd#*:}" "$RATE_MBIT"; done
        log "leaf-spine links at $RATE_MBIT Mbit/s each way (HTB; spine->leaf on an ifb at the leaf)"
    fi
}

# qdisc_snapshot DIR WHEN: every leaf's uplink and ifb qdisc counters (tc -s
# -j), and the CE markers' maps when there are any, as JSON files in DIR.
qdisc_snapshot() {
    local dir="$1" when="$2" i j ns map
    for ((i = 0; i < LEAVES; i++)); do
        ns="$(env_of "leaf_${i}_ns")"
        for ((j = 0; j < N_SPINES; j++)); do
            for dev in "up-s$j" "ifb-s$j"; do
                tc -n "$ns" -s -j qdisc show dev "$dev" >"$dir/tc-leaf$i-$dev.$when.json" 2>/dev/null || true
            done
            for dev in "up-s$j" "ifb-s$j"; do
                if map="$(ecn_marker_map_id "$ns" "$dev" 2>/dev/null)"; then
                    bpftool map dump id "$map" -j >"$dir/marker-leaf$i-$dev.$when.json" 2>/dev/null || true
                fi
            done
        done
    done
    cat /proc/stat >"$dir/procstat.$when"
}

SWITCHD_NAMES=()
# start_fabric DIR TREES JOB...: a switchd in every spine and leaf, configs
# and logs in DIR. The leaves send their partials to spines 0..TREES-1. Each
# JOB is ID:SECRET:LOCAL_RANKS where LOCAL_RANKS lists the worker indices J
# (P-lIwJ) that are that job's ranks under every leaf, e.g. 1:SECRET:0.1 .
start_fabric() {
    local dir="$1" trees="$2" i j k spec id secret ranks gw ns addr
    local -a spine_specs=() leaf_specs spine_addrs=() rank_list allowed
    shift 2
    for spec in "$@"; do
        IFS=: read -r id secret _ <<<"$spec"
        spine_specs+=("$id:$secret")
    done
    SWITCHD_PIDS=()
    SWITCHD_NAMES=()
    for ((j = 0; j < N_SPINES; j++)); do
        addr="$(env_of "spine_${j}_addr")"
        ((j < trees)) && spine_addrs+=("$addr:$AGG_PORT")
        write_spine_config "$dir/spine$j.toml" "scripts/bench_tree.sh: spine $j of testbed '$PREFIX'" \
            "$addr" "$dir/spine$j.sock" "$LEAVES" "${spine_specs[@]}"
        start_switchd "$(env_of "spine_${j}_ns")" "$SWITCHD" "$dir/spine$j.log" \
            run --config "$dir/spine$j.toml" --stats-file "$dir/spine$j-stats.json"
        SWITCHD_PIDS+=("$SWITCHD_PID")
        SWITCHD_NAMES+=("spine$j")
    done
    for ((i = 0; i < LEAVES; i++)); do
        gw="$(env_of "leaf_${i}_gateway")"
        leaf_specs=()
        for spec in "$@"; do
            IFS=: read -r id secret ranks <<<"$spec"
            IFS=. read -r -a rank_list <<<"$ranks"
            allowed=()
            for k in "${rank_list[@]}"; do allowed+=("$(env_of "leaf_${i}_worker_${k}_addr")/32"); done
            leaf_specs+=("$id:${#rank_list[@]}:$(IFS=,; echo "${allowed[*]}"):$secret")
        done
        ns="$(env_of "leaf_${i}_ns")"
        write_leaf_config "$dir/leaf$i.toml" "scripts/bench_tree.sh: leaf $i of testbed '$PREFIX'" \
            "$gw" "$UPLINK_PORT" "$dir/leaf$i.sock" "$i" "$LEAVES" \
            "$(IFS=,; echo "${spine_addrs[*]}")" "sw-w0,sw-w1,sw-h0" "${leaf_specs[@]}"
        start_switchd "$ns" "$SWITCHD" "$dir/leaf$i.log" \
            run --config "$dir/leaf$i.toml" --stats-file "$dir/leaf$i-stats.json"
        SWITCHD_PIDS+=("$SWITCHD_PID")
        SWITCHD_NAMES+=("leaf$i")
    done
}

# stop_fabric DIR: record every switchd's CPU time (/proc/PID/stat), then
# stop it (each writes its stats file on exit).
stop_fabric() {
    local dir="$1" k rc=0
    for k in "${!SWITCHD_PIDS[@]}"; do
        cat "/proc/${SWITCHD_PIDS[k]}/stat" >"$dir/${SWITCHD_NAMES[k]}.procstat" 2>/dev/null || true
    done
    for k in "${!SWITCHD_PIDS[@]}"; do
        stop_pid "${SWITCHD_PIDS[k]}"
        ((STOP_RC == 0)) || rc=$STOP_RC
    done
    echo "$rc" >"$dir/switchd-exit"
    SWITCHD_PIDS=()
    SWITCHD_NAMES=()
}

# run_worker DIR NAME LEAF K JOB SECRET RANK LOCAL_RANKS TREE ELEMENTS ITERS
#            EXTRA...: one worker P-lLEAFwK in the background (PID appended
# to WORKER_PIDS), report in DIR/NAME.json, log in DIR/NAME.log.
run_worker() {
    local dir="$1" name="$2" leaf="$3" k="$4" job="$5" secret="$6" rank="$7"
    local nlocal="$8" tree="$9" elements="${10}" iters="${11}"
    shift 11
    AGGSWITCH_SECRET="$secret" ip netns exec "$(env_of "leaf_${leaf}_worker_${k}_ns")" "$WORKER" allreduce \
        --switch "$(env_of "leaf_${leaf}_gateway")" --job "$job" --rank "$rank" \
        --workers "$nlocal" --tree-leaves "$tree" --leaf "$leaf" \
        --elements "$elements" --iterations "$iters" --json "$@" \
        >"$dir/$name.json" 2>"$dir/$name.log" &
    WORKER_PIDS+=($!)
}

# finish_workers DIR TIMEOUT: wait_workers for every worker in WORKER_PIDS;
# their exit statuses go to DIR/worker-exit (comma-separated).
finish_workers() {
    local dir="$1" timeout="$2" n="${#WORKER_PIDS[@]}" i
    local -a st=()
    declare -A STATUS=()
    wait_workers "$n" "$timeout"
    for ((i = 0; i < n; i++)); do st+=("${STATUS[$i]:-?}"); done
    (IFS=,; echo "${st[*]}") >"$dir/worker-exit"
}

# --- part 1: 1 tree against 2 ----------------------------------------------------------
# Twice the time of the whole tensor through one link, plus 5 minutes.
TREE_TIMEOUT=$((ITERATIONS * MIB * 8388608 * 2 / (RATE_MBIT * 1000000) + 300))

# trees_run NAME TREES: one all-reduce run over TREES spines, in RESULTS_DIR/trees/NAME.
trees_run() {
    local name="$1" trees="$2" dir="$RESULTS_DIR/trees/$1" secret i k
    mkdir -p "$dir"
    secret="$(random_secret)"
    log "trees: run $name: 1 job of $((LEAVES * WPL)) ranks over $trees tree(s), $MIB MiB x $ITERATIONS"
    start_fabric "$dir" "$trees" "1:$secret:0.1"
    qdisc_snapshot "$dir" before
    WORKER_PIDS=()
    for ((i = 0; i < LEAVES; i++)); do
        for ((k = 0; k < WPL; k++)); do
            run_worker "$dir" "worker-l${i}w$k" "$i" "$k" 1 "$secret" "$k" "$WPL" "$WPL,$WPL" \
                "$ELEMENTS" "$ITERATIONS" --verify
        done
    done
    finish_workers "$dir" "$TREE_TIMEOUT"
    qdisc_snapshot "$dir" after
    stop_fabric "$dir"
    echo "$trees" >"$dir/trees"
}

if ((DO_TREES == 1)); then
    make_testbed 2
    if ((UNSHAPED == 1)); then
        trees_run unshaped-1tree-r1 1
        trees_run unshaped-2tree-r1 2
    fi
    shape_fabric "$TREES_ECN"
    echo "$TREES_ECN" >"$RESULTS_DIR/trees-ecn"
    for ((rep = 1; rep <= REPEAT; rep++)); do
        # Alternate the order so that a drift of the machine's speed does
        # not favour one side.
        if ((rep % 2 == 1)); then order=(1 2); else order=(2 1); fi
        for t in "${order[@]}"; do
            trees_run "shaped-${t}tree-r$rep" "$t"
        done
    done
fi

# --- part 2: fairness on a shared spine link ---------------------------------------------
if ((DO_FAIR == 1)); then
    make_testbed 1
    shape_fabric 1
    FAIR_HOST="$(env_of "leaf_1_host_0_addr")"
    ip netns exec "$(env_of "leaf_1_host_0_ns")" sockperf server -i "$FAIR_HOST" -p "$SOCKPERF_PORT" \
        >"$RESULTS_DIR/sockperf-server.log" 2>&1 &
    SERVER_PID=$!
    sleep 0.5
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$RESULTS_DIR/sockperf-server.log" >&2; die "sockperf server exited"; }
    echo "$ECN_MARKER" >"$RESULTS_DIR/marker"

    # Iterations: enough that at its fair share of the link's payload rate
    # each job outlasts the probe by 3 s. A slower job is stopped 20 s after
    # the probe ends (its throughput then comes from the spine's counters
    # alone, which are the table's numbers anyway).
    bits_per_iter=$((FAIR_ELEMENTS * 32))
    goodput_bps=$((RATE_MBIT * 1000000 * CHUNK_PAYLOAD / CHUNK_WIRE / 2))
    FAIR_ITERATIONS=$(((RUN_SECONDS + 3) * goodput_bps / bits_per_iter + 2))
    FAIR_TIMEOUT=20
    echo "$FAIR_ITERATIONS" >"$RESULTS_DIR/fair-iterations"

    # spine_stats DIR FILE: the spine's counters now (switchctl stats --json).
    spine_stats() {
        "$SWITCHCTL" --socket "$1/spine0.sock" --json stats >"$1/$2" 2>/dev/null || echo '{}' >"$1/$2"
    }

    # fair_run NAME REP
    fair_run() {
        local name="$1" rep="$2" dir="$RESULTS_DIR/fairness/$1-r$2" s1 s2 i cc_flag=() rc=0
        mkdir -p "$dir"
        [[ "$name" == no_cc ]] && cc_flag=(--no-congestion-control)
        log "fairness: run $name ($rep of $REPEAT), ${RUN_SECONDS} s probe"
        s1="$(random_secret)"
        s2="$(random_secret)"
        start_fabric "$dir" 1 "1:$s1:0" "2:$s2:1"
        qdisc_snapshot "$dir" before
        WORKER_PIDS=()
        if [[ "$name" != idle ]]; then
            for ((i = 0; i < LEAVES; i++)); do
                run_worker "$dir" "worker-l${i}w0" "$i" 0 1 "$s1" 0 1 "1,1" \
                    "$FAIR_ELEMENTS" "$FAIR_ITERATIONS" "${cc_flag[@]}"
                run_worker "$dir" "worker-l${i}w1" "$i" 1 2 "$s2" 0 1 "1,1" \
                    "$FAIR_ELEMENTS" "$FAIR_ITERATIONS" "${cc_flag[@]}"
            done
            # Until both jobs are active at the spine, then 1 s more: past
            # slow start, the windows have met the queue.
            local deadline=$((SECONDS + READY_TIMEOUT))
            until "$SWITCHCTL" --socket "$dir/spine0.sock" --json jobs 2>/dev/null |
                python3 -c 'import json, sys; sys.exit(sum(j.get("state") == "active" for j in json.load(sys.stdin)) < 2)'; do
                ((SECONDS < deadline)) || die "fairness run $name: the jobs were not active at the spine within $READY_TIMEOUT s (see ${dir#"$REPO_ROOT"/})"
                sleep 0.1
            done
            sleep 1
        fi
        spine_stats "$dir" spine0.start.json
        date +%s.%N >"$dir/probe.t0"
        ip netns exec "$(env_of "leaf_0_host_0_ns")" sockperf under-load -i "$FAIR_HOST" \
            -p "$SOCKPERF_PORT" -t "$RUN_SECONDS" --msg-size "$MSG_SIZE" --full-rtt \
            --mps "$MPS" --reply-every 1 --full-log "$dir/sockperf.csv" \
            >"$dir/sockperf.txt" 2>&1 &
        CLIENT_PID=$!
        wait "$CLIENT_PID" || rc=$?
        CLIENT_PID=""
        date +%s.%N >"$dir/probe.t1"
        spine_stats "$dir" spine0.end.json
        ((rc == 0)) || warn "fairness run $name: sockperf exited with status $rc (see ${dir#"$REPO_ROOT"/}/sockperf.txt)"
        if ((${#WORKER_PIDS[@]} > 0)); then
            finish_workers "$dir" "$FAIR_TIMEOUT"
        fi
        qdisc_snapshot "$dir" after
        stop_fabric "$dir"
    }

    for ((rep = 1; rep <= REPEAT; rep++)); do
        for r in idle no_cc cc; do
            fair_run "$r" "$rep"
        done
    done
    stop_pid "$SERVER_PID"
    SERVER_PID=""
fi

# --- report ------------------------------------------------------------------------
OUT_JSON="$RESULTS_DIR/bench-tree.json"
OUT_PNG="$RESULTS_DIR/bench-tree.png"
"$PYTHON" "$REPO_ROOT/bench/harness/bench_tree_report.py" "$RESULTS_DIR" --json "$OUT_JSON" \
    --png "$OUT_PNG" --rate "$RATE_MBIT" --mib "$MIB" --iterations "$ITERATIONS" \
    --repeat "$REPEAT" --seconds "$RUN_SECONDS" --fair-mib "$FAIR_MIB" --mps "$MPS" \
    --mark-min "$MARK_MIN" --mark-max "$MARK_MAX" --prefix "$PREFIX" \
    --command "sudo scripts/bench_tree.sh${ORIG_ARGS[*]:+ ${ORIG_ARGS[*]}}" \
    --commit "$(git -C "$REPO_ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
if ((WRITE_DOCS == 1)); then
    cp "$OUT_JSON" "$REPO_ROOT/bench/results/bench-tree.json"
    cp "$OUT_PNG" "$REPO_ROOT/bench/results/bench-tree.png"
    log "wrote bench/results/bench-tree.json and bench/results/bench-tree.png (copies in results/bench-tree-$STAMP/)"
else
    log "wrote results/bench-tree-$STAMP/bench-tree.{json,png}"
fi
