#!/usr/bin/env bash
#
# bench_train.sh: DDP training step time through the switch against DDP's
# default gloo all-reduce, on the same veth testbed, in the same run, on
# unlimited links and on links limited to 1 Gbit/s each way; optionally also
# aggswitch.torch's host path (AGGSWITCH_MODE=hosts), the switch without
# the fallback's per-collective agreement (AGGSWITCH_FALLBACK=off) and the
# switch killed mid-run (the time from the kill to the host path).
#
# Usage:
#   sudo scripts/bench_train.sh [--steps 30] [--warmup 3] [--batch 32]
#                               [--hidden 5000] [--mtu 1500] [--dtype f32]
#                               [--transport auto] [--device cpu] [--links unlimited,1gbit]
#                               [--comms gloo,switch] [--switch-threads 1] [--stall-timeout 2]
#                               [--timeout 600] [--wait-idle SECS] [--no-build] [--no-docs]
#
#   --steps N     timed steps per configuration (default 30)
#   --warmup N    steps run first and left out of the statistics (default 3:
#                 the first step joins the switch's job and DDP rebuilds its
#                 buckets after it)
#   --batch B     samples per rank and step (default 32)
#   --hidden H    width of the 2 hidden layers (default 5000: 64*H + H*H +
#                 10*H + biases = 25.38 M float32 parameters, 101.5 MB of
#                 gradient per step)
#   --mtu M       MTU of every testbed link (default 1500; 576..9000): the
#                 switch's chunks and gloo's TCP segments both follow it
#   --dtype D     gradients on the wire, f32, bf16 or f16 (default f32):
#                 the switch's job is declared with it (aggswitch.torch's
#                 bf16/fp16 compress hook), and gloo runs PyTorch's own
#                 bf16_compress_hook / fp16_compress_hook, so both send half
#                 the bytes
#   --transport T the worker's UDP data path for the switch runs: auto,
#                 mmsg or udp-gso (default auto; AGGSWITCH_TRANSPORT)
#   --device D    cpu or cuda (default cpu): where the ranks compute; with
#                 cuda every rank uses GPU (rank mod GPUs), and the switch's
#                 hook stages each bucket through host memory (gloo does too)
#   --links L     comma-separated link settings, each run with every comm of
#                 --comms: unlimited, or a rate NNmbit / NNgbit (default
#                 unlimited,1gbit); a rate shapes every worker link both ways
#                 with tbf (burst 256 kB per Gbit/s, at least 256 kB;
#                 latency 50 ms)
#   --comms C     comma-separated configurations run on each link setting, in
#                 this order (default gloo,switch): gloo, switch,
#                 switch-nofallback (the switch with AGGSWITCH_FALLBACK=off:
#                 no agreement after each collective), hosts
#                 (AGGSWITCH_MODE=hosts: aggswitch.torch's host path, every
#                 collective over gloo with the switch's arithmetic; switchd
#                 is not started) and switch-killed (switch, with switchd
#                 killed by SIGKILL about a third into the run: the time
#                 from the kill to the host path); see the configurations
#                 below
#   --switch-threads T  switchd's dataplane threads and queues per veth
#                 (default 1); with T > 1 worker I of N sends on queue floor(I*T/N)
#                 (testbed.sh --queue-per-worker), so T threads share the
#                 4 ranks' frames
#   --stall-timeout S  switch-killed: the ranks' AGGSWITCH_STALL_TIMEOUT,
#                 seconds without progress before a collective fails and the
#                 ranks vote to move to the host path (default 2; the other
#                 configurations keep the library's default, 5 s)
#   --timeout T   seconds one configuration (4 ranks) may take (default 600)
#   --wait-idle W before measuring, wait up to W s for the 1-min load average
#                 to fall below half the cores (step times are only meaningful
#                 on a machine nothing else loads; default 0: no wait)
#   --no-build    use the binaries in target/release as they are (built on
#                 another machine and copied there): no cargo, no apt-get
#   --no-docs     write results/ only, leave bench/results/bench-train.{json,png} alone
#   -h, --help    this text
#
# The model is examples/train_ddp.py's MLP on scikit-learn's digits (2 hidden
# layers, SGD with momentum, seed 0, each rank its own samples), run as 4
# ranks, one process per worker namespace (`ip netns exec btr-wI
# .venv/bin/python examples/train_ddp.py`, RANK/WORLD_SIZE/MASTER_ADDR
# worker 0's address/MASTER_PORT from the environment, GLOO_SOCKET_IFNAME=eth0,
# OMP_NUM_THREADS=1), in the configurations of --comms per link setting
# (results in RUN/LINK-COMM/):
#   gloo               DDP's default all-reduce over the gloo process group,
#                      TCP between the workers through the bridge
#                      (train_ddp.py --comm gloo)
#   switch             aggswitch.torch's DDP hook: every bucket summed in
#                      switchd, with the fallback on (AGGSWITCH_FALLBACK=on,
#                      the default: after each collective the ranks agree
#                      in one small gloo all-reduce that all succeeded)
#                      (--comm switch)
#   switch-nofallback  the same with AGGSWITCH_FALLBACK=off: no agreement,
#                      fail-fast; switch / switch-nofallback is the
#                      agreement's cost (goal <= 1.02)
#   hosts              --comm switch with AGGSWITCH_MODE=hosts: every bucket
#                      summed on the host path over gloo (all-to-all, the
#                      switch's sum, all-gather), no switchd, the switch's
#                      bits; hosts / gloo is the host path's cost (goal at
#                      1 Gbit/s: <= 1.05)
#   switch-killed      switch (fresh switchd, fallback on) with
#                      AGGSWITCH_STALL_TIMEOUT=--stall-timeout; once rank 0
#                      has printed step K (about a third of the warm-up +
#                      timed steps, rounded to the multiple of 10 that
#                      train_ddp.py prints, at least 10; 10 of the default
#                      33), switchd is killed by its PID (SIGKILL) and not
#                      restarted: the ranks stall, vote, and finish on the
#                      host path. Rank 0's log is read every 50 ms from the
#                      kill until it shows aggswitch.torch's fallback warning
#                      ("... run on the hosts over the process group", logged
#                      once the first collective is done on the host path);
#                      both moments (bash EPOCHREALTIME) go to killed.json.
#                      kill to host path = the difference (goal <= stall
#                      timeout + 1 s); the run must end with the switch run's
#                      weights, every rank having fallen back once. Its step
#                      time is compared with nothing. Needs at least 13
#                      warm-up + timed steps.
# A rate setting shapes every worker link both ways as bench.sh does
# (shape_worker_links in lib.sh: e.g. tbf rate 1gbit burst 256kb latency 50ms
# on worker eth0 egress, switch port egress and worker eth0 ingress via ifb0).
# switchd (job 1 of 4 workers, pool_slots 256, a fresh random secret) runs
# only during the switch, switch-nofallback and switch-killed configurations
# (a fresh switchd for each).
#
# What it needs: the project venv .venv with torch, scikit-learn and
# aggswitch (scripts/setup.sh makes it), or another interpreter that imports
# them named by AGGSWITCH_BENCH_PYTHON; matplotlib is installed into the
# venv with pip when missing (the plot is skipped if that fails). It builds
# switchd with `cargo build --release --workspace --bins` and installs the
# build dependencies with apt-get when missing.
#
# Statistic: train_ddp.py times every step on every rank (sample, forward,
# backward with the gradient all-reduce, optimizer step). The warm-up steps
# are dropped; a configuration's step time is the slowest rank's median over
# the timed steps (the ranks are held in lock-step by the all-reduce, so
# their medians differ little; the slowest is the conservative one and what
# bench.sh reports for the all-reduce). samples/s = 4 x batch / step time.
# The ratio switch / gloo is taken per link setting (goal at 1 Gbit/s:
# <= 0.75, issue 24); hosts / gloo and switch / switch-nofallback likewise,
# when those run. Sanity: the final loss over all 1797 samples of the switch run
# must be within 2 % of the gloo run's, every rank must end with the same
# weights, all switch runs (same seed) with bit-identical weights, the
# switch-nofallback, hosts and switch-killed runs with the switch runs'
# weights, and no switch or switch-nofallback run may have left the switch
# (train_ddp.py's path counters: no fallback), while every rank of a
# switch-killed run must have fallen back exactly once, never come back, and
# run collectives on the hosts.
#
# Output: the table on stdout, results/bench-train-STAMP.json and .png with
# every rank's JSON and log in results/bench-train-STAMP/, and unless
# --no-docs, bench/results/bench-train.json and bench/results/bench-train.png
# (bench/harness/bench_train_report.py makes the JSON, table and plot).
#
# Everything runs in the namespaces btr-sw, btr-w0..3 (scripts/testbed.sh up
# --workers 4 --prefix btr); every process started is stopped by PID and the
# testbed removed on exit, also on failure.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly PREFIX=btr
readonly WORKERS=4
readonly LAYERS=2
readonly SEED=0
SWITCH_ADDR=""  # the testbed's (tb switch_addr), once it is up
MASTER_IP=""    # worker 0's address: gloo's rendezvous
readonly MASTER_PORT_BASE=29500
readonly AGG_PORT=48879
readonly JOB_ID=1
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=15
# switch-killed: aggswitch.torch's warning (logger aggswitch.torch, on
# stderr) once a rank's first collective is done on the host path, and how
# often rank 0's log is read for it and for the step to kill at.
readonly FALLBACK_LINE="run on the hosts over the process group"
readonly POLL_S=0.05

STEPS=30
WARMUP=3
BATCH=32
HIDDEN=5000
MTU=1500
DTYPE=f32
TRANSPORT=auto
DEVICE=cpu
LINKS=unlimited,1gbit
COMMS=gloo,switch
SWITCH_THREADS=1
STALL_TIMEOUT=2
TIMEOUT=600
WAIT_IDLE=0
BUILD=1
DOCS=1

while [[ $# -gt 0 ]]; do
    case "$1" in
        --steps|--warmup|--batch|--hidden|--mtu|--dtype|--transport|--device|--links|--comms|--switch-threads|--stall-timeout|--timeout|--wait-idle)
            [[ $# -ge 2 ]] || die "$1 needs a value"
            case "$1" in
                --steps) STEPS="$2" ;;
                --warmup) WARMUP="$2" ;;
                --batch) BATCH="$2" ;;
                --hidden) HIDDEN="$2" ;;
                --mtu) MTU="$2" ;;
                --dtype) DTYPE="$2" ;;
                --transport) TRANSPORT="$2" ;;
                --device) DEVICE="$2" ;;
                --links) LINKS="$2" ;;
                --comms) COMMS="$2" ;;
                --switch-threads) SWITCH_THREADS="$2" ;;
                --stall-timeout) STALL_TIMEOUT="$2" ;;
                --timeout) TIMEOUT="$2" ;;
                --wait-idle) WAIT_IDLE="$2" ;;
            esac
            shift 2 ;;
        --steps=*) STEPS="${1#*=}"; shift ;;
        --warmup=*) WARMUP="${1#*=}"; shift ;;
        --batch=*) BATCH="${1#*=}"; shift ;;
        --hidden=*) HIDDEN="${1#*=}"; shift ;;
        --links=*) LINKS="${1#*=}"; shift ;;
        --comms=*) COMMS="${1#*=}"; shift ;;
        --stall-timeout=*) STALL_TIMEOUT="${1#*=}"; shift ;;
        --timeout=*) TIMEOUT="${1#*=}"; shift ;;
        --wait-idle=*) WAIT_IDLE="${1#*=}"; shift ;;
        --no-build) BUILD=0; shift ;;
        --no-docs) DOCS=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
uint_in_range "$STEPS" 1 10000 || die "--steps must be 1..10000, got '$STEPS'"
uint_in_range "$WARMUP" 0 1000 || die "--warmup must be 0..1000, got '$WARMUP'"
uint_in_range "$BATCH" 1 1797 || die "--batch must be 1..1797 (the digits data set), got '$BATCH'"
uint_in_range "$HIDDEN" 1 20000 || die "--hidden must be 1..20000, got '$HIDDEN'"
uint_in_range "$MTU" 576 9000 || die "--mtu must be 576..9000, got '$MTU'"
[[ "$DTYPE" =~ ^(f32|bf16|f16)$ ]] || die "--dtype must be f32, bf16 or f16, got '$DTYPE'"
[[ "$TRANSPORT" =~ ^(auto|mmsg|udp-gso)$ ]] || die "--transport must be auto, mmsg or udp-gso, got '$TRANSPORT'"
[[ "$DEVICE" =~ ^(cpu|cuda)$ ]] || die "--device must be cpu or cuda, got '$DEVICE'"
IFS=, read -r -a LINK_LIST <<<"$LINKS"
((${#LINK_LIST[@]} > 0)) || die "--links needs at least one setting, e.g. unlimited,1gbit"
for link in "${LINK_LIST[@]}"; do
    [[ "$link" =~ ^(unlimited|[1-9][0-9]{0,5}(mbit|gbit))$ ]] ||
        die "--links: '$link' is neither unlimited nor a rate like 1gbit or 500mbit"
done
IFS=, read -r -a COMM_LIST <<<"$COMMS"
((${#COMM_LIST[@]} > 0)) || die "--comms needs at least one configuration, e.g. gloo,switch"
seen_comms=","
for comm in "${COMM_LIST[@]}"; do
    [[ "$comm" =~ ^(gloo|switch|switch-nofallback|hosts|switch-killed)$ ]] ||
        die "--comms: '$comm' is none of gloo, switch, switch-nofallback, hosts, switch-killed"
    [[ "$seen_comms" != *",$comm,"* ]] || die "--comms: '$comm' is listed twice"
    seen_comms+="$comm,"
done
# The lists as the report reads them (no empty entries).
LINKS="$(IFS=,; echo "${LINK_LIST[*]}")"
COMMS="$(IFS=,; echo "${COMM_LIST[*]}")"
uint_in_range "$SWITCH_THREADS" 1 64 || die "--switch-threads must be 1..64, got '$SWITCH_THREADS'"
uint_in_range "$TIMEOUT" 10 86400 || die "--timeout must be 10..86400 s, got '$TIMEOUT'"
uint_in_range "$WAIT_IDLE" 0 86400 || die "--wait-idle must be 0..86400 s, got '$WAIT_IDLE'"
if ! [[ "$STALL_TIMEOUT" =~ ^[0-9]{1,3}(\.[0-9]{1,3})?$ ]] ||
    ! awk -v s="$STALL_TIMEOUT" 'BEGIN { exit !(s >= 0.1 && s <= 600) }'; then
    die "--stall-timeout must be 0.1..600 s (up to 3 decimals), got '$STALL_TIMEOUT'"
fi
STALL_TIMEOUT="$(awk -v s="$STALL_TIMEOUT" 'BEGIN { printf "%g", s }')"  # a JSON number: 2, 0.5
STEPS=$((10#$STEPS)); WARMUP=$((10#$WARMUP)); BATCH=$((10#$BATCH))
HIDDEN=$((10#$HIDDEN)); MTU=$((10#$MTU)); SWITCH_THREADS=$((10#$SWITCH_THREADS)); TIMEOUT=$((10#$TIMEOUT)); WAIT_IDLE=$((10#$WAIT_IDLE))
# switch-killed: switchd is killed once rank 0 has printed step KILL_STEP,
# about a third of the steps rounded to the multiple of 10 train_ddp.py
# prints (it prints steps 0, 10, 20, ... and the last), at least 10, with
# two steps after it at least (the one the kill lands in, one more).
# shellcheck disable=SC2017  # rounded to a multiple of 10 on purpose
KILL_STEP=$(( (WARMUP + STEPS + 15) / 30 * 10 ))
((KILL_STEP >= 10)) || KILL_STEP=10
if [[ "$seen_comms" == *",switch-killed,"* ]] && ((WARMUP + STEPS < KILL_STEP + 3)); then
    die "--comms switch-killed needs at least $((KILL_STEP + 3)) warm-up + timed steps (switchd is killed after step $KILL_STEP), got $((WARMUP + STEPS))"
fi
readonly STEPS WARMUP BATCH HIDDEN MTU DTYPE TRANSPORT DEVICE LINKS LINK_LIST COMMS COMM_LIST SWITCH_THREADS STALL_TIMEOUT KILL_STEP TIMEOUT WAIT_IDLE BUILD DOCS

require_root "$@"
BENCH_T0=$SECONDS

prepare_torch_bench bench-train "$BUILD"
readonly STAMP RUN SWITCHD
readonly PY="$TORCH_BENCH_PY"

TESTBED_MADE=0
SWITCHD_PID=""
RANK_PIDS=()
trap cleanup_torch_bench EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- testbed, switchd config ---------------------------------------------------------
MEASURE_T0=$SECONDS
log "run $STAMP: 4 ranks, MLP 64-$HIDDEN-$HIDDEN-10, batch $BATCH per rank, $WARMUP warm-up + $STEPS timed steps per configuration ($COMMS on $LINKS); logs in $RUN"
TESTBED_MADE=1
QUEUE_ARGS=()
((SWITCH_THREADS == 1)) || QUEUE_ARGS=(--queues "$SWITCH_THREADS" --queue-per-worker)
testbed_up "$RUN/testbed.env" --prefix "$PREFIX" --workers "$WORKERS" --mtu "$MTU" "${QUEUE_ARGS[@]}" \
    2>"$RUN/testbed.log"
SWITCH_ADDR="$(tb switch_addr)"
MASTER_IP="$(tb worker_0_addr)"
readonly SWITCH_ADDR MASTER_IP

SECRET="$(random_secret)"
readonly SECRET
CFG="$RUN/switchd.toml"
write_testbed_switchd_config "$CFG" "scripts/bench_train.sh" "$WORKERS" "$SECRET" \
    "job:dtype = \"$DTYPE\"" "queues = $SWITCH_THREADS" "dataplane_threads = $SWITCH_THREADS"

# --- measurements ------------------------------------------------------------------

# ranks_all_running: true while every rank of RANK_PIDS runs (bash reaps
# its children as they exit, so kill -0 fails for one that ended).
ranks_all_running() {
    local pid
    for pid in "${RANK_PIDS[@]}"; do
        kill -0 "$pid" 2>/dev/null || return 1
    done
}

# kill_switchd_mid_run OUT: (switch-killed, while the ranks run) wait until
# rank 0's log (OUT/rank0.log) shows step KILL_STEP or a later one, kill
# switchd (SWITCHD_PID, started by run_config) with SIGKILL, then read rank
# 0's log every POLL_S s until it holds FALLBACK_LINE; writes OUT/killed.json
# (both moments as Unix seconds; null for what did not happen: the ranks
# ended first) and switchd's CPU-seconds up to the kill. Reaps switchd and
# empties SWITCHD_PID once it killed it; leaves it running (run_config stops
# it) when the ranks ended or one failed before that step.
kill_switchd_mid_run() {
    local out="$1" log0="$1/rank0.log" step="" kill_s=null seen_s=null alive
    until step="$(awk -v k="$KILL_STEP" '$1 == "step" && $2 ~ /^[0-9]+$/ && $2 + 0 >= k { print $2; exit }' "$log0" 2>/dev/null)" &&
        [[ -n "$step" ]]; do
        ranks_all_running || break
        sleep "$POLL_S"
    done
    if [[ -n "$step" ]]; then
        awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$SWITCHD_PID/stat" \
            >"$out/switchd-cpu-seconds" 2>/dev/null || true
        kill -KILL "$SWITCHD_PID" 2>/dev/null || warn "switchd (pid $SWITCHD_PID) had ended before the kill; see $out/switchd.log"
        kill_s="${EPOCHREALTIME/,/.}"  # no fork; a decimal point whatever the locale
        # Reaped at once (a SIGKILLed process is gone in milliseconds; the
        # fallback takes the stall timeout): SWITCHD_PID never names a PID
        # the system could give to another process.
        wait "$SWITCHD_PID" 2>/dev/null || true
        SWITCHD_PID=""
        while :; do
            # Whether the ranks ran before the log is read: a rank that
            # ended had written everything by then.
            alive=0
            ! ranks_all_running || alive=1
            if grep -qF -- "$FALLBACK_LINE" "$log0" 2>/dev/null; then
                seen_s="${EPOCHREALTIME/,/.}"
                break
            fi
            ((alive)) || break
            sleep "$POLL_S"
        done
    fi
    printf '{"kill_s": %s, "fallback_seen_s": %s, "stall_timeout_s": %s, "kill_after_step": %d, "step_seen": %s, "poll_interval_s": %s, "fallback_line": "%s"}\n' \
        "$kill_s" "$seen_s" "$STALL_TIMEOUT" "$KILL_STEP" "${step:-null}" "$POLL_S" "$FALLBACK_LINE" >"$out/killed.json"
    if [[ "$seen_s" != null ]]; then
        log "switchd killed (SIGKILL) after rank 0's step $step; rank 0 on the host path $(awk -v a="$kill_s" -v b="$seen_s" 'BEGIN { printf "%.2f", b - a }') s later (stall timeout $STALL_TIMEOUT s)"
    elif [[ "$kill_s" != null ]]; then
        warn "switchd killed after rank 0's step $step, but the ranks ended without rank 0 logging '$FALLBACK_LINE'"
    else
        warn "the ranks ended before rank 0 printed step $KILL_STEP: switchd not killed"
    fi
}

# run_config LINK COMM: the 4 ranks of one configuration (COMM one of
# --comms); results in $RUN/LINK-COMM/.
CONFIG_NO=0
run_config() {
    local link="$1" comm="$2" out="$RUN/$1-$2" r port on_switch=0 ddp_comm=switch
    local -a env_=()
    mkdir -p "$out"
    port=$((MASTER_PORT_BASE + CONFIG_NO))
    CONFIG_NO=$((CONFIG_NO + 1))
    # train_ddp.py --comm switch builds its state with state_from_env(),
    # which reads AGGSWITCH_MODE and AGGSWITCH_FALLBACK.
    case "$comm" in
        gloo) ddp_comm=gloo ;;
        switch) on_switch=1; env_=(AGGSWITCH_MODE=switch AGGSWITCH_FALLBACK=on) ;;
        switch-killed)
            on_switch=1
            env_=(AGGSWITCH_MODE=switch AGGSWITCH_FALLBACK=on "AGGSWITCH_STALL_TIMEOUT=$STALL_TIMEOUT") ;;
        switch-nofallback) on_switch=1; env_=(AGGSWITCH_MODE=switch AGGSWITCH_FALLBACK=off) ;;
        hosts) env_=(AGGSWITCH_MODE=hosts) ;;
        *) die "run_config: unknown comm '$comm'" ;;
    esac
    if ((on_switch)); then
        start_switchd "$PREFIX-sw" "$SWITCHD" "$out/switchd.log" run --config "$CFG"
    fi
    log "[$link] $comm: $((WARMUP + STEPS)) steps on 4 ranks"
    snapshot "$out/before.jsonl"
    for ((r = 0; r < WORKERS; r++)); do
        (
            export RANK="$r" WORLD_SIZE="$WORKERS" MASTER_ADDR="$MASTER_IP" MASTER_PORT="$port"
            export GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1
            export LOCAL_RANK="$r"
            unset AGGSWITCH_MODE AGGSWITCH_FALLBACK AGGSWITCH_SWITCH AGGSWITCH_JOB AGGSWITCH_SECRET AGGSWITCH_SECRET_FILE \
                AGGSWITCH_STALL_TIMEOUT
            if ((on_switch)); then
                export AGGSWITCH_SWITCH="$SWITCH_ADDR:$AGG_PORT" AGGSWITCH_JOB="$JOB_ID" AGGSWITCH_SECRET="$SECRET"
                export AGGSWITCH_TRANSPORT="$TRANSPORT"
            fi
            ((${#env_[@]} == 0)) || export "${env_[@]}"
            cd "$REPO_ROOT"
            exec timeout -k 10 "$TIMEOUT" ip netns exec "$PREFIX-w$r" \
                /usr/bin/time -f '%M %e %U %S' -o "$out/rank$r.time" \
                "$PY" examples/train_ddp.py --comm "$ddp_comm" --steps $((WARMUP + STEPS)) \
                --batch "$BATCH" --hidden "$HIDDEN" --layers "$LAYERS" --seed "$SEED" \
                --dtype "$DTYPE" --device "$DEVICE" --out "$out/rank$r.json"
        ) >"$out/rank$r.log" 2>&1 &
        RANK_PIDS+=("$!")
    done
    [[ "$comm" != switch-killed ]] || kill_switchd_mid_run "$out"
    if ! wait_ranks; then
        for ((r = 0; r < WORKERS; r++)); do
            echo "---- rank $r ($out/rank$r.log) ----" >&2
            tail -n 5 "$out/rank$r.log" >&2
        done
        die "[$link] $comm: training failed; see $out"
    fi
    snapshot "$out/after.jsonl"
    if ((on_switch)) && [[ -n "$SWITCHD_PID" ]]; then
        # switchd's CPU-seconds (user + system, all threads) for the report
        # (switch-killed: up to the kill, written by kill_switchd_mid_run).
        awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$SWITCHD_PID/stat" \
            >"$out/switchd-cpu-seconds" 2>/dev/null || true
        stop_pid "$SWITCHD_PID"
        SWITCHD_PID=""
    fi
    log "[$link] $comm: $(tail -n 1 "$out/rank0.log")"
}

# busy_machine: true when the 1-min load average is above half the cores.
busy_machine() {
    awk -v l="$(cut -d' ' -f1 /proc/loadavg)" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'
}
if ((WAIT_IDLE > 0)) && busy_machine; then
    log "waiting up to $WAIT_IDLE s for the 1-min load average ($(cut -d' ' -f1 /proc/loadavg)) to fall below $(nproc)/2"
    idle_deadline=$((SECONDS + WAIT_IDLE))
    while busy_machine && ((SECONDS < idle_deadline)); do
        sleep 5
    done
fi
if busy_machine; then
    warn "1-min load average is $(cut -d' ' -f1 /proc/loadavg) on $(nproc) cores before starting: other work shares the CPUs, expect noisy times"
fi
# tbf_args LINK: the tbf arguments of a rate setting (burst 256 kB per
# Gbit/s, about 2 ms of the rate, at least 256 kB).
tbf_args() {
    local n="${1%?bit}" unit="${1: -4}" kb
    if [[ "$unit" == gbit ]]; then kb=$((256 * n)); else kb=256; fi
    echo "rate $1 burst ${kb}kb latency 50ms"
}
TBF_REPORT=()
for link in "${LINK_LIST[@]}"; do
    if [[ "$link" == unlimited ]]; then
        unshape_worker_links "$PREFIX" "$WORKERS"
    else
        read -r -a tbf <<<"$(tbf_args "$link")"
        shape_worker_links "$PREFIX" "$WORKERS" "${tbf[@]}"
        TBF_REPORT+=(--tbf "$link=${tbf[*]}")
    fi
    for comm in "${COMM_LIST[@]}"; do run_config "$link" "$comm"; done
done

# --- report ------------------------------------------------------------------------
OUT_JSON="$REPO_ROOT/results/bench-train-$STAMP.json"
OUT_PNG="$REPO_ROOT/results/bench-train-$STAMP.png"
report_rc=0
"$PY" "$REPO_ROOT/bench/harness/bench_train_report.py" "$RUN" \
    --json "$OUT_JSON" --table "$RUN/table.md" --png "$OUT_PNG" \
    --stamp "$STAMP" --warmup "$WARMUP" --steps "$STEPS" --batch "$BATCH" \
    --hidden "$HIDDEN" --layers "$LAYERS" --seed "$SEED" --mtu "$MTU" --dtype "$DTYPE" \
    --transport "$TRANSPORT" --device "$DEVICE" --links "$LINKS" --comms "$COMMS" --switch-threads "$SWITCH_THREADS" \
    --stall-timeout "$STALL_TIMEOUT" "${TBF_REPORT[@]}" --bench-seconds $((SECONDS - BENCH_T0)) --measure-seconds $((SECONDS - MEASURE_T0)) ||
    report_rc=$?
[[ -s "$OUT_JSON" ]] || die "bench/harness/bench_train_report.py wrote no JSON (status $report_rc)"
echo
echo "=== bench_train $STAMP: DDP step time, 4 ranks on $DEVICE, batch $BATCH per rank, hidden $HIDDEN, $STEPS timed steps ==="
cat "$RUN/table.md"
echo
[[ "$report_rc" -eq 0 || "$report_rc" -eq 3 ]] || die "bench/harness/bench_train_report.py failed (status $report_rc)"
if [[ "$report_rc" -eq 3 ]]; then
    die "sanity check failed (see the table): bench/results/ left alone; $OUT_JSON"
fi
if [[ "$DOCS" -eq 1 ]]; then
    cp "$OUT_JSON" "$REPO_ROOT/bench/results/bench-train.json"
    [[ -s "$OUT_PNG" ]] && cp "$OUT_PNG" "$REPO_ROOT/bench/results/bench-train.png"
    log "wrote bench/results/bench-train.json, bench/results/bench-train.png, $OUT_JSON and $OUT_PNG"
else
    log "wrote $OUT_JSON and $OUT_PNG (bench/results/ left alone)"
fi
log "bench took $((SECONDS - BENCH_T0)) s"
