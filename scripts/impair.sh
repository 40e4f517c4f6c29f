#!/usr/bin/env bash
#
# impair.sh: impair what a testbed interface sends (or receives) with loss,
# duplication, reordering, a rate limit and ECN marking, using
# tests/impair/impair.bpf.c (tc cls_bpf) and HTB. It stands in for netem and
# RED-ECN, which kernels built without CONFIG_NET_SCH_NETEM /
# CONFIG_NET_SCH_RED (like this project's CI kernel) lack.
#
# Usage:
#   scripts/impair.sh NS DEV [--ingress] [--udp-port PORT] [--loss PCT]
#                           [--dup PCT] [--reorder PCT [--reorder-rate MBIT]]
#                           [--rate MBIT [--ecn-threshold BYTES]]
#   scripts/impair.sh NS DEV --stats [--ingress]
#   scripts/impair.sh NS DEV --clear
#
#   --loss PCT        drop PCT % of the packets (random, independent)
#   --dup PCT         send PCT % of them twice
#   --reorder PCT     delay PCT % of them behind the rest (a slower HTB class,
#                     --reorder-rate MBIT, default 200), so they arrive late
#   --rate MBIT       shape the interface to MBIT with HTB (default: none)
#   --ecn-threshold B with --rate: mark CE on ECN-capable packets while a
#                     phantom queue drained at --rate holds more than B bytes
#   --udp-port PORT   impair only UDP over IPv4 from or to PORT (default:
#                     every IPv4 packet; ARP and IPv6 always pass)
#   --ingress         impair what DEV receives instead (no --rate). Use it on
#                     a worker's eth0 to hit what the switch sends: switchd's
#                     AF_XDP transmit skips the egress hooks and qdisc of the
#                     switch's ports. --reorder then sends the delayed share
#                     through ifb-DEV, an ifb whose HTB class hands it back.
#   --stats           print what the filter on DEV's egress (or --ingress)
#                     did so far, one line:
#                       dropped=N duplicated=N delayed=N seen=N marked=N
#                     (seen: packets matched). Needs bpftool and jq.
#   --clear           remove everything impair.sh put on DEV
#
# Each run replaces the earlier filter of its hook (egress or ingress); the
# other hook's stays. NS is a network namespace (the testbed's), DEV an
# interface in it. Needs root, clang and libbpf-dev (scripts/setup.sh
# installs them, and bpftool and jq), iproute2.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -ge 2 ]] || { usage >&2; exit 2; }
NS="$1"
DEV="$2"
shift 2
LOSS=0 DUP=0 REORDER=0 RATE="" REORDER_RATE=200 ECN_THRESH="" CLEAR=0 INGRESS=0
UDP_PORT=0 STATS=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --loss|--dup|--reorder|--reorder-rate|--rate|--ecn-threshold|--udp-port)
            [[ $# -ge 2 ]] || die "$1 needs a value (see --help)" ;;
    esac
    case "$1" in
        --loss) LOSS="$2"; shift 2 ;;
        --dup) DUP="$2"; shift 2 ;;
        --reorder) REORDER="$2"; shift 2 ;;
        --reorder-rate) REORDER_RATE="$2"; shift 2 ;;
        --rate) RATE="$2"; shift 2 ;;
        --ecn-threshold) ECN_THRESH="$2"; shift 2 ;;
        --udp-port) UDP_PORT="$2"; shift 2 ;;
        --clear) CLEAR=1; shift ;;
        --ingress) INGRESS=1; shift ;;
        --stats) STATS=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
require_root "$NS" "$DEV"
netns_exists "$NS" || die "no network namespace $NS"

tcq() { ip netns exec "$NS" tc "$@"; }

HOOK=egress
[[ "$INGRESS" -eq 0 ]] || HOOK=ingress
# The ifb that delays the reordered share of what DEV receives (≤ 15 chars).
IFB="ifb-${DEV:0:11}"

# Remove what an earlier run put there (absent is fine). The clsact qdisc
# holds both hooks.
if [[ "$CLEAR" -eq 1 ]]; then
    tcq qdisc del dev "$DEV" clsact 2>/dev/null || true
    tcq qdisc del dev "$DEV" root 2>/dev/null || true
    ip -n "$NS" link del "$IFB" 2>/dev/null || true
    exit 0
fi

# --stats: the `counts` map of the filter on HOOK (indices: enum count in
# impair.bpf.c).
if [[ "$STATS" -eq 1 ]]; then
    for tool in bpftool jq; do
        command -v "$tool" >/dev/null 2>&1 || die "--stats needs $tool (scripts/setup.sh installs it)"
    done
    PROG_ID="$(tcq filter show dev "$DEV" "$HOOK" |
        awk '{ for (k = 1; k < NF; k++) if ($k == "id") { print $(k + 1); exit } }')"
    [[ -n "$PROG_ID" ]] || die "no impair.sh filter on $NS/$DEV $HOOK"
    MAP_ID=""
    for id in $(bpftool -j prog show id "$PROG_ID" | jq -r '.map_ids[]?'); do
        if [[ "$(bpftool -j map show id "$id" | jq -r .name)" == counts ]]; then
            MAP_ID="$id"
            break
        fi
    done
    [[ -n "$MAP_ID" ]] || die "the filter on $NS/$DEV $HOOK (prog $PROG_ID) has no counts map: not impair.sh's?"
    # With BTF (clang -g) bpftool gives {"formatted": {"key": K, "value": V}}.
    bpftool -j map dump id "$MAP_ID" | jq -r '
        (map(.formatted // empty | {key: (.key | tostring), value}) | from_entries) as $c
        | "dropped=\($c["1"] // 0) duplicated=\($c["2"] // 0) delayed=\($c["3"] // 0)"
          + " seen=\($c["0"] // 0) marked=\($c["4"] // 0)"'
    exit 0
fi

ppm() {
    awk -v p="$1" 'BEGIN { if (p !~ /^[0-9]*\.?[0-9]+$/ || p > 100) exit 1; printf "%d", p * 10000 + 0.5 }' ||
        die "a percentage must be a number in 0..100, got '$1'"
}
LOSS_PPM="$(ppm "$LOSS")"
DUP_PPM="$(ppm "$DUP")"
REORDER_PPM="$(ppm "$REORDER")"
[[ -z "$RATE" ]] || uint_in_range "$RATE" 1 1000000 || die "--rate takes Mbit/s (1..1000000), got '$RATE'"
uint_in_range "$REORDER_RATE" 1 1000000 || die "--reorder-rate takes Mbit/s (1..1000000), got '$REORDER_RATE'"
uint_in_range "$UDP_PORT" 0 65535 || die "--udp-port takes a port number, got '$UDP_PORT'"
UDP_PORT=$((10#$UDP_PORT))
ECN_KBPS=0
if [[ -n "$ECN_THRESH" ]]; then
    [[ -n "$RATE" ]] || die "--ecn-threshold needs --rate (the phantom queue drains at that rate)"
    is_uint "$ECN_THRESH" || die "--ecn-threshold takes bytes, got '$ECN_THRESH'"
    ECN_KBPS=$((RATE * 1000))
fi
[[ "$INGRESS" -eq 0 || -z "$RATE" ]] || die "--rate shapes what DEV sends; it does not go with --ingress"

# htb_classes DEV DEFAULT: an HTB root with fast class 1:10 (--rate, else
# 100 Gbit/s) and slow class 1:20 (--reorder-rate), DEFAULT the default one.
htb_classes() {
    local dev="$1" fast="${RATE:-100000}mbit" slow="${REORDER_RATE}mbit"
    tcq qdisc add dev "$dev" root handle 1: htb default "$2"
    tcq class add dev "$dev" parent 1: classid 1:10 htb rate "$fast" ceil "$fast" quantum 60000
    tcq class add dev "$dev" parent 1: classid 1:20 htb rate "$slow" ceil "$slow" quantum 60000
    tcq qdisc add dev "$dev" parent 1:10 handle 10: pfifo limit 2000
    tcq qdisc add dev "$dev" parent 1:20 handle 20: pfifo limit 2000
}

tcq filter del dev "$DEV" "$HOOK" 2>/dev/null || true
IFB_IFINDEX=0
if [[ "$INGRESS" -eq 1 ]]; then
    ip -n "$NS" link del "$IFB" 2>/dev/null || true
    if [[ "$REORDER_PPM" -gt 0 ]]; then
        # Everything the program redirects here is the delayed share: it
        # takes slow class 1:20, then ifb hands it back to DEV's receive path
        # (past the ingress hook, so it is not impaired twice).
        ip -n "$NS" link add "$IFB" type ifb ||
            die "could not make an ifb device in $NS (kernel without CONFIG_IFB?)"
        ip -n "$NS" link set "$IFB" up txqueuelen 1000
        htb_classes "$IFB" 20
        IFB_IFINDEX="$(ip netns exec "$NS" cat "/sys/class/net/$IFB/ifindex")"
    fi
else
    tcq qdisc del dev "$DEV" root 2>/dev/null || true
    if [[ -n "$RATE" || "$REORDER_PPM" -gt 0 ]]; then
        htb_classes "$DEV" 10
    fi
fi

OBJ_DIR="$(mktemp -d /tmp/impair.XXXXXX)"
trap 'rm -rf "$OBJ_DIR"' EXIT
OBJ="$OBJ_DIR/impair.o"
"${CLANG:-clang}" -O2 -g -Wall -target bpf -I"/usr/include/$(uname -m)-linux-gnu" \
    -DLOSS_PPM="$LOSS_PPM" -DDUP_PPM="$DUP_PPM" -DREORDER_PPM="$REORDER_PPM" \
    -DECN_RATE_KBPS="$ECN_KBPS" -DECN_THRESH_BYTES="${ECN_THRESH:-30000}" -DINGRESS="$INGRESS" \
    -DIFB_IFINDEX="$IFB_IFINDEX" -DMATCH_UDP_PORT="$UDP_PORT" \
    -c "$REPO_ROOT/tests/impair/impair.bpf.c" -o "$OBJ" ||
    die "clang failed building tests/impair/impair.bpf.c (scripts/setup.sh installs clang and libbpf-dev)"

tcq qdisc add dev "$DEV" clsact 2>/dev/null || true
tcq filter add dev "$DEV" "$HOOK" bpf direct-action obj "$OBJ" sec tc
WHAT="IPv4"
[[ "$UDP_PORT" -eq 0 ]] || WHAT="UDP port $UDP_PORT"
log "$NS/$DEV $HOOK, $WHAT: loss ${LOSS}% dup ${DUP}% reorder ${REORDER}%${RATE:+ rate ${RATE} Mbit/s}${ECN_THRESH:+ ECN over ${ECN_THRESH} B}"
