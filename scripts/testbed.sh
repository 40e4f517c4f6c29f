#!/usr/bin/env bash
#
# testbed.sh: make or remove a veth/netns testbed for the aggregation switch.
#
# Usage:
#   scripts/testbed.sh up --workers N [--hosts M] [--prefix P] [--queues Q]
#                         [--mtu BYTES] [--print-env]
#   scripts/testbed.sh down [--prefix P]
#   scripts/testbed.sh --help
#
# `up` makes these network namespaces (P defaults to "agg"):
#   P-sw          the switch: Linux bridge br0 (198.18.0.1/24, STP off,
#                 forward delay 0) enslaving one port per worker and host
#   P-wI          worker I (0 <= I < N):  eth0 198.18.0.(10+I)/24, its peer
#                 in P-sw is sw-wI
#   P-hJ          plain host J (0 <= J < M): eth0 198.18.0.(100+J)/24, its
#                 peer in P-sw is sw-hJ
# 198.18.0.0/15 is the RFC 2544 benchmarking range; it is only used inside
# these namespaces. N is 1..90, M is 0..155 (default 0), Q (default 1) sets
# numrxqueues/numtxqueues of every veth. IPv6 is disabled in every namespace,
# lo is up everywhere, and eth0 has GRO on (needed by XDP redirects into a
# veth, see DESIGN.md) and transmit checksum offload off, so that frames on
# the wire carry complete UDP/TCP checksums as from a real NIC (an AF_XDP
# reader sees the frame's bytes as they are; with offload on, it would see
# only a partial pseudo-header sum), and transmit VLAN offload off (a tag
# stays in the frame, where the XDP fast path sees it; switchd refuses the
# fast path from a veth whose peer has it on).
#
# `up` first removes a testbed with the same prefix. It prints a summary; with
# --print-env it prints the testbed as key=value lines on stdout instead (the
# summary then goes to stderr).
#
# `down` deletes every namespace named P-sw, P-wI, P-hJ and succeeds when there
# is none. It never kills processes; it warns about any still inside.
#
# Needs root, iproute2 and (optionally) ethtool.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly SUBNET_BASE="198.18.0"
readonly SUBNET_LEN=24
readonly SWITCH_ADDR="$SUBNET_BASE.1"
readonly WORKER_BASE=10   # worker I: .10+I, at most .99
readonly HOST_BASE=100    # host J: .100+J, at most .254
readonly MAX_WORKERS=$((99 - WORKER_BASE + 1))
readonly MAX_HOSTS=$((254 - HOST_BASE + 1))
readonly BRIDGE=br0
readonly SHORT_USAGE="usage: testbed.sh up --workers N [--hosts M] [--prefix P] [--queues Q] | down [--prefix P] (see --help)"

usage() {
    awk 'NR < 3 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

# ---------------------------------------------------------------------------
# Names

# is_testbed_ns PREFIX NAME: true when NAME is PREFIX-sw, PREFIX-wI or PREFIX-hJ.
is_testbed_ns() {
    local prefix="$1" name="$2" rest kind
    [[ "$name" == "$prefix-sw" ]] && return 0
    for kind in w h; do
        if [[ "$name" == "$prefix-$kind"* ]]; then
            rest="${name#"$prefix-$kind"}"
            is_uint "$rest" && return 0
        fi
    done
    return 1
}

# testbed_namespaces PREFIX: print the testbed's existing namespaces, one a line.
testbed_namespaces() {
    local prefix="$1" name _rest
    while read -r name _rest; do
        [[ -n "$name" ]] || continue
        if is_testbed_ns "$prefix" "$name"; then
            printf '%s\n' "$name"
        fi
    done < <(ip netns list 2>/dev/null)
}

# ---------------------------------------------------------------------------
# down

teardown() {
    local prefix="$1" ns pids n=0
    while read -r ns; do
        [[ -n "$ns" ]] || continue
        pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ' || true)"
        if [[ -n "${pids// /}" ]]; then
            warn "processes still in $ns (pids: ${pids% }); the namespace lives on unnamed until they exit"
        fi
        ip netns del "$ns" || die "could not delete namespace $ns"
        n=$((n + 1))
    done < <(testbed_namespaces "$prefix")
    echo "$n"
}

cmd_down() {
    local prefix="agg"
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --prefix) [[ $# -ge 2 ]] || die "--prefix needs a value"; prefix="$2"; shift 2 ;;
            --prefix=*) prefix="${1#*=}"; shift ;;
            -h|--help) usage; exit 0 ;;
            *) die "down: unknown argument '$1' (see --help)" ;;
        esac
    done
    check_prefix "$prefix"
    require_root down --prefix "$prefix"
    take_lock "$prefix"
    local n
    n="$(teardown "$prefix")"
    if [[ "$n" -eq 0 ]]; then
        log "testbed '$prefix': nothing to remove"
    else
        log "testbed '$prefix': removed $n namespaces"
    fi
}

# ---------------------------------------------------------------------------
# up

check_prefix() {
    [[ "$1" =~ ^[A-Za-z0-9_]([A-Za-z0-9_-]{0,30})$ ]] ||
        die "bad prefix '$1': use 1-31 characters of [A-Za-z0-9_-], starting with a letter, digit or _"
}

# take_lock PREFIX: serialise up/down of one prefix between processes.
take_lock() {
    local dir=/run/lock
    [[ -d "$dir" ]] || dir=/tmp
    exec {LOCK_FD}>"$dir/agg-testbed-$1.lock"
    if command -v flock >/dev/null 2>&1; then
        flock -w 60 "$LOCK_FD" || die "another testbed.sh holds the lock for prefix '$1'"
    fi
}

# in_ns NS CMD...: run CMD inside namespace NS.
in_ns() {
    local ns="$1"
    shift
    ip netns exec "$ns" "$@"
}

# quiet_sysctls NS: disable IPv6 (for devices made from now on, too).
quiet_sysctls() {
    in_ns "$1" sysctl -q -w \
        net.ipv6.conf.all.disable_ipv6=1 \
        net.ipv6.conf.default.disable_ipv6=1 >/dev/null
}

# add_port SWNS HOSTNS PORTNAME ADDR QUEUES MTU: a veth pair, PORTNAME in the
# switch namespace enslaved to the bridge, eth0 with ADDR in HOSTNS.
add_port() {
    local swns="$1" ns="$2" port="$3" addr="$4" queues="$5" mtu="$6"
    ip -n "$swns" link add "$port" mtu "$mtu" \
        numrxqueues "$queues" numtxqueues "$queues" \
        type veth peer name eth0 netns "$ns" mtu "$mtu" \
        numrxqueues "$queues" numtxqueues "$queues"
    ip -n "$swns" link set "$port" master "$BRIDGE"
    ip -n "$swns" link set "$port" up
    ip -n "$ns" addr add "$addr/$SUBNET_LEN" dev eth0
    ip -n "$ns" link set eth0 up
    if command -v ethtool >/dev/null 2>&1; then
        # GRO on the receiving side lets XDP_REDIRECT into this veth work.
        in_ns "$ns" ethtool -K eth0 gro on >/dev/null 2>&1 || true
        # Complete checksums in the frames, as a NIC would put on the wire.
        in_ns "$ns" ethtool -K eth0 tx off >/dev/null 2>&1 || true
        # VLAN tags in the frames' bytes, never in skb metadata, so that the
        # XDP program on the switch port can see them: switchd gives the
        # fast path only to veth ports whose peer has these off.
        in_ns "$ns" ethtool -K eth0 txvlan off tx-vlan-stag-hw-insert off >/dev/null 2>&1 || true
    fi
}

mac_of() {
    ip -n "$1" -br link show dev "$2" 2>/dev/null | awk '{print $3}'
}

UP_PREFIX=""
UP_DONE=0
on_exit() {
    local rc=$?
    if [[ -n "$UP_PREFIX" && "$UP_DONE" -ne 1 ]]; then
        warn "testbed '$UP_PREFIX' not completed; removing what was made"
        teardown "$UP_PREFIX" >/dev/null || true
    fi
    exit "$rc"
}

cmd_up() {
    local prefix="agg" workers="" hosts=0 queues=1 mtu=1500 print_env=0
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --workers|--hosts|--prefix|--queues|--mtu)
                [[ $# -ge 2 ]] || die "$1 needs a value"
                case "$1" in
                    --workers) workers="$2" ;;
                    --hosts) hosts="$2" ;;
                    --prefix) prefix="$2" ;;
                    --queues) queues="$2" ;;
                    --mtu) mtu="$2" ;;
                esac
                shift 2 ;;
            --workers=*) workers="${1#*=}"; shift ;;
            --hosts=*) hosts="${1#*=}"; shift ;;
            --prefix=*) prefix="${1#*=}"; shift ;;
            --queues=*) queues="${1#*=}"; shift ;;
            --mtu=*) mtu="${1#*=}"; shift ;;
            --print-env) print_env=1; shift ;;
            -h|--help) usage; exit 0 ;;
            *) die "up: unknown argument '$1' (see --help)" ;;
        esac
    done
    [[ -n "$workers" ]] || die "up: --workers N is required"
    uint_in_range "$workers" 1 "$MAX_WORKERS" ||
        die "--workers must be 1..$MAX_WORKERS (worker I gets $SUBNET_BASE.$WORKER_BASE+I), got '$workers'"
    uint_in_range "$hosts" 0 "$MAX_HOSTS" ||
        die "--hosts must be 0..$MAX_HOSTS (host J gets $SUBNET_BASE.$HOST_BASE+J), got '$hosts'"
    uint_in_range "$queues" 1 256 ||
        die "--queues must be 1..256, got '$queues'"
    uint_in_range "$mtu" 68 65535 ||
        die "--mtu must be 68..65535, got '$mtu'"
    workers=$((10#$workers)); hosts=$((10#$hosts)); queues=$((10#$queues)); mtu=$((10#$mtu))
    check_prefix "$prefix"
    require_root up --workers "$workers" --hosts "$hosts" --prefix "$prefix"
    command -v ip >/dev/null 2>&1 || die "ip (iproute2) not found: run scripts/setup.sh"

    take_lock "$prefix"
    local removed
    removed="$(teardown "$prefix")"
    [[ "$removed" -eq 0 ]] || log "removed the earlier testbed '$prefix' ($removed namespaces)"

    UP_PREFIX="$prefix"
    trap on_exit EXIT

    local swns="$prefix-sw" i ns
    local -a wns=() hns=()
    for ((i = 0; i < workers; i++)); do wns+=("$prefix-w$i"); done
    for ((i = 0; i < hosts; i++)); do hns+=("$prefix-h$i"); done

    # Namespaces first, with IPv6 off before any device exists in them.
    for ns in "$swns" "${wns[@]}" "${hns[@]}"; do
        ip netns add "$ns"
        quiet_sysctls "$ns"
        ip -n "$ns" link set lo up
    done

    # The switch: a plain learning bridge, forwarding at once.
    ip -n "$swns" link add "$BRIDGE" type bridge \
        forward_delay 0 stp_state 0 ageing_time 30000
    ip -n "$swns" link set "$BRIDGE" mtu "$mtu" 2>/dev/null || true
    ip -n "$swns" addr add "$SWITCH_ADDR/$SUBNET_LEN" dev "$BRIDGE"
    ip -n "$swns" link set "$BRIDGE" up

    for ((i = 0; i < workers; i++)); do
        add_port "$swns" "${wns[i]}" "sw-w$i" "$SUBNET_BASE.$((WORKER_BASE + i))" "$queues" "$mtu"
    done
    for ((i = 0; i < hosts; i++)); do
        add_port "$swns" "${hns[i]}" "sw-h$i" "$SUBNET_BASE.$((HOST_BASE + i))" "$queues" "$mtu"
    done

    UP_DONE=1

    local summary_fd=1
    if [[ "$print_env" -eq 1 ]]; then
        summary_fd=2
        print_env "$prefix" "$workers" "$hosts" "$queues" "$mtu"
    fi
    {
        echo "testbed '$prefix' up:"
        echo "  switch  $swns: $BRIDGE $SWITCH_ADDR/$SUBNET_LEN, ports sw-w0..sw-w$((workers - 1))$( ((hosts > 0)) && echo ", sw-h0..sw-h$((hosts - 1))")"
        echo "  workers ${wns[0]}..${wns[workers - 1]}: eth0 $SUBNET_BASE.$WORKER_BASE..$SUBNET_BASE.$((WORKER_BASE + workers - 1))"
        if ((hosts > 0)); then
            echo "  hosts   ${hns[0]}..${hns[hosts - 1]}: eth0 $SUBNET_BASE.$HOST_BASE..$SUBNET_BASE.$((HOST_BASE + hosts - 1))"
        else
            echo "  hosts   none"
        fi
        echo "  queues per veth: $queues, mtu $mtu; remove with: scripts/testbed.sh down --prefix $prefix"
    } >&"$summary_fd"
}

print_env() {
    local prefix="$1" workers="$2" hosts="$3" queues="$4" mtu="$5" i ns ports=()
    local swns="$prefix-sw"
    echo "prefix=$prefix"
    echo "switch_ns=$swns"
    echo "switch_addr=$SWITCH_ADDR"
    echo "switch_bridge=$BRIDGE"
    echo "switch_mac=$(mac_of "$swns" "$BRIDGE")"
    echo "subnet=$SUBNET_BASE.0/$SUBNET_LEN"
    echo "workers=$workers"
    echo "hosts=$hosts"
    echo "queues=$queues"
    echo "mtu=$mtu"
    for ((i = 0; i < workers; i++)); do
        ns="$prefix-w$i"
        ports+=("sw-w$i")
        echo "worker_${i}_ns=$ns"
        echo "worker_${i}_addr=$SUBNET_BASE.$((WORKER_BASE + i))"
        echo "worker_${i}_port=sw-w$i"
        echo "worker_${i}_mac=$(mac_of "$ns" eth0)"
    done
    for ((i = 0; i < hosts; i++)); do
        ns="$prefix-h$i"
        ports+=("sw-h$i")
        echo "host_${i}_ns=$ns"
        echo "host_${i}_addr=$SUBNET_BASE.$((HOST_BASE + i))"
        echo "host_${i}_port=sw-h$i"
        echo "host_${i}_mac=$(mac_of "$ns" eth0)"
    done
    echo "ports=${ports[*]}"
}

# ---------------------------------------------------------------------------

main() {
    [[ $# -ge 1 ]] || die "$SHORT_USAGE"
    local cmd="$1"
    shift
    case "$cmd" in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        -h|--help|help) usage ;;
        *) die "unknown command '$cmd'; $SHORT_USAGE" ;;
    esac
}

main "$@"
