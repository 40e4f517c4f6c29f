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
# The loss: `tc netem loss 1%` on each worker's eth0 (worker -> switch) and on
# an ifb that eth0's ingress is redirected to (switch -> worker). Not on the
# switch-side ports: switchd sends through AF_XDP, which bypasses their
# qdiscs. A kernel without sch_netem gets a small tc BPF program instead
# (built with clang) that drops 1 % of the aggregation frames each way.
#
# At the end it prints minutes, rounds, collectives verified (a job's
# all-reduce, checked by both its ranks), switchd's resident memory (VmRSS)
# after ready, after the first round and at the end, and the per-job counters
# from the stats file. Exits 0 only if every collective verified.
# Everything it starts is stopped by PID and the testbed removed on exit; the
# logs are kept on failure.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly PREFIX=soak
readonly WORKERS=6
readonly JOBS=3
readonly SWITCH_ADDR=198.18.0.1
readonly AGG_PORT=48879
readonly ELEMENTS=1000000
readonly ITERATIONS=5
readonly LOSS_PCT=1
readonly ROUND_TIMEOUT=300
readonly READY_TIMEOUT=30
readonly STOP_TIMEOUT=15

usage() {
    awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

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
for tool in ip tc jq; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found: run scripts/setup.sh (and apt-get install jq)"
done

# --- cleanup --------------------------------------------------------------------
WORK=""
TESTBED_MADE=0
SWITCHD_PID=""
WORKER_PIDS=()
PASSED=0

# stop_pid PID: SIGTERM, SIGKILL after STOP_TIMEOUT s; reaps PID (a child of
# this shell) and leaves its exit status in STOP_RC.
STOP_RC=0
stop_pid() {
    local pid="$1" i
    STOP_RC=0
    [[ -n "$pid" ]] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        warn "pid $pid ignored SIGTERM for $STOP_TIMEOUT s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || STOP_RC=$?
}

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
ensure_cargo_path
log "building (cargo build --release --workspace --bins)"
cargo build --release --workspace --bins
SWITCHD="$REPO_ROOT/target/release/switchd"
WORKER="$REPO_ROOT/target/release/worker"
[[ -x "$SWITCHD" ]] || die "$SWITCHD missing after the build"
[[ -x "$WORKER" ]] || die "$WORKER missing after the build"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/agg-soak.XXXXXX")"
CFG="$WORK/switchd.toml"
STATS="$WORK/stats.json"
SWITCHD_LOG="$WORK/switchd.log"

TESTBED_MADE=1
bash "$REPO_ROOT/scripts/testbed.sh" up --prefix "$PREFIX" --workers "$WORKERS"

# --- 1 % loss on every worker link --------------------------------------------------
in_ns() {
    local ns="$1"
    shift
    ip netns exec "$ns" "$@"
}

# netem_loss NS: netem on eth0 (egress) and on ifb0, which gets eth0's ingress.
netem_loss() {
    local ns="$1"
    in_ns "$ns" tc qdisc add dev eth0 root netem loss "$LOSS_PCT%"
    in_ns "$ns" ip link add ifb0 type ifb
    in_ns "$ns" ip link set ifb0 up
    in_ns "$ns" tc qdisc add dev ifb0 root netem loss "$LOSS_PCT%"
    in_ns "$ns" tc qdisc add dev eth0 handle ffff: ingress
    in_ns "$ns" tc filter add dev eth0 parent ffff: protocol ip u32 match u32 0 0 \
        action mirred egress redirect dev ifb0
}

# bpf_loss NS: the tc BPF program (built once into $WORK/loss.o) on eth0's
# egress and ingress.
bpf_loss() {
    local ns="$1" dir
    in_ns "$ns" tc qdisc add dev eth0 clsact
    for dir in egress ingress; do
        in_ns "$ns" tc filter add dev eth0 "$dir" bpf da obj "$WORK/loss.o" sec tc
    done
}

build_bpf_loss() {
    local multiarch
    multiarch="$(uname -m)-linux-gnu"
    command -v "${CLANG:-clang}" >/dev/null 2>&1 ||
        die "no sch_netem in this kernel and no clang for the BPF fallback: run scripts/setup.sh"
    cat >"$WORK/loss.c" <<EOF
// Drops LOSS_PPM per million UDP frames to or from the aggregation port;
// counts frames seen (0) and dropped (1).
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define AGG_PORT $AGG_PORT
#define LOSS_PPM $((LOSS_PCT * 10000))

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&counts, &i);
	if (v)
		__sync_fetch_and_add(v, 1);
}

SEC("tc")
int drop_some(struct __sk_buff *skb)
{
	bpf_skb_pull_data(skb, sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr));
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return TC_ACT_OK;
	struct udphdr *u = (void *)(ip + 1);
	if ((void *)(u + 1) > end)
		return TC_ACT_OK;
	if (u->dest != bpf_htons(AGG_PORT) && u->source != bpf_htons(AGG_PORT))
		return TC_ACT_OK;
	count(0);
	if (bpf_get_prandom_u32() % 1000000 < LOSS_PPM) {
		count(1);
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
EOF
    "${CLANG:-clang}" -O2 -g -Wall -target bpf "-I/usr/include/$multiarch" \
        -c "$WORK/loss.c" -o "$WORK/loss.o" ||
        die "clang could not build the BPF loss program (install clang and libbpf-dev)"
}

# bpf_loss_counts: "seen dropped" summed over every worker and direction.
bpf_loss_counts() {
    local i dir id map seen=0 dropped=0 vals kv
    for ((i = 0; i < WORKERS; i++)); do
        for dir in egress ingress; do
            id="$(in_ns "$PREFIX-w$i" tc filter show dev eth0 "$dir" |
                awk '{ for (k = 1; k < NF; k++) if ($k == "id") { print $(k + 1); exit } }')"
            [[ -n "$id" ]] || continue
            for map in $(bpftool -j prog show id "$id" | jq -r '.map_ids[]?'); do
                [[ "$(bpftool -j map show id "$map" | jq -r .name)" == counts ]] || continue
                # With BTF (clang -g) bpftool prints {"formatted": {"key": K, "value": V}}.
                vals="$(bpftool -j map dump id "$map" |
                    jq -r '.[] | .formatted // empty | "\(.key)=\(.value)"')"
                for kv in $vals; do
                    case "${kv%%=*}" in
                        0) seen=$((seen + ${kv#*=})) ;;
                        1) dropped=$((dropped + ${kv#*=})) ;;
                    esac
                done
            done
        done
    done
    echo "$seen $dropped"
}

LOSS_HOW=netem
if ! in_ns "$PREFIX-w0" tc qdisc add dev eth0 root netem loss 0% 2>/dev/null; then
    LOSS_HOW=bpf
    log "no sch_netem in this kernel: dropping frames with a tc BPF program instead"
    build_bpf_loss
else
    in_ns "$PREFIX-w0" tc qdisc del dev eth0 root
fi
for ((i = 0; i < WORKERS; i++)); do
    if [[ "$LOSS_HOW" == netem ]]; then
        netem_loss "$PREFIX-w$i"
    else
        bpf_loss "$PREFIX-w$i"
    fi
done
log "$LOSS_PCT % loss ($LOSS_HOW) on both directions of $PREFIX-w0..$PREFIX-w$((WORKERS - 1))"

# --- switchd ----------------------------------------------------------------------
SECRETS=()
{
    echo "# Written by scripts/soak.sh for testbed '$PREFIX'."
    echo "[switch]"
    ports=()
    for ((i = 0; i < WORKERS; i++)); do ports+=("\"sw-w$i\""); done
    ports_toml="$(printf '%s, ' "${ports[@]}")"
    echo "ports = [${ports_toml%, }]"
    echo "addresses = [\"$SWITCH_ADDR\"]"
    echo "agg_port = $AGG_PORT"
    echo "summary_interval_secs = 5"
    for ((j = 1; j <= JOBS; j++)); do
        secret="$(od -An -v -tx1 -N32 /dev/urandom | tr -d ' \n')"
        [[ "${#secret}" -eq 64 ]] || die "could not make a secret from /dev/urandom"
        SECRETS[j]="$secret"
        a=$((10 + 2 * (j - 1)))
        echo
        echo "[[job]]"
        echo "id = $j"
        echo "n_workers = 2"
        echo "allowed_sources = [\"198.18.0.$a/32\", \"198.18.0.$((a + 1))/32\"]"
        echo "secret = \"$secret\""
    done
} >"$CFG"
"$SWITCHD" check-config --config "$CFG" >/dev/null || die "switchd refused $CFG"

log "starting switchd in $PREFIX-sw (log: $SWITCHD_LOG)"
ip netns exec "$PREFIX-sw" "$SWITCHD" run --config "$CFG" --stats-file "$STATS" \
    >"$SWITCHD_LOG" 2>&1 &
SWITCHD_PID=$!
deadline=$((SECONDS + READY_TIMEOUT))
until grep -qF "switchd ready" "$SWITCHD_LOG" 2>/dev/null; do
    if ! kill -0 "$SWITCHD_PID" 2>/dev/null; then
        rc=0
        wait "$SWITCHD_PID" || rc=$?
        SWITCHD_PID=""
        cat "$SWITCHD_LOG" >&2
        die "switchd exited with status $rc before it was ready"
    fi
    ((SECONDS < deadline)) || { cat "$SWITCHD_LOG" >&2; die "switchd not ready in $READY_TIMEOUT s"; }
    sleep 0.1
done

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
        ip netns exec "$PREFIX-w$i" "$WORKER" allreduce \
            --switch "$SWITCH_ADDR" --job "$j" --rank "$((i % 2))" --workers 2 \
            --secret "${SECRETS[j]}" --elements "$ELEMENTS" --iterations "$ITERATIONS" \
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

LOSS_COUNTS=""
if [[ "$LOSS_HOW" == bpf ]] && command -v bpftool >/dev/null 2>&1; then
    read -r seen dropped < <(bpf_loss_counts || true) || true
    LOSS_COUNTS=" ($dropped of $seen aggregation frames dropped)"
fi

log "stopping switchd (SIGTERM to pid $SWITCHD_PID)"
stop_pid "$SWITCHD_PID"
SWITCHD_RC=$STOP_RC
SWITCHD_PID=""

# --- summary ----------------------------------------------------------------------
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
echo
echo "=== soak: $MINUTES min requested, $((ELAPSED / 60)) min $((ELAPSED % 60)) s run ==="
echo "loss:                 $LOSS_PCT % each way on every worker link, $LOSS_HOW$LOSS_COUNTS"
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
PASSED=1
echo "SOAK PASSED"
