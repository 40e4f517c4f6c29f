#!/usr/bin/env bash
#
# bench.sh: all-reduce through the switch against OpenMPI's MPI_Allreduce, on
# the same veth testbed, in the same run, on unlimited links and on links
# limited to 1 Gbit/s each way. One command from a fresh clone.
#
# Usage:
#   sudo scripts/bench.sh [--mib 64] [--repeats 5] [--mtu 1500] [--quick] [--timeout 900]
#                         [--wait-idle SECS] [--no-docs]
#                         [--rates-only | --no-rates] [--rate-seconds 5]
#                         [--rate-repeats 3] [--no-forward] [--no-per-packet]
#                         [--no-efficiency] [--no-gloo] [--threads 1,2]
#                         [--cores-only] [--no-build]
#
#   --mib S       tensor size per worker in MiB of float32 (default 64)
#   --repeats K   timed all-reduces per measurement (default 5)
#   --mtu M       MTU of every testbed link for the all-reduce part (default
#                 1500; 576..9000; above 3500 switchd binds its AF_XDP sockets
#                 with multi-buffer, docs/PROTOCOL.md "Limits"). The switch
#                 sizes its chunks from it and OpenMPI's TCP runs on the same
#                 links. With M != 1500 the docs files are
#                 bench/results/bench-mtuM.{json,png}
#   --quick       a fast check: 8 MiB, 3 repeats (unless given), results/ only
#   --timeout T   seconds any one measurement may take (default 900)
#   --wait-idle W before measuring, wait up to W s for the 1-min load average
#                 to fall below half the cores (the times are only meaningful
#                 on a machine nothing else is loading; default 0: no wait)
#   --no-docs     write results/ only, leave bench/results/bench.{json,png} alone
#   --rates-only  only the packet-rate section (below), then stop
#   --no-rates    skip the packet-rate section
#   --rate-seconds D  seconds per rate measurement (default 5; --quick: 2)
#   --rate-repeats R  runs per rate measurement, median reported (default 3;
#                 --quick: 1)
#   --threads LIST  dataplane thread counts to measure, comma-separated,
#                 ascending, starting with 1 (default 1,2; e.g. 1,2,4,8 on a
#                 many-core machine): the aggregation packet rates and the
#                 switch's all-reduce time (section "threads" below) with
#                 each. Thread counts above 2 give the rate testbed as many
#                 queues as the largest count (else 2)
#   --cores-only  only what scaling over cores needs: the packet rates and
#                 the switch's all-reduce by dataplane thread count (no
#                 per-packet, forwarding, OpenMPI, shaped-link or efficiency
#                 parts; bench/results/ left alone); needs jq, python3, ip, tc,
#                 ethtool and taskset, and nothing from apt when they are
#                 there. For a many-core machine, e.g. --threads 1,2,4,8
#   --no-build    use target/release as it is (binaries built elsewhere: a
#                 machine without a Rust toolchain)
#   --no-forward  skip the forwarding comparison (scripts/bench forward:
#                 iperf3 and sockperf between two hosts through a plain
#                 bridge, through switchd with forwarding = "bridge", and
#                 through the XDP fast path; runs after the packet rates,
#                 its JSON goes under "forwarding")
#   --no-per-packet  skip the in-memory per-packet cost
#                 (scripts/bench per-packet: criterion's engine vs copy of
#                 the payload, pinned to one CPU, before anything else runs;
#                 its JSON goes under "per_packet")
#   --no-gloo     skip gloo (the headline peer: PyTorch's all-reduce, which
#                 needs torch in the project venv; scripts/setup.sh installs
#                 it); the headline then has only the OpenMPI ratios
#   --no-efficiency  skip the per-byte efficiency section
#                 (scripts/bench efficiency: time and whole-machine
#                 CPU-seconds per GiB for the switch in float32 with each
#                 worker transport and in bfloat16, OpenMPI with TSO and
#                 gloo, at MTU 1500 and 9000, unlimited and 1 Gbit/s links;
#                 runs last, its ratios and goals go under "efficiency" and
#                 are printed; bench/results/bench-efficiency.{json,png})
#
# Aggregation trees (several switches: leaves and spines) are measured by
# `scripts/bench tree` on the leaf-spine testbed: 1 tree against 2 on
# rate-limited leaf-spine links, and the fairness experiment on a shared
# spine link (docs/BENCHMARKS.md, "Aggregation trees").
#
# Packet rates (first, unless --no-rates): on a testbed of its own (prefix
# "rate": rate-sw, rate-w0; 2 queues per veth), `aggblast` (bench/; raw
# AF_PACKET frames, sendmmsg, through veth's noqueue qdisc so that the flow
# hash spreads flows over both queues) pinned to the last CPU
# and switchd's dataplane thread 0 pinned to CPU 0 measure: XDP_DROP
# (switchd mode "xdp-drop", the XDP program's dropped counter), AF_XDP echo
# (mode "echo", 1512- and 64-byte frames, switchd's echoed counter) and
# aggregation (jobs of 2, 4, 8 ranks all played by one closed-loop
# generator; DATA frames/s, chunks/s, float32 elements/s) with each
# dataplane thread count of --threads (default 1 and 2). Ratios: aggregation / echo (goal >= 0.9), echo /
# XDP_DROP, 2 threads / 1 thread. They go under "rates" in the JSON
# (bench/harness/bench_rates_report.py computes them from the counters, the
# generator's JSON and switchd's /proc/PID/stat left in results/.../rates/).
#
# What it does:
#   1. installs what is missing (one apt-get update, then apt-get install of
#      openmpi-bin libopenmpi-dev python3-matplotlib jq iperf3 and the build
#      dependencies), builds with `cargo build --release --workspace --bins`,
#      compiles bench/mpi_allreduce.c with mpicc;
#   2. makes a testbed of 4 workers (scripts/testbed.sh up --workers 4
#      --prefix bench: namespaces bench-sw, bench-w0..3);
#   3. for each link setting, "unlimited" (plain veth) then "1gbit" (tc tbf
#      1 Gbit/s on every worker's eth0 egress, on every switch port sw-wI
#      egress, and on every worker's eth0 ingress through an ifb device,
#      because switchd's AF_XDP transmit bypasses the qdisc of sw-wI):
#        * iperf3 worker->switch, switch->worker and worker->worker (TCP, 2 s)
#          to show what the links carry;
#        * OpenMPI: mpirun in bench-w0 with a hostfile of the 4 workers and an
#          ssh stand-in that runs each rank's daemon in its namespace; TCP
#          BTL on eth0; one warm-up then K timed MPI_Allreduce (MPI_FLOAT,
#          MPI_SUM) of the tensor; best/median/mean of the slowest rank.
#          Twice: on the testbed as made (worker eth0 transmit checksum
#          offload off, hence no TSO: the switch needs complete checksums),
#          and again with it on (TSO), as TCP would have it on a real NIC;
#        * gloo (the headline peer, what a PyTorch user runs): one rank of
#          bench/gloo_allreduce.py per worker namespace, TCP on eth0 with
#          TSO on, one warm-up then K timed all-reduces;
#        * the switch: switchd in bench-sw (4 ports, job 1 of 4 workers,
#          pool_slots 256, a random secret); the 4 `worker allreduce` run
#          concurrently, once with --iterations K (all-reduce time = the
#          slowest rank's seconds / K) and K times with --iterations 1 (best
#          and median of the slowest rank); ifb/tbf byte counters show that
#          the switch's traffic crossed the shapers;
#   3b. threads: the switch's all-reduce again, the same way, on unlimited
#      links, with each dataplane thread count T of --threads: the testbed
#      remade with T queues per veth (testbed.sh --queue-per-worker: worker
#      I sends on queue floor(I*T/4)) and switchd at queues = dataplane_threads = T, so
#      thread T' owns queue T' of every port and worker I's frames go to
#      thread floor(I*T/4), neighbouring ranks together (with 4 workers, at
#      most 4 threads get frames). Times, their
#      ratio to 1 thread and the frames each queue (thread) received go under
#      "threads" in the JSON (bench/harness/bench_threads_report.py), the times
#      also under headline.allreduce_threads;
#   4. bench/harness/bench_report.py takes the statistics from the raw results
#      each phase left (the programs' JSON, snapshots of /proc/stat and of
#      the shapers' counters; medians, ratios, the headline: switch / gloo
#      first, switch / OpenMPI beside it), prints a
#      table and writes results/bench-STAMP.json (+ logs in
#      results/bench-STAMP/), and unless --quick or --no-docs, bench/results/bench.json
#      and bench/results/bench.png (bench/harness/bench_plot.py); with --rates-only,
#      bench/results/bench-rates.json and bench/results/bench-rates.png instead.
#
# Times are per all-reduce of the whole tensor. The line-rate bound on
# 1 Gbit/s links is the bytes each link must carry the longer way (every
# chunk of 358 floats is a 14+20+8+22+1432 = 1496-byte DATA frame and a
# 1512-byte RESULT, its 16-byte token added) over 1 Gbit/s; tc counts
# frames without FCS, preamble and gap, so that is the bound on this testbed
# ("l2"); "l1" adds 24 bytes a frame as a real Ethernet NIC would.
#
# Everything runs inside the bench-* namespaces; every process started is
# stopped by PID and the testbed removed on exit, also on failure.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly PREFIX=bench
readonly WORKERS=4
# The switch's address, from the testbed in use (tb switch_addr).
SWITCH_ADDR=""
readonly AGG_PORT=48879
readonly JOB_ID=1
readonly POOL_SLOTS=256
readonly RATE=1gbit
readonly RATE_BPS=1000000000
readonly TBF_ARGS=(rate "$RATE" burst 256kb latency 50ms)
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=15
readonly IPERF_SECS=2
readonly IPERF_PORT=5201
# Build, run and plot dependencies; setup.sh's build list plus the benchmark's.
readonly PACKAGES=(
    clang llvm libbpf-dev linux-libc-dev iproute2 ethtool gcc
    openmpi-bin libopenmpi-dev python3 python3-matplotlib jq iperf3
)

ORIG_ARGS=("$@")
MIB=""
MTU=1500
REPEATS=""
QUICK=0
DO_RATES=1
DO_FORWARD=1
DO_PER_PACKET=1
DO_EFFICIENCY=1
RATES_ONLY=0
CORES_ONLY=0
BUILD=1
RATE_SECONDS=""
RATE_REPEATS=""
TIMEOUT=900
WAIT_IDLE=0
DOCS=1
THREADS_ARG=1,2
GLOO=1
readonly GLOO_PORT=29518

while [[ $# -gt 0 ]]; do
    case "$1" in
        --mib|--repeats|--timeout|--wait-idle|--rate-seconds|--rate-repeats|--mtu|--threads)
            [[ $# -ge 2 ]] || die "$1 needs a value"
            case "$1" in
                --threads) THREADS_ARG="$2" ;;
                --rate-seconds) RATE_SECONDS="$2" ;;
                --rate-repeats) RATE_REPEATS="$2" ;;
                --mib) MIB="$2" ;;
                --mtu) MTU="$2" ;;
                --repeats) REPEATS="$2" ;;
                --timeout) TIMEOUT="$2" ;;
                --wait-idle) WAIT_IDLE="$2" ;;
            esac
            shift 2 ;;
        --mib=*) MIB="${1#*=}"; shift ;;
        --mtu=*) MTU="${1#*=}"; shift ;;
        --repeats=*) REPEATS="${1#*=}"; shift ;;
        --timeout=*) TIMEOUT="${1#*=}"; shift ;;
        --wait-idle=*) WAIT_IDLE="${1#*=}"; shift ;;
        --threads=*) THREADS_ARG="${1#*=}"; shift ;;
        --quick) QUICK=1; shift ;;
        --no-gloo) GLOO=0; shift ;;
        --rate-seconds=*) RATE_SECONDS="${1#*=}"; shift ;;
        --rate-repeats=*) RATE_REPEATS="${1#*=}"; shift ;;
        --rates-only) RATES_ONLY=1; DO_RATES=1; shift ;;
        --cores-only) CORES_ONLY=1; shift ;;
        --no-build) BUILD=0; shift ;;
        --no-rates) DO_RATES=0; shift ;;
        --no-forward) DO_FORWARD=0; shift ;;
        --no-per-packet) DO_PER_PACKET=0; shift ;;
        --no-efficiency) DO_EFFICIENCY=0; shift ;;
        --no-docs) DOCS=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
if [[ "$QUICK" -eq 1 ]]; then
    MIB="${MIB:-8}"
    REPEATS="${REPEATS:-3}"
    RATE_SECONDS="${RATE_SECONDS:-2}"
    RATE_REPEATS="${RATE_REPEATS:-1}"
    DOCS=0
fi
RATE_SECONDS="${RATE_SECONDS:-5}"
RATE_REPEATS="${RATE_REPEATS:-3}"
uint_in_range "$RATE_SECONDS" 1 600 || die "--rate-seconds must be 1..600, got '$RATE_SECONDS'"
uint_in_range "$RATE_REPEATS" 1 100 || die "--rate-repeats must be 1..100, got '$RATE_REPEATS'"
RATE_SECONDS=$((10#$RATE_SECONDS)); RATE_REPEATS=$((10#$RATE_REPEATS))
[[ "$RATES_ONLY" -eq 1 && "$DO_RATES" -eq 0 ]] && die "--rates-only and --no-rates exclude each other"
[[ "$RATES_ONLY" -eq 1 && "$CORES_ONLY" -eq 1 ]] && die "--rates-only and --cores-only exclude each other"
if [[ "$CORES_ONLY" -eq 1 ]]; then
    DO_PER_PACKET=0
    DO_FORWARD=0
    DO_EFFICIENCY=0
    DOCS=0
fi
readonly CORES_ONLY BUILD
readonly RATE_SECONDS RATE_REPEATS DO_RATES RATES_ONLY
MIB="${MIB:-64}"
REPEATS="${REPEATS:-5}"
uint_in_range "$MIB" 1 1024 || die "--mib must be 1..1024, got '$MIB'"
uint_in_range "$REPEATS" 1 1000 || die "--repeats must be 1..1000, got '$REPEATS'"
uint_in_range "$TIMEOUT" 10 86400 || die "--timeout must be 10..86400 s, got '$TIMEOUT'"
uint_in_range "$WAIT_IDLE" 0 86400 || die "--wait-idle must be 0..86400 s, got '$WAIT_IDLE'"
uint_in_range "$MTU" 576 9000 ||
    die "--mtu must be 576..9000 (switchd serves ports up to MTU 9000), got '$MTU'"
MTU=$((10#$MTU))
readonly MTU
IFS=, read -r -a THREADS <<<"$THREADS_ARG"
((${#THREADS[@]} > 0)) || die "--threads needs a list like 1,2,4"
prev=0
for i in "${!THREADS[@]}"; do
    t="${THREADS[i]}"
    if ! uint_in_range "$t" 1 64 || ((10#$t <= prev)); then
        die "--threads must be ascending counts 1..64 separated by commas, got '$THREADS_ARG'"
    fi
    THREADS[i]=$((10#$t))
    prev=${THREADS[i]}
done
THREADS_ARG="$(IFS=,; echo "${THREADS[*]}")"
[[ "${THREADS[0]}" == 1 ]] || die "--threads must start with 1 (the baseline), got '$THREADS_ARG'"
readonly THREADS THREADS_ARG
MIB=$((10#$MIB)); REPEATS=$((10#$REPEATS)); TIMEOUT=$((10#$TIMEOUT)); WAIT_IDLE=$((10#$WAIT_IDLE))
readonly MIB REPEATS TIMEOUT WAIT_IDLE QUICK DOCS
readonly ELEMENTS=$((MIB * 1024 * 1024 / 4))

require_root "${ORIG_ARGS[@]}"
cd "$REPO_ROOT"

# --- cleanup --------------------------------------------------------------------
TESTBED_MADE=0
SWITCHD_PID=""
BG_PIDS=()   # every other background child (workers, mpirun, iperf3)


cleanup() {
    local rc=$? pid ns
    trap - EXIT INT TERM
    for pid in "${BG_PIDS[@]}"; do
        stop_pid "$pid"
    done
    stop_pid "$SWITCHD_PID"
    stop_pid "${RATE_SWITCHD_PID:-}"
    if [[ "${RATE_TESTBED_MADE:-0}" -eq 1 ]]; then
        for ns in rate-sw rate-w0; do
            netns_exists "$ns" || continue
            for pid in $(ip netns pids "$ns" 2>/dev/null); do
                kill -KILL "$pid" 2>/dev/null || true
            done
        done
        bash "$REPO_ROOT/scripts/testbed.sh" down --prefix rate >/dev/null 2>&1 ||
            warn "testbed down failed; run: scripts/testbed.sh down --prefix rate"
    fi
    if [[ "$TESTBED_MADE" -eq 1 ]]; then
        stop_testbed_processes "$PREFIX" "$WORKERS"
        bash "$REPO_ROOT/scripts/testbed.sh" down --prefix "$PREFIX" >/dev/null 2>&1 ||
            warn "testbed down failed; run: scripts/testbed.sh down --prefix $PREFIX"
    fi
    if [[ -n "${MPI_TMP:-}" && -d "$MPI_TMP" ]]; then
        rm -rf -- "$MPI_TMP"
    fi
    if [[ -n "${RUN:-}" ]]; then
        rm -rf -- "${RUN:?}/bin"
        [[ "$rc" -eq 0 ]] || log "failed (status $rc); logs in $RUN"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_pids TIMEOUT PID...: wait for background children up to TIMEOUT s,
# stopping those still running then. Sets WAIT_RCS[i] to the exit status of
# the i-th PID, or 124 on timeout. Returns 0 when every status is 0.
WAIT_RCS=()
wait_pids() {
    local timeout="$1" i rc left deadline
    shift
    local -a pids=("$@")
    WAIT_RCS=()
    deadline=$((SECONDS + timeout))
    left=${#pids[@]}
    while ((left > 0)); do
        for i in "${!pids[@]}"; do
            [[ -z "${WAIT_RCS[i]:-}" ]] || continue
            if ! kill -0 "${pids[i]}" 2>/dev/null; then
                rc=0
                wait "${pids[i]}" || rc=$?
                WAIT_RCS[i]=$rc
                left=$((left - 1))
            fi
        done
        ((left > 0)) || break
        if ((SECONDS >= deadline)); then
            for i in "${!pids[@]}"; do
                if [[ -z "${WAIT_RCS[i]:-}" ]]; then
                    warn "pid ${pids[i]} still running after $timeout s; stopping it"
                    stop_pid "${pids[i]}"
                    WAIT_RCS[i]=124
                fi
            done
            break
        fi
        sleep 0.05
    done
    # They are reaped: forget them.
    local -a keep=()
    local p q gone
    for p in "${BG_PIDS[@]}"; do
        gone=0
        for q in "${pids[@]}"; do [[ "$p" == "$q" ]] && gone=1; done
        [[ "$gone" -eq 1 ]] || keep+=("$p")
    done
    BG_PIDS=("${keep[@]}")
    for rc in "${WAIT_RCS[@]}"; do
        [[ "$rc" -eq 0 ]] || return 1
    done
    return 0
}

# --- install, build -----------------------------------------------------------------
missing=()
NEEDED_COMMANDS=(mpicc mpirun jq iperf3 python3 tc ip)
if [[ "$CORES_ONLY" -eq 1 ]]; then
    NEEDED_COMMANDS=(jq python3 tc ip ethtool taskset)
    # By command, not by dpkg: tools carried to a machine without apt count.
    for c in "${NEEDED_COMMANDS[@]}"; do
        command -v "$c" >/dev/null 2>&1 || { missing=(iproute2 ethtool python3 jq util-linux); break; }
    done
else
    for p in "${PACKAGES[@]}"; do
        pkg_installed "$p" || missing+=("$p")
    done
fi
if ((${#missing[@]} > 0)); then
    command -v apt-get >/dev/null 2>&1 || die "missing packages (${missing[*]}) and no apt-get"
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null || die "apt-get update failed"
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
        die "apt-get install ${missing[*]} failed"
fi
for c in "${NEEDED_COMMANDS[@]}"; do
    command -v "$c" >/dev/null 2>&1 || die "$c not found after installing"
done

if [[ "$BUILD" -eq 1 ]]; then
    build_release
else
    for b in switchd worker switchctl aggblast; do
        [[ -x "$REPO_ROOT/target/release/$b" ]] ||
            die "--no-build: target/release/$b missing (build it with cargo build --release --workspace --bins, here or on a machine with the same CPU architecture)"
    done
fi

# gloo (the headline peer) needs torch in the project venv.
if [[ "$GLOO" -eq 1 && "$CORES_ONLY" -eq 0 && "$RATES_ONLY" -eq 0 ]] &&
    ! "$VENV_PYTHON" -c "import torch" 2>/dev/null; then
    log "gloo needs torch in the project venv: running scripts/setup.sh (torch: about 80 s and 5 GB the first time)"
    bash "$REPO_ROOT/scripts/setup.sh" || die "scripts/setup.sh failed; fix what it says, or pass --no-gloo"
    "$VENV_PYTHON" -c "import torch" || die "still no torch in $REPO_ROOT/.venv after scripts/setup.sh"
fi

STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
readonly STAMP
RUN="$REPO_ROOT/results/bench-$STAMP"
mkdir -p "$RUN/bin"
readonly RUN
# Private copies, so that a rebuild meanwhile cannot change what is measured
# (removed on exit).
cp "$REPO_ROOT/target/release/switchd" "$REPO_ROOT/target/release/worker" "$RUN/bin/"
readonly SWITCHD="$RUN/bin/switchd"
readonly WORKER="$RUN/bin/worker"
cp "$REPO_ROOT/target/release/switchctl" "$RUN/bin/"
readonly SWITCHCTL="$RUN/bin/switchctl"
cp "$REPO_ROOT/target/release/aggblast" "$RUN/bin/"
readonly AGGBLAST="$RUN/bin/aggblast"

# --- per-packet cost (in memory), first, while nothing else of ours runs ------------
if [[ "$DO_PER_PACKET" -eq 1 && "$RATES_ONLY" -eq 0 ]]; then
    pp_secs=3
    [[ "$QUICK" -eq 1 ]] && pp_secs=1
    "$REPO_ROOT/scripts/bench" per-packet --secs "$pp_secs" --json "$RUN/per-packet.json" |
        tee "$RUN/per-packet-table.md" || die "scripts/bench per-packet failed (see above)"
fi

# plot_and_publish JSON PNG NAME: draw PNG from JSON (bench/harness/bench_plot.py,
# with the system Python: Debian's python3-matplotlib lives there, whatever
# python3 comes first on PATH), and unless --quick/--no-docs copy both to
# docs/NAME.json and docs/NAME.png.
plot_and_publish() {
    local json="$1" png="$2" name="$3" python=/usr/bin/python3
    [[ -x "$python" ]] || python=python3
    "$python" "$REPO_ROOT/bench/harness/bench_plot.py" "$json" "$png" ||
        warn "plot failed (bench/harness/bench_plot.py)"
    if [[ "$DOCS" -eq 1 ]]; then
        mkdir -p "$REPO_ROOT/docs"
        cp "$json" "$REPO_ROOT/bench/results/$name.json"
        [[ -s "$png" ]] && cp "$png" "$REPO_ROOT/bench/results/$name.png"
        log "wrote bench/results/$name.json, bench/results/$name.png and $json"
    else
        log "wrote $json and $png (bench/results/ left alone)"
    fi
}

# --- packet rates (before the all-reduce part) ------------------------------------------
# A testbed of its own (prefix "rate", one generator namespace rate-w0 whose
# veth to the switch has RATE_QUEUES queues), one switchd at a time with one
# port sw-w0 and RATE_QUEUES sockets, and `aggblast` as the generator:
#   xdp-drop   switchd mode "xdp-drop": the XDP program drops what it would
#              steer; rate = its dropped counter's delta / blast seconds;
#   echo       switchd mode "echo": frames back out, addresses swapped;
#              rate = switchd's echoed counter's delta / blast seconds;
#   aggregate  switchd as the switch, jobs of 2, 4 and 8 ranks, every rank
#              played by one `aggblast aggregate` (closed loop); rate =
#              DATA frames sent per second and chunks completed per second,
#              with 1 and 2 dataplane threads.
# The generator is pinned to the last CPU and switchd's dataplane thread 0
# to CPU 0 (pin_threads); with 2 dataplane threads, thread 1 shares the
# generator's CPU. With PACKET_QDISC_BYPASS the kernel would pick the veth
# queue from the sending CPU (all frames on one queue, one socket), so the
# generator goes through veth's noqueue qdisc instead (--spread-queues):
# the flow hash of its source ports then spreads frames over both queues. Each measurement runs RATE_REPEATS times; the median is
# reported.
readonly RATE_PREFIX=rate
# Queues of the generator's veth: 2, or the most threads asked for.
RATE_QUEUES=2
((${THREADS[-1]} <= RATE_QUEUES)) || RATE_QUEUES=${THREADS[-1]}
readonly RATE_QUEUES
readonly RATE_RANKS=(2 4 8)
readonly RATE_FLOWS=8
readonly DATA_FRAME_BYTES=1512
# DATA frames in flight at most in the closed loop: half the switch's
# receive ring (frames_per_socket 4096 / 2 = 2048 entries). The generator
# does not react to ECE as a DCTCP worker would, so a window of 256 seqs x
# 8 ranks would keep the ring full and lose frames to overflow.
readonly RATE_INFLIGHT_FRAMES=1024
RATE_TESTBED_MADE=0
RATE_SWITCHD_PID=""
RATES="$RUN/rates"
GEN_CPU=""
if (($(nproc) >= 2)); then
    GEN_CPU=$(($(nproc) - 1))
fi

# rate_switchd MODE THREADS: start switchd on the rate testbed.
rate_switchd() {
    local mode="$1" threads="$2" cfg="$RATES/switchd-$1-t$2.toml" n deadline
    local -a jobs=()
    for n in "${RATE_RANKS[@]}"; do
        # One generator plays all n ranks of job n, from the testbed's subnet.
        jobs+=(--job "$n:all:env:AGGSWITCH_TESTBED_SECRET" --set "job.$n.n_workers=$n"
            --set "job.$n.pool_slots=$POOL_SLOTS")
    done
    AGGSWITCH_TESTBED_SECRET="$SECRET" "$SWITCHD" testbed-config --env "$TESTBED_ENV" \
        --out "$cfg" --writer "scripts/bench.sh (rate section)" "${jobs[@]}" \
        --set "switch.agg_port=$AGG_PORT" --set "switch.queues=$RATE_QUEUES" \
        --set "switch.dataplane_threads=$threads" --set switch.pin_threads=true \
        --set "switch.mode=$mode" --set switch.summary_interval_secs=1.0 \
        --set "switch.admin_socket=\"$RATES/switchd.sock\"" ||
        die "switchd testbed-config failed for $cfg"
    start_switchd "$RATE_PREFIX-sw" "$SWITCHD" "$RATES/switchd-$mode-t$threads.log" \
        run --config "$cfg"
    RATE_SWITCHD_PID=$SWITCHD_PID
    SWITCHD_PID=""
}

rate_stop_switchd() {
    stop_pid "$RATE_SWITCHD_PID"
    RATE_SWITCHD_PID=""
}

rate_stats() {
    "$SWITCHCTL" --socket "$RATES/switchd.sock" --json stats
}

# rates_report ARGS...: bench/harness/bench_rates_report.py, which owns the rate
# section's arithmetic (rates, medians, ratios, rates.json, the table).
rates_report() {
    python3 "$REPO_ROOT/bench/harness/bench_rates_report.py" "$@"
}

# rate_mark TAG EDGE K: before or after blast K of TAG, switchd's counters
# (switchctl stats) and its /proc/PID/stat (CPU seconds of all its threads:
# packets per switchd CPU-second is the number that other work on the
# machine disturbs least) into RATES/.
rate_mark() {
    rate_stats >"$RATES/$1-stats-$2$3.json"
    cat "/proc/$RATE_SWITCHD_PID/stat" >"$RATES/$1-switchd-$2$3.stat"
}

# rate_gen OUT ARGS...: `aggblast ARGS` in the generator namespace,
# pinned; its JSON into OUT.
rate_gen() {
    local out="$1" pin=()
    shift
    [[ -n "$GEN_CPU" ]] && pin=(taskset -c "$GEN_CPU")
    timeout $((RATE_SECONDS + 60)) ip netns exec "$RATE_PREFIX-w0" "${pin[@]}" "$AGGBLAST" "$@" --spread-queues \
        >"$out" 2>"${out%.json}.log" || {
        tail -n 5 "${out%.json}.log" >&2
        die "aggblast $* failed; see ${out%.json}.log"
    }
}

# rate_open TAG FRAME_BYTES: open-loop runs against the running switchd;
# the report takes rate = counter delta / generator seconds (the counter
# is TAG's: XDP_DROP's dropped, echo's echoed) and writes RATES/TAG.json.
rate_open() {
    local tag="$1" bytes="$2" k line
    for ((k = 1; k <= RATE_REPEATS; k++)); do
        rate_mark "$tag" before "$k"
        rate_gen "$RATES/$tag-gen$k.json" echo --switch "$SWITCH_ADDR" --port "$AGG_PORT" \
            --frame-bytes "$bytes" --flows "$RATE_FLOWS" --seconds "$RATE_SECONDS"
        sleep 0.3 # let the last frames through and the counters publish
        rate_mark "$tag" after "$k"
    done
    line="$(rates_report open "$RATES" "$tag" --repeats "$RATE_REPEATS")" ||
        die "bench/harness/bench_rates_report.py open failed on $RATES ($tag)"
    log "[rates] $line"
}

# rate_agg RANKS THREADS: closed-loop runs; the report takes the switch's
# received frames per second and the generator's rates, and writes
# RATES/agg-nRANKS-tTHREADS.json.
rate_agg() {
    local n="$1" t="$2" tag="agg-n$1-t$2" k line
    for ((k = 1; k <= RATE_REPEATS; k++)); do
        rate_mark "$tag" before "$k"
        rate_gen "$RATES/$tag-gen$k.json" aggregate --switch "$SWITCH_ADDR" --port "$AGG_PORT" \
            --job "$n" --workers "$n" --secret "$SECRET" --seconds "$RATE_SECONDS" --verify-every 256 \
            --window $((RATE_INFLIGHT_FRAMES / n))
        sleep 0.3
        rate_mark "$tag" after "$k"
    done
    line="$(rates_report agg "$RATES" "$n" "$t" --repeats "$RATE_REPEATS")" ||
        die "bench/harness/bench_rates_report.py agg failed on $RATES ($tag)"
    [[ "$(jq -r .verify_failed "$RATES/$tag.json")" == 0 ]] ||
        die "aggregation rate run $tag: sampled RESULTs differ from N x value"
    log "[rates] $line"
}

run_rates() {
    local t n
    mkdir -p "$RATES"
    log "[rates] testbed '$RATE_PREFIX' ($RATE_QUEUES queues), $RATE_SECONDS s x $RATE_REPEATS per measurement; generator on CPU ${GEN_CPU:-any}, switchd thread 0 on CPU 0"
    RATE_TESTBED_MADE=1
    testbed_up "$RATES/testbed.env" --prefix "$RATE_PREFIX" --workers 1 \
        --queues "$RATE_QUEUES" 2>"$RATES/testbed.log"
    SWITCH_ADDR="$(tb switch_addr)"
    RATE_LOAD_START="$(cut -d" " -f1 /proc/loadavg)"

    rate_switchd xdp-drop 1
    if [[ "$(rate_stats | jq '.ports[0] | has("xdp_dropped")')" == true ]]; then
        rate_open xdp_drop "$DATA_FRAME_BYTES" '.ports[0].xdp_dropped'
    else
        warn "[rates] this switchd has no xdp-drop counter; XDP_DROP baseline skipped"
        echo null >"$RATES/xdp_drop.json"
    fi
    rate_stop_switchd

    rate_switchd echo 1
    rate_open echo "$DATA_FRAME_BYTES" '.echoed'
    rate_open echo64 64 '.echoed'
    rate_stop_switchd

    for t in "${THREADS[@]}"; do
        rate_switchd aggregate "$t"
        for n in "${RATE_RANKS[@]}"; do
            rate_agg "$n" "$t"
        done
        rate_stop_switchd
    done

    rates_report report "$RATES" --threads "$THREADS_ARG" --ranks "$(IFS=,; echo "${RATE_RANKS[*]}")" \
        --seconds "$RATE_SECONDS" --repeats "$RATE_REPEATS" --queues "$RATE_QUEUES" \
        --flows "$RATE_FLOWS" --inflight "$RATE_INFLIGHT_FRAMES" --gen-cpu "${GEN_CPU:-none}" \
        --load-start "$RATE_LOAD_START" >"$RUN/rates-table.md" ||
        die "bench/harness/bench_rates_report.py report failed on $RATES"
    bash "$REPO_ROOT/scripts/testbed.sh" down --prefix "$RATE_PREFIX" >/dev/null 2>&1 || true
    RATE_TESTBED_MADE=0
}

if [[ "$DO_RATES" -eq 1 ]]; then
    SECRET="$(random_secret)"
    run_rates
    echo
    echo "=== bench $STAMP: packet rates ==="
    cat "$RUN/rates-table.md"
    echo
fi
# --- forwarding: ordinary traffic through the switch against a plain bridge ---------------
if [[ "$DO_FORWARD" -eq 1 && "$RATES_ONLY" -eq 0 ]]; then
    fwd_args=(--json "$RUN/forward.json")
    [[ "$QUICK" -eq 1 ]] && fwd_args+=(--secs 2 --rounds 1)
    log "forwarding comparison (scripts/bench forward ${fwd_args[*]})"
    AGG_SWITCHD="$REPO_ROOT/target/release/switchd" \
        "$REPO_ROOT/scripts/bench" forward "${fwd_args[@]}" | tee "$RUN/forward-table.txt" ||
        die "scripts/bench forward failed (see above)"
fi

if [[ "$RATES_ONLY" -eq 1 ]]; then
    OUT_JSON="$REPO_ROOT/results/bench-$STAMP.json"
    python3 "$REPO_ROOT/bench/harness/bench_report.py" rates-only --json "$OUT_JSON" --stamp "$STAMP" \
        --repo "$REPO_ROOT" --rates "$RATES/rates.json" ||
        die "bench/harness/bench_report.py rates-only failed; the raw results are in $RUN"
    plot_and_publish "$OUT_JSON" "$RUN/rates.png" bench-rates
    exit 0
fi
MPI_BIN="$RUN/mpi_allreduce"
if [[ "$CORES_ONLY" -eq 0 ]]; then
    mpicc -O2 -o "$MPI_BIN" "$REPO_ROOT/bench/mpi_allreduce.c" ||
        die "mpicc failed on bench/mpi_allreduce.c"
fi

# --- testbed, config, ssh stand-in --------------------------------------------------
TESTBED_MADE=1
testbed_up "$RUN/testbed.env" --prefix "$PREFIX" --workers "$WORKERS" --mtu "$MTU" 2>"$RUN/testbed.log"
SWITCH_ADDR="$(tb switch_addr)"

SECRET="$(random_secret)"
readonly SECRET

CFG="$RUN/switchd.toml"
write_testbed_switchd_config "$CFG" "scripts/bench.sh" "$WORKERS" "$SECRET"

HOSTFILE="$RUN/hostfile"
RSH="$RUN/netns-ssh.sh"
if [[ "$CORES_ONLY" -eq 0 ]]; then
    MPI_TMP="$(mktemp -d /tmp/bench-mpi.XXXXXX)"
    write_mpi_hosts "$WORKERS" "$HOSTFILE" "$RSH" "$MPI_TMP"
fi

# --- measurements -------------------------------------------------------------------
loadavg() { cut -d' ' -f1 /proc/loadavg; }

# shape_links: 1 Gbit/s each way on every worker link (see the header;
# shape_worker_links in lib.sh).
shape_links() {
    shape_worker_links "$PREFIX" "$WORKERS" "${TBF_ARGS[@]}"
}

# phase_snapshot TAG before|after: lib.sh's snapshot (/proc/stat's cpu
# line and every shaper's counters, tc -s -j) into $OUT/snap-TAG-EDGE.jsonl;
# bench/harness/bench_report.py takes the differences: the phase's shapers and its
# busy share of all CPUs (bench/harness/benchkit.py's definition, as every
# report's). Before a phase a fresh /proc/stat line follows the shaper
# reads, so that their CPU falls outside the phase.
phase_snapshot() {
    local f="$OUT/snap-$1-$2.jsonl"
    snapshot "$f"
    if [[ "$2" == before ]]; then
        printf '{"t": %s, "stat": "%s"}\n' "$(date +%s.%N)" "$(head -n 1 /proc/stat)" >>"$f"
    fi
}

# iperf NAME SERVER_NS ADDR CLIENT_NS [-R]: iperf3's report (TCP, -J) into
# $OUT/iperf-NAME.json; bench/harness/bench_report.py reads the Gbit/s received.
iperf() {
    local name="$1" sns="$2" addr="$3" cns="$4" i spid rc=0
    shift 4
    ip netns exec "$sns" iperf3 -s -1 -p "$IPERF_PORT" >"$OUT/iperf-$name-server.log" 2>&1 &
    spid=$!
    BG_PIDS+=("$spid")
    for ((i = 0; i < 50; i++)); do
        ip netns exec "$sns" ss -ltnH "sport = :$IPERF_PORT" 2>/dev/null | grep -q . && break
        sleep 0.1
    done
    ip netns exec "$cns" iperf3 -c "$addr" -p "$IPERF_PORT" -t "$IPERF_SECS" -J "$@" \
        >"$OUT/iperf-$name.json" 2>&1 || rc=$?
    wait_pids 10 "$spid" || true
    if [[ "$rc" -ne 0 ]]; then
        warn "iperf3 $name failed (status $rc), see $OUT/iperf-$name.json"
    fi
    return 0
}

# run_mpi TAG: K timed MPI_Allreduce across the worker namespaces; the
# result goes to $OUT/TAG.result.json.
run_mpi() {
    local tag="$1" pid
    phase_snapshot "$tag" before
    log "[$LINK] OpenMPI MPI_Allreduce ($tag): $WORKERS ranks x $MIB MiB, 1 warm-up + $REPEATS timed"
    (
        cd "$OUT"
        run_mpirun "$PREFIX" "$WORKERS" "$HOSTFILE" "$RSH" "$MPI_TMP" "$MPI_BIN" "$ELEMENTS" "$REPEATS"
    ) >"$OUT/$tag.json" 2>"$OUT/$tag.log" &
    pid=$!
    BG_PIDS+=("$pid")
    if ! wait_pids "$TIMEOUT" "$pid"; then
        tail -n 20 "$OUT/$tag.log" >&2
        die "mpirun failed (status ${WAIT_RCS[0]}); see $OUT/$tag.log"
    fi
    phase_snapshot "$tag" after
    python3 "$REPO_ROOT/bench/harness/bench_report.py" peer "$OUT" "$tag" --output "$OUT/$tag.json" ||
        die "OpenMPI '$tag' gave no verified result (see above and $OUT/$tag.log)"
}

# run_gloo TAG: K timed gloo all-reduces (bench/gloo_allreduce.py, one rank
# per worker namespace, TCP on eth0); the result goes to $OUT/TAG.result.json.
run_gloo() {
    local tag="$1" r
    local -a pids=()
    phase_snapshot "$tag" before
    log "[$LINK] gloo all-reduce ($tag): $WORKERS ranks x $MIB MiB, 1 warm-up + $REPEATS timed"
    for ((r = 0; r < WORKERS; r++)); do
        ip netns exec "$PREFIX-w$r" env RANK="$r" WORLD_SIZE="$WORKERS" \
            MASTER_ADDR="$(tb worker_0_addr)" MASTER_PORT="$GLOO_PORT" \
            GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
            "$VENV_PYTHON" "$REPO_ROOT/bench/gloo_allreduce.py" "$ELEMENTS" "$REPEATS" \
            >"$OUT/$tag-rank$r.out" 2>"$OUT/$tag-rank$r.log" &
        pids+=("$!")
        BG_PIDS+=("$!")
    done
    if ! wait_pids "$TIMEOUT" "${pids[@]}"; then
        for ((r = 0; r < WORKERS; r++)); do
            echo "rank $r: status ${WAIT_RCS[r]}; $(tail -n 3 "$OUT/$tag-rank$r.log")" >&2
        done
        die "gloo all-reduce '$tag' failed; see $OUT"
    fi
    phase_snapshot "$tag" after
    python3 "$REPO_ROOT/bench/harness/bench_report.py" peer "$OUT" "$tag" --output "$OUT/$tag-rank0.out" ||
        die "gloo '$tag' gave no verified result (see above and $OUT/$tag-rank0.log)"
}

start_bench_switchd() {
    start_switchd "$PREFIX-sw" "$SWITCHD" "$OUT/switchd.log" \
        run --config "$CFG" --stats-file "$OUT/switchd-stats.json"
}

stop_switchd() {
    stop_pid "$SWITCHD_PID"
    SWITCHD_PID=""
}

# run_workers ITERATIONS TAG: the 4 workers at once; each rank's JSON into
# $OUT/TAG-rankR.json.
run_workers() {
    local iters="$1" tag="$2" r
    local -a pids=()
    for ((r = 0; r < WORKERS; r++)); do
        AGGSWITCH_SECRET="$SECRET" ip netns exec "$PREFIX-w$r" "$WORKER" allreduce \
            --switch "$SWITCH_ADDR" --job "$JOB_ID" --rank "$r" --workers "$WORKERS" \
            --elements "$ELEMENTS" --iterations "$iters" --json \
            >"$OUT/$tag-rank$r.json" 2>"$OUT/$tag-rank$r.log" &
        pids+=("$!")
        BG_PIDS+=("$!")
    done
    if ! wait_pids "$TIMEOUT" "${pids[@]}"; then
        for ((r = 0; r < WORKERS; r++)); do
            echo "rank $r: status ${WAIT_RCS[r]}; $(tail -n 3 "$OUT/$tag-rank$r.log")" >&2
        done
        die "switch all-reduce '$tag' failed; see $OUT"
    fi
}

# run_switch: one K-iteration run and K single runs; bench/harness/bench_report.py
# takes the slowest rank of each, the shapers and the CPU into
# $OUT/switch.raw.json and their statistics into $OUT/switch.result.json.
run_switch() {
    local k
    log "[$LINK] switch: $WORKERS workers x $MIB MiB, $REPEATS iterations in one run, then $REPEATS single runs"
    start_bench_switchd
    phase_snapshot switch before
    run_workers "$REPEATS" multi
    for ((k = 0; k < REPEATS; k++)); do
        run_workers 1 "single$k"
    done
    phase_snapshot switch after
    stop_switchd
    python3 "$REPO_ROOT/bench/harness/bench_report.py" switch "$OUT" --repeats "$REPEATS" \
        --elements "$ELEMENTS" --workers "$WORKERS" || die "bench/harness/bench_report.py switch failed on $OUT"
}

# measure LINK: everything for one link setting into $OUT (bench/harness/bench_report.py
# reads it).
measure() {
    LINK="$1"
    OUT="$RUN/$LINK"
    mkdir -p "$OUT"
    cp /proc/loadavg "$OUT/loadavg-start.txt"
    log "[$LINK] iperf3 (TCP, $IPERF_SECS s each): worker->switch, switch->worker, worker->worker"
    iperf up "$PREFIX-sw" "$SWITCH_ADDR" "$PREFIX-w0"
    iperf down "$PREFIX-sw" "$SWITCH_ADDR" "$PREFIX-w0" -R
    iperf w2w "$PREFIX-w1" "$(tb worker_1_addr)" "$PREFIX-w0"
    run_mpi mpi
    set_worker_tx "$PREFIX" "$WORKERS" on
    run_mpi mpi_tso
    # gloo at its best: TCP with segmentation offload, as on a real NIC.
    [[ "$GLOO" -eq 1 ]] && run_gloo gloo
    set_worker_tx "$PREFIX" "$WORKERS" off
    run_switch
    cp /proc/loadavg "$OUT/loadavg-end.txt"
}

# busy_machine: true when the 1-min load average is above half the cores.
busy_machine() {
    awk -v l="$(loadavg)" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'
}
if ((WAIT_IDLE > 0)) && busy_machine; then
    log "waiting up to $WAIT_IDLE s for the 1-min load average ($(loadavg)) to fall below $(nproc)/2"
    idle_deadline=$((SECONDS + WAIT_IDLE))
    while busy_machine && ((SECONDS < idle_deadline)); do
        sleep 5
    done
fi

log "run $STAMP: $WORKERS workers, $MIB MiB ($ELEMENTS float32), $REPEATS repeats; logs in $RUN"
LOAD_START="$(loadavg)"
if busy_machine; then
    warn "1-min load average is $LOAD_START on $(nproc) cores before starting: other work shares the CPUs, expect noisy times"
fi
if [[ "$CORES_ONLY" -eq 0 ]]; then
    measure unlimited
    shape_links
    measure 1gbit
fi

# --- threads: the switch's all-reduce with each dataplane thread count ------------------
# On unlimited links (the testbed remade, without the shapers): for each T,
# a testbed of T queues per veth and switchd at queues = dataplane_threads =
# T (header, step 3b), then run_switch as above. `ethtool -S` of every
# switch port afterwards has the frames each queue, and so each thread,
# received.
THREADS_DIR="$RUN/threads"
run_threads() {
    local t i
    mkdir -p "$THREADS_DIR"
    for t in "${THREADS[@]}"; do
        stop_testbed_processes "$PREFIX" "$WORKERS"
        testbed_up "$THREADS_DIR/testbed-t$t.env" --prefix "$PREFIX" --workers "$WORKERS" \
            --mtu "$MTU" --queues "$t" --queue-per-worker 2>"$THREADS_DIR/testbed-t$t.log"
        SWITCH_ADDR="$(tb switch_addr)"
        CFG="$THREADS_DIR/switchd-t$t.toml"
        write_testbed_switchd_config "$CFG" "scripts/bench.sh, $t thread(s)" \
            "$WORKERS" "$SECRET" "queues = $t" "dataplane_threads = $t"
        LINK="unlimited, $t thread(s)"
        OUT="$THREADS_DIR/t$t"
        mkdir -p "$OUT"
        run_switch
        for ((i = 0; i < WORKERS; i++)); do
            ip netns exec "$PREFIX-sw" ethtool -S "sw-w$i" >"$OUT/ethtool-sw-w$i.txt" ||
                warn "ethtool -S sw-w$i failed; frames per queue unknown"
        done
    done
    python3 "$REPO_ROOT/bench/harness/bench_threads_report.py" "$THREADS_DIR" "$THREADS_ARG" \
        "$THREADS_DIR/threads.json" >"$RUN/threads-table.md" ||
        die "bench/harness/bench_threads_report.py failed"
}
run_threads

if [[ "$CORES_ONLY" -eq 1 ]]; then
    OUT_JSON="$REPO_ROOT/results/bench-cores-$STAMP.json"
    python3 "$REPO_ROOT/bench/harness/bench_report.py" cores-only --json "$OUT_JSON" --stamp "$STAMP" \
        --repo "$REPO_ROOT" --rates "$RATES/rates.json" --threads-json "$THREADS_DIR/threads.json" \
        --mib "$MIB" --repeats "$REPEATS" --workers "$WORKERS" --mtu "$MTU" --load-start "$LOAD_START" ||
        die "bench/harness/bench_report.py cores-only failed; the raw results are in $RUN"
    echo
    echo "=== bench $STAMP (cores only): $WORKERS workers, $MIB MiB float32, $(nproc) cores ==="
    echo "switch all-reduce, unlimited links, by dataplane threads:"
    cat "$RUN/threads-table.md"
    echo
    echo "packet rates:"
    cat "$RUN/rates-table.md"
    log "wrote $OUT_JSON (logs in $RUN)"
    exit 0
fi
# --- per-byte efficiency (its own testbed, prefix "eff") ------------------------------
if [[ "$DO_EFFICIENCY" -eq 1 ]]; then
    eff_args=(--mib "$MIB" --repeats "$REPEATS" --json "$RUN/efficiency.json" --png "$RUN/efficiency.png")
    [[ "$QUICK" -eq 1 ]] && eff_args+=(--quick)
    [[ "$DOCS" -eq 1 ]] || eff_args+=(--no-docs)
    log "per-byte efficiency (scripts/bench efficiency ${eff_args[*]})"
    "$REPO_ROOT/scripts/bench" efficiency "${eff_args[@]}" >"$RUN/efficiency.log" 2>&1 ||
        { tail -n 30 "$RUN/efficiency.log" >&2; die "scripts/bench efficiency failed; see $RUN/efficiency.log"; }
    sed -n '/^| MTU/,$p' "$RUN/efficiency.log" >"$RUN/efficiency-table.md"
fi

# --- report -------------------------------------------------------------------------
OUT_JSON="$REPO_ROOT/results/bench-$STAMP.json"
TABLE="$RUN/table.md"
report_args=(report "$RUN" --json "$OUT_JSON" --table "$TABLE" --stamp "$STAMP"
    --repo "$REPO_ROOT" --mib "$MIB" --repeats "$REPEATS" --workers "$WORKERS" --mtu "$MTU"
    --rate-bps "$RATE_BPS" --load-start "$LOAD_START"
    --openmpi-version "$(mpirun --version 2>/dev/null | head -n 1)")
[[ "$QUICK" -eq 1 ]] && report_args+=(--quick)
[[ "$DO_RATES" -eq 1 ]] && report_args+=(--rates)
python3 "$REPO_ROOT/bench/harness/bench_report.py" "${report_args[@]}" ||
    die "bench/harness/bench_report.py failed; the raw results are in $RUN"
echo
echo "=== bench $STAMP: $WORKERS workers, $MIB MiB float32 all-reduce, $REPEATS repeats, MTU $MTU ==="
cat "$TABLE"
echo
echo "switch all-reduce, unlimited links, by dataplane threads (under \"threads\" in the JSON):"
cat "$RUN/threads-table.md"
if [[ "$DO_RATES" -eq 1 ]]; then
    echo
    echo "packet rates (see above; also under \"rates\" in the JSON):"
    cat "$RUN/rates-table.md"
fi
if [[ -s "$RUN/efficiency-table.md" ]]; then
    echo
    echo "per-byte efficiency (scripts/bench efficiency; under \"efficiency\" in the JSON, every run in bench/results/bench-efficiency.json):"
    cat "$RUN/efficiency-table.md"
fi
if [[ -s "$RUN/per-packet-table.md" ]]; then
    echo
    echo "per-packet cost, in memory (criterion medians; also under \"per_packet\" in the JSON; goal engine / copy <= 1.5):"
    cat "$RUN/per-packet-table.md"
fi
echo

if [[ "$MTU" -eq 1500 ]]; then
    plot_and_publish "$OUT_JSON" "$RUN/bench.png" bench
else
    plot_and_publish "$OUT_JSON" "$RUN/bench.png" "bench-mtu$MTU"
fi
