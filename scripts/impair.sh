#!/usr/bin/env bash
#
# impair.sh: impair the egress of a testbed interface with loss, duplication,
# reordering, a rate limit and ECN marking, using tests/impair/impair.bpf.c
# (tc cls_bpf) and HTB. It stands in for netem and RED-ECN, which kernels
# built without CONFIG_NET_SCH_NETEM / CONFIG_NET_SCH_RED (like this
# project's CI kernel) lack.
#
# Usage:
#   scripts/impair.sh NS DEV [--loss PCT] [--dup PCT] [--reorder PCT]
#                           [--rate MBIT] [--ecn-threshold BYTES]
#   scripts/impair.sh NS DEV --clear
#
#   --loss PCT        drop PCT % of IPv4 packets (random, independent)
#   --dup PCT         send PCT % of them twice
#   --reorder PCT     delay PCT % of them behind the rest (a slower HTB class,
#                     --reorder-rate MBIT, default 200), so they arrive late
#   --rate MBIT       shape the interface to MBIT with HTB (default: none)
#   --ecn-threshold B with --rate: mark CE on ECN-capable packets while a
#                     phantom queue drained at --rate holds more than B bytes
#   --ingress         impair what DEV receives instead (loss and duplication
#                     only). Use it on a worker's eth0 to hit what the switch
#                     sends: switchd's AF_XDP transmit skips the egress hooks
#                     and qdisc of the switch's ports.
#
# NS is a network namespace (the testbed's), DEV an interface in it. Needs
# root, clang and libbpf-dev (scripts/setup.sh installs them), iproute2.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

[[ $# -ge 2 ]] || { usage >&2; exit 2; }
NS="$1"
DEV="$2"
shift 2
LOSS=0 DUP=0 REORDER=0 RATE="" REORDER_RATE=200 ECN_THRESH="" CLEAR=0 INGRESS=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --loss) LOSS="$2"; shift 2 ;;
        --dup) DUP="$2"; shift 2 ;;
        --reorder) REORDER="$2"; shift 2 ;;
        --reorder-rate) REORDER_RATE="$2"; shift 2 ;;
        --rate) RATE="$2"; shift 2 ;;
        --ecn-threshold) ECN_THRESH="$2"; shift 2 ;;
        --clear) CLEAR=1; shift ;;
        --ingress) INGRESS=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
require_root "$NS" "$DEV"
netns_exists "$NS" || die "no network namespace $NS"

tcq() { ip netns exec "$NS" tc "$@"; }

# Remove what an earlier run put there (absent is fine). The clsact qdisc
# holds both hooks, so an ingress run keeps an egress filter and vice versa.
if [[ "$CLEAR" -eq 1 ]]; then
    tcq qdisc del dev "$DEV" clsact 2>/dev/null || true
    tcq qdisc del dev "$DEV" root 2>/dev/null || true
    exit 0
fi
HOOK=egress
if [[ "$INGRESS" -eq 1 ]]; then
    HOOK=ingress
    [[ "$REORDER" == 0 && -z "$RATE" ]] ||
        die "--ingress supports --loss and --dup only (reordering and rates need a qdisc)"
else
    tcq qdisc del dev "$DEV" root 2>/dev/null || true
fi
tcq filter del dev "$DEV" "$HOOK" 2>/dev/null || true

ppm() {
    awk -v p="$1" 'BEGIN { if (p !~ /^[0-9]*\.?[0-9]+$/ || p > 100) exit 1; printf "%d", p * 10000 }' ||
        die "a percentage must be a number in 0..100, got '$1'"
}
LOSS_PPM="$(ppm "$LOSS")"
DUP_PPM="$(ppm "$DUP")"
REORDER_PPM="$(ppm "$REORDER")"
ECN_KBPS=0
if [[ -n "$ECN_THRESH" ]]; then
    [[ -n "$RATE" ]] || die "--ecn-threshold needs --rate (the phantom queue drains at that rate)"
    is_uint "$ECN_THRESH" || die "--ecn-threshold takes bytes, got '$ECN_THRESH'"
    ECN_KBPS=$((RATE * 1000))
fi
[[ -z "$RATE" ]] || is_uint "$RATE" || die "--rate takes Mbit/s, got '$RATE'"

OBJ_DIR="$(mktemp -d /tmp/impair.XXXXXX)"
trap 'rm -rf "$OBJ_DIR"' EXIT
OBJ="$OBJ_DIR/impair.o"
clang -O2 -g -target bpf -I"/usr/include/$(uname -m)-linux-gnu" \
    -DLOSS_PPM="$LOSS_PPM" -DDUP_PPM="$DUP_PPM" -DREORDER_PPM="$REORDER_PPM" \
    -DECN_RATE_KBPS="$ECN_KBPS" -DECN_THRESH_BYTES="${ECN_THRESH:-30000}" -DINGRESS="$INGRESS" \
    -c "$REPO_ROOT/tests/impair/impair.bpf.c" -o "$OBJ" ||
    die "clang failed building tests/impair/impair.bpf.c (scripts/setup.sh installs clang and libbpf-dev)"

if [[ -n "$RATE" || "$REORDER_PPM" -gt 0 ]]; then
    FAST="${RATE:-100000}mbit"
    tcq qdisc add dev "$DEV" root handle 1: htb default 10
    tcq class add dev "$DEV" parent 1: classid 1:10 htb rate "$FAST" ceil "$FAST"
    tcq class add dev "$DEV" parent 1: classid 1:20 htb rate "${REORDER_RATE}mbit" ceil "${REORDER_RATE}mbit"
    tcq qdisc add dev "$DEV" parent 1:10 handle 10: pfifo limit 2000
    tcq qdisc add dev "$DEV" parent 1:20 handle 20: pfifo limit 2000
fi
tcq qdisc add dev "$DEV" clsact 2>/dev/null || true
tcq filter add dev "$DEV" "$HOOK" bpf direct-action obj "$OBJ" sec tc
log "$NS/$DEV $HOOK: loss ${LOSS}% dup ${DUP}% reorder ${REORDER}%${RATE:+ rate ${RATE} Mbit/s}${ECN_THRESH:+ ECN over ${ECN_THRESH} B}"
