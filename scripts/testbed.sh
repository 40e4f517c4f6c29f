#!/usr/bin/env bash
#
# testbed.sh: make or remove a veth/netns testbed for the aggregation switch.
#
# Usage:
#   scripts/testbed.sh up --workers N [--hosts M] [--prefix P] [--queues Q]
#                         [--queue-per-worker] [--mtu BYTES] [--print-env]
#   scripts/testbed.sh up --leaves L --spines K --workers-per-leaf W
#                         [--hosts-per-leaf H] [--prefix P] [--queues Q]
#                         [--mtu BYTES] [--print-env]
#   scripts/testbed.sh down [--prefix P]
#   scripts/testbed.sh --help
#
# Single switch (`up --workers N`) makes these network namespaces (P
# defaults to "agg"):
#   P-sw          the switch: Linux bridge br0 (198.18.0.1/24, STP off,
#                 forward delay 0) enslaving one port per worker and host
#   P-wI          worker I (0 <= I < N):  eth0 198.18.0.(10+I)/24, its peer
#                 in P-sw is sw-wI
#   P-hJ          plain host J (0 <= J < M): eth0 198.18.0.(100+J)/24, its
#                 peer in P-sw is sw-hJ
# 198.18.0.0/15 is the RFC 2544 benchmarking range; it is only used inside
# these namespaces. N is 1..90, M is 0..155 (default 0), Q (default 1) sets
# numrxqueues/numtxqueues of every veth. A veth receives on the queue its
# peer sent on, which the sender's kernel picks by flow hash (or XPS): a
# worker's one flow lands on one queue, and several workers may share one.
# --queue-per-worker makes the spread the same every run: worker I sends on
# transmit queue floor(I*Q/N) (neighbouring ranks on one queue, so a
# chunk's rank-order sum changes thread as few times as it can) and host J
# on J mod Q, of their eth0 only (XPS maps every CPU to it), so the switch
# port receives them on that queue (on a real NIC, RSS hashes flows to
# queues, or ntuple rules by source place them). IPv6 is disabled in every namespace,
# lo is up everywhere, and eth0 has GRO on (needed by XDP redirects into a
# veth, see docs/PLATFORM.md) and transmit checksum offload off, so that frames on
# the wire carry complete UDP/TCP checksums as from a real NIC (an AF_XDP
# reader sees the frame's bytes as they are; with offload on, it would see
# only a partial pseudo-header sum), and transmit VLAN offload off (a tag
# stays in the frame, where the XDP fast path sees it; switchd refuses the
# fast path from a veth whose peer has it on). The workers' udp-gso transport
# works with transmit checksum offload off on recent kernels (checked: 6.18;
# the kernel segments and sums in software); older kernels refuse UDP GSO
# there (EIO) and the workers' `auto` transport falls back to mmsg.
#
# Leaf-spine (`up --leaves L --spines K --workers-per-leaf W`): every switch
# is its own namespace, as separate boxes would be. L is 1..254, K is
# 1..127, W is 1..90, H is 0..155 (default 0). The fabric is routed (layer
# 3), so it has no loops and needs no STP: bridging stays inside one leaf.
#   P-leafI       leaf I (0 <= I < L): bridge br0 198.18.I.1/24 (the gateway
#                 of its subnet 198.18.I.0/24) with ports sw-wJ, sw-hJ for its
#                 workers and hosts, as the single switch; one uplink up-sJ
#                 to every spine J, 198.19.I.(2J+1)/31
#   P-spineJ      spine J (0 <= J < K): one downlink dn-lI to every leaf I,
#                 198.19.I.(2J)/31; its own address 198.19.255.(J+1)/32 on
#                 lo (the later aggregation address), reachable from every
#                 leaf, worker and host
#   P-lIwJ        worker J under leaf I: eth0 198.18.I.(10+J)/24, default
#                 route via 198.18.I.1
#   P-lIhJ        host J under leaf I: eth0 198.18.I.(100+J)/24, default
#                 route via 198.18.I.1
# Leaves and spines forward IPv4 (ip_forward=1, rp_filter=0: the two
# directions of a flow may cross different spines). Each leaf routes every
# other leaf's /24 over all spines at once (an ECMP route, one nexthop per
# uplink) and each spine address over its own uplink; each spine routes
# leaf I's /24 over dn-lI. Leaves hash flows by L4 ports too
# (fib_multipath_hash_policy=1), so different TCP/UDP flows between the
# same two hosts may take different spines; a flow stays on one. Both ends
# of every leaf-spine veth face a switch and get the offload settings of
# eth0 above.
#
# `up` first removes a testbed with the same prefix. It prints a summary; with
# --print-env it prints the testbed as key=value lines on stdout instead (the
# summary then goes to stderr).
#
# `down` deletes every namespace of the prefix (P-sw, P-wI, P-hJ, P-leafI,
# P-spineJ, P-lIwJ, P-lIhJ) and succeeds when there is none. It never kills
# processes; it warns about any still inside.
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
# Leaf-spine: the address plan is in the functions under "Leaf-spine
# addresses" below.
readonly MAX_LEAVES=254
readonly MAX_SPINES=127
readonly SHORT_USAGE="usage: testbed.sh up --workers N [--hosts M] [--prefix P] [--queues Q] [--queue-per-worker] | up --leaves L --spines K --workers-per-leaf W [--hosts-per-leaf H] [--prefix P] | down [--prefix P] (see --help)"

# ---------------------------------------------------------------------------
# Names

# is_testbed_ns PREFIX NAME: true when NAME is PREFIX-sw, PREFIX-wI or
# PREFIX-hJ (single switch) or PREFIX-leafI, PREFIX-spineJ, PREFIX-lIwJ or
# PREFIX-lIhJ (leaf-spine).
is_testbed_ns() {
    local prefix="$1" name="$2" rest kind
    [[ "$name" == "$prefix-sw" ]] && return 0
    for kind in w h leaf spine; do
        if [[ "$name" == "$prefix-$kind"* ]]; then
            rest="${name#"$prefix-$kind"}"
            is_uint "$rest" && return 0
        fi
    done
    if [[ "$name" == "$prefix-l"* ]]; then
        rest="${name#"$prefix-l"}"
        [[ "$rest" =~ ^[0-9]+[wh][0-9]+$ ]] && return 0
    fi
    return 1
}

# ---------------------------------------------------------------------------
# Leaf-spine addresses (I: leaf index, J: spine, worker or host index)

leaf_net() { echo "198.18.$1"; }                    # leaf I's /24, without ".0"
leaf_gw() { echo "198.18.$1.1"; }                   # leaf I's br0, the gateway
leaf_worker_addr() { echo "198.18.$1.$((WORKER_BASE + $2))"; }
leaf_host_addr() { echo "198.18.$1.$((HOST_BASE + $2))"; }
link_spine_addr() { echo "198.19.$1.$((2 * $2))"; }    # /31, spine J's end to leaf I
link_leaf_addr() { echo "198.19.$1.$((2 * $2 + 1))"; } # /31, leaf I's end to spine J
spine_addr() { echo "198.19.255.$(($1 + 1))"; }     # /32 on spine J's lo

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

# router_sysctls NS MULTIPATH_HASH_POLICY: forward IPv4 without reverse-path
# filtering (ECMP: a flow's two directions may cross different spines).
router_sysctls() {
    in_ns "$1" sysctl -q -w \
        net.ipv4.ip_forward=1 \
        net.ipv4.conf.all.rp_filter=0 \
        net.ipv4.conf.default.rp_filter=0 \
        net.ipv4.fib_multipath_hash_policy="$2" >/dev/null
}

# switch_facing NS DEV: offload settings of a veth end whose peer is a switch
# port (see the header).
switch_facing() {
    local ns="$1" dev="$2"
    command -v ethtool >/dev/null 2>&1 || return 0
    # GRO on the receiving side lets XDP_REDIRECT into this veth work.
    in_ns "$ns" ethtool -K "$dev" gro on >/dev/null 2>&1 || true
    # Complete checksums in the frames, as a NIC would put on the wire.
    in_ns "$ns" ethtool -K "$dev" tx off >/dev/null 2>&1 || true
    # VLAN tags in the frames' bytes, never in skb metadata, so that the
    # XDP program on the switch port can see them: switchd gives the
    # fast path only to veth ports whose peer has these off.
    in_ns "$ns" ethtool -K "$dev" txvlan off tx-vlan-stag-hw-insert off >/dev/null 2>&1 || true
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
    switch_facing "$ns" eth0
}

# cpu_mask: every configured CPU as a sysfs CPU mask (hex, 32-bit groups
# separated by commas, highest first).
cpu_mask() {
    local n mask="" i
    n="$(nproc --all)"
    (( n % 32 == 0 )) || mask="$(printf '%x' $(( (1 << (n % 32)) - 1 )))"
    for ((i = 0; i < n / 32; i++)); do mask="${mask:+$mask,}ffffffff"; done
    echo "$mask"
}

# send_on_queue NS INDEX QUEUES: eth0 in NS transmits on queue INDEX mod
# QUEUES only (XPS maps every CPU to it); nothing with one queue.
send_on_queue() {
    local ns="$1" index="$2" queues="$3"
    ((queues > 1)) || return 0
    ip netns exec "$ns" sh -c "echo $(cpu_mask) > /sys/class/net/eth0/queues/tx-$((index % queues))/xps_cpus" ||
        die "setting XPS of eth0 in $ns (kernel without CONFIG_XPS?)"
}

# add_bridge NS ADDR MTU: the bridge br0 with ADDR/24, forwarding at once.
add_bridge() {
    local ns="$1" addr="$2" mtu="$3"
    ip -n "$ns" link add "$BRIDGE" type bridge \
        forward_delay 0 stp_state 0 ageing_time 30000
    ip -n "$ns" link set "$BRIDGE" mtu "$mtu" 2>/dev/null || true
    ip -n "$ns" addr add "$addr/$SUBNET_LEN" dev "$BRIDGE"
    ip -n "$ns" link set "$BRIDGE" up
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
    local prefix="agg" workers="" hosts="" queues=1 mtu=1500 print_env=0 per_worker=0
    local leaves="" spines="" wpl="" hpl=""
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --workers|--hosts|--prefix|--queues|--mtu|--leaves|--spines|--workers-per-leaf|--hosts-per-leaf)
                [[ $# -ge 2 ]] || die "$1 needs a value"
                case "$1" in
                    --workers) workers="$2" ;;
                    --hosts) hosts="$2" ;;
                    --prefix) prefix="$2" ;;
                    --queues) queues="$2" ;;
                    --mtu) mtu="$2" ;;
                    --leaves) leaves="$2" ;;
                    --spines) spines="$2" ;;
                    --workers-per-leaf) wpl="$2" ;;
                    --hosts-per-leaf) hpl="$2" ;;
                esac
                shift 2 ;;
            --workers=*) workers="${1#*=}"; shift ;;
            --hosts=*) hosts="${1#*=}"; shift ;;
            --prefix=*) prefix="${1#*=}"; shift ;;
            --queues=*) queues="${1#*=}"; shift ;;
            --mtu=*) mtu="${1#*=}"; shift ;;
            --leaves=*) leaves="${1#*=}"; shift ;;
            --spines=*) spines="${1#*=}"; shift ;;
            --workers-per-leaf=*) wpl="${1#*=}"; shift ;;
            --hosts-per-leaf=*) hpl="${1#*=}"; shift ;;
            --print-env) print_env=1; shift ;;
            --queue-per-worker) per_worker=1; shift ;;
            -h|--help) usage; exit 0 ;;
            *) die "up: unknown argument '$1' (see --help)" ;;
        esac
    done
    uint_in_range "$queues" 1 256 ||
        die "--queues must be 1..256, got '$queues'"
    uint_in_range "$mtu" 68 65535 ||
        die "--mtu must be 68..65535, got '$mtu'"
    if [[ -n "$leaves$spines$wpl$hpl" ]]; then
        [[ -z "$workers$hosts" ]] ||
            die "up: --workers/--hosts (one switch) and --leaves/--spines/--workers-per-leaf/--hosts-per-leaf (leaf-spine) do not mix"
        [[ "$per_worker" -eq 0 ]] ||
            die "up: --queue-per-worker is for the single switch (--workers N) only"
        up_leafspine "$prefix" "$leaves" "$spines" "$wpl" "${hpl:-0}" \
            "$((10#$queues))" "$((10#$mtu))" "$print_env"
        return
    fi
    hosts="${hosts:-0}"
    [[ -n "$workers" ]] || die "up: --workers N (or --leaves L --spines K --workers-per-leaf W) is required"
    uint_in_range "$workers" 1 "$MAX_WORKERS" ||
        die "--workers must be 1..$MAX_WORKERS (worker I gets $SUBNET_BASE.$WORKER_BASE+I), got '$workers'"
    uint_in_range "$hosts" 0 "$MAX_HOSTS" ||
        die "--hosts must be 0..$MAX_HOSTS (host J gets $SUBNET_BASE.$HOST_BASE+J), got '$hosts'"
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
    add_bridge "$swns" "$SWITCH_ADDR" "$mtu"

    for ((i = 0; i < workers; i++)); do
        add_port "$swns" "${wns[i]}" "sw-w$i" "$SUBNET_BASE.$((WORKER_BASE + i))" "$queues" "$mtu"
        ((per_worker == 0)) || send_on_queue "${wns[i]}" "$((i * queues / workers))" "$queues"
    done
    for ((i = 0; i < hosts; i++)); do
        add_port "$swns" "${hns[i]}" "sw-h$i" "$SUBNET_BASE.$((HOST_BASE + i))" "$queues" "$mtu"
        ((per_worker == 0)) || send_on_queue "${hns[i]}" "$i" "$queues"
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
# up, leaf-spine

# add_uplink LEAFNS SPINENS I J QUEUES MTU: the veth between leaf I (up-sJ)
# and spine J (dn-lI), a /31 on it.
add_uplink() {
    local lns="$1" sns="$2" i="$3" j="$4" queues="$5" mtu="$6"
    ip -n "$lns" link add "up-s$j" mtu "$mtu" \
        numrxqueues "$queues" numtxqueues "$queues" \
        type veth peer name "dn-l$i" netns "$sns" mtu "$mtu" \
        numrxqueues "$queues" numtxqueues "$queues"
    ip -n "$lns" addr add "$(link_leaf_addr "$i" "$j")/31" dev "up-s$j"
    ip -n "$sns" addr add "$(link_spine_addr "$i" "$j")/31" dev "dn-l$i"
    ip -n "$lns" link set "up-s$j" up
    ip -n "$sns" link set "dn-l$i" up
    switch_facing "$lns" "up-s$j"
    switch_facing "$sns" "dn-l$i"
}

up_leafspine() {
    local prefix="$1" leaves="$2" spines="$3" wpl="$4" hpl="$5" queues="$6" mtu="$7" print_env="$8"
    [[ -n "$leaves" && -n "$spines" && -n "$wpl" ]] ||
        die "up: leaf-spine needs --leaves L --spines K --workers-per-leaf W"
    uint_in_range "$leaves" 1 "$MAX_LEAVES" ||
        die "--leaves must be 1..$MAX_LEAVES (leaf I gets 198.18.I.0/24), got '$leaves'"
    uint_in_range "$spines" 1 "$MAX_SPINES" ||
        die "--spines must be 1..$MAX_SPINES (link I-J gets 198.19.I.(2J)/31), got '$spines'"
    uint_in_range "$wpl" 1 "$MAX_WORKERS" ||
        die "--workers-per-leaf must be 1..$MAX_WORKERS, got '$wpl'"
    uint_in_range "$hpl" 0 "$MAX_HOSTS" ||
        die "--hosts-per-leaf must be 0..$MAX_HOSTS, got '$hpl'"
    leaves=$((10#$leaves)); spines=$((10#$spines)); wpl=$((10#$wpl)); hpl=$((10#$hpl))
    check_prefix "$prefix"
    require_root up --leaves "$leaves" --spines "$spines" --workers-per-leaf "$wpl" \
        --hosts-per-leaf "$hpl" --prefix "$prefix"
    command -v ip >/dev/null 2>&1 || die "ip (iproute2) not found: run scripts/setup.sh"

    take_lock "$prefix"
    local removed
    removed="$(teardown "$prefix")"
    [[ "$removed" -eq 0 ]] || log "removed the earlier testbed '$prefix' ($removed namespaces)"

    UP_PREFIX="$prefix"
    trap on_exit EXIT

    local i j k ns lns sns
    local -a nexthops

    # Namespaces first, with IPv6 off before any device exists in them.
    for ((j = 0; j < spines; j++)); do
        ns="$prefix-spine$j"
        ip netns add "$ns"
        quiet_sysctls "$ns"
        router_sysctls "$ns" 1
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$(spine_addr "$j")/32" dev lo
    done
    for ((i = 0; i < leaves; i++)); do
        lns="$prefix-leaf$i"
        ip netns add "$lns"
        quiet_sysctls "$lns"
        router_sysctls "$lns" 1
        ip -n "$lns" link set lo up
        add_bridge "$lns" "$(leaf_gw "$i")" "$mtu"
        for ((k = 0; k < wpl + hpl; k++)); do
            if ((k < wpl)); then ns="$prefix-l${i}w$k"; else ns="$prefix-l${i}h$((k - wpl))"; fi
            ip netns add "$ns"
            quiet_sysctls "$ns"
            ip -n "$ns" link set lo up
        done
        for ((k = 0; k < wpl; k++)); do
            ns="$prefix-l${i}w$k"
            add_port "$lns" "$ns" "sw-w$k" "$(leaf_worker_addr "$i" "$k")" "$queues" "$mtu"
            ip -n "$ns" route add default via "$(leaf_gw "$i")" dev eth0
        done
        for ((k = 0; k < hpl; k++)); do
            ns="$prefix-l${i}h$k"
            add_port "$lns" "$ns" "sw-h$k" "$(leaf_host_addr "$i" "$k")" "$queues" "$mtu"
            ip -n "$ns" route add default via "$(leaf_gw "$i")" dev eth0
        done
        for ((j = 0; j < spines; j++)); do
            add_uplink "$lns" "$prefix-spine$j" "$i" "$j" "$queues" "$mtu"
        done
    done

    # Routes: each leaf reaches every spine's own address over its uplink to
    # that spine, and every other leaf's /24 over all spines (ECMP); each
    # spine reaches leaf I's /24 over dn-lI.
    for ((i = 0; i < leaves; i++)); do
        lns="$prefix-leaf$i"
        nexthops=()
        for ((j = 0; j < spines; j++)); do
            ip -n "$lns" route add "$(spine_addr "$j")/32" \
                via "$(link_spine_addr "$i" "$j")" dev "up-s$j"
            nexthops+=(nexthop via "$(link_spine_addr "$i" "$j")" dev "up-s$j")
        done
        for ((k = 0; k < leaves; k++)); do
            ((k != i)) || continue
            ip -n "$lns" route add "$(leaf_net "$k").0/$SUBNET_LEN" "${nexthops[@]}"
        done
    done
    for ((j = 0; j < spines; j++)); do
        sns="$prefix-spine$j"
        for ((i = 0; i < leaves; i++)); do
            ip -n "$sns" route add "$(leaf_net "$i").0/$SUBNET_LEN" \
                via "$(link_leaf_addr "$i" "$j")" dev "dn-l$i"
        done
    done

    UP_DONE=1

    local summary_fd=1
    if [[ "$print_env" -eq 1 ]]; then
        summary_fd=2
        print_env_leafspine "$prefix" "$leaves" "$spines" "$wpl" "$hpl" "$queues" "$mtu"
    fi
    {
        echo "testbed '$prefix' up (leaf-spine, routed, ECMP over the spines):"
        for ((i = 0; i < leaves; i++)); do
            echo "  leaf    $prefix-leaf$i: $BRIDGE $(leaf_gw "$i")/$SUBNET_LEN, uplinks up-s0..up-s$((spines - 1)) ($(link_leaf_addr "$i" 0)/31..)"
            echo "    workers $prefix-l${i}w0..$prefix-l${i}w$((wpl - 1)): eth0 $(leaf_worker_addr "$i" 0)..$(leaf_worker_addr "$i" $((wpl - 1)))"
            if ((hpl > 0)); then
                echo "    hosts   $prefix-l${i}h0..$prefix-l${i}h$((hpl - 1)): eth0 $(leaf_host_addr "$i" 0)..$(leaf_host_addr "$i" $((hpl - 1)))"
            fi
        done
        for ((j = 0; j < spines; j++)); do
            echo "  spine   $prefix-spine$j: lo $(spine_addr "$j")/32, downlinks dn-l0..dn-l$((leaves - 1))"
        done
        echo "  queues per veth: $queues, mtu $mtu; remove with: scripts/testbed.sh down --prefix $prefix"
    } >&"$summary_fd"
}

print_env_leafspine() {
    local prefix="$1" leaves="$2" spines="$3" wpl="$4" hpl="$5" queues="$6" mtu="$7"
    local i j k ns lns ports uplinks downlinks
    echo "prefix=$prefix"
    echo "topology=leafspine"
    echo "leaves=$leaves"
    echo "spines=$spines"
    echo "workers_per_leaf=$wpl"
    echo "hosts_per_leaf=$hpl"
    echo "queues=$queues"
    echo "mtu=$mtu"
    for ((i = 0; i < leaves; i++)); do
        lns="$prefix-leaf$i"
        ports=""
        uplinks=""
        echo "leaf_${i}_ns=$lns"
        echo "leaf_${i}_gateway=$(leaf_gw "$i")"
        echo "leaf_${i}_subnet=$(leaf_net "$i").0/$SUBNET_LEN"
        echo "leaf_${i}_bridge=$BRIDGE"
        echo "leaf_${i}_mac=$(mac_of "$lns" "$BRIDGE")"
        for ((k = 0; k < wpl; k++)); do
            ns="$prefix-l${i}w$k"
            ports+="${ports:+ }sw-w$k"
            echo "leaf_${i}_worker_${k}_ns=$ns"
            echo "leaf_${i}_worker_${k}_addr=$(leaf_worker_addr "$i" "$k")"
            echo "leaf_${i}_worker_${k}_port=sw-w$k"
            echo "leaf_${i}_worker_${k}_mac=$(mac_of "$ns" eth0)"
        done
        for ((k = 0; k < hpl; k++)); do
            ns="$prefix-l${i}h$k"
            ports+="${ports:+ }sw-h$k"
            echo "leaf_${i}_host_${k}_ns=$ns"
            echo "leaf_${i}_host_${k}_addr=$(leaf_host_addr "$i" "$k")"
            echo "leaf_${i}_host_${k}_port=sw-h$k"
            echo "leaf_${i}_host_${k}_mac=$(mac_of "$ns" eth0)"
        done
        echo "leaf_${i}_ports=$ports"
        for ((j = 0; j < spines; j++)); do
            uplinks+="${uplinks:+ }up-s$j"
            echo "leaf_${i}_uplink_${j}_port=up-s$j"
            echo "leaf_${i}_uplink_${j}_addr=$(link_leaf_addr "$i" "$j")"
            echo "leaf_${i}_uplink_${j}_peer=$(link_spine_addr "$i" "$j")"
        done
        echo "leaf_${i}_uplinks=$uplinks"
    done
    for ((j = 0; j < spines; j++)); do
        downlinks=""
        echo "spine_${j}_ns=$prefix-spine$j"
        echo "spine_${j}_addr=$(spine_addr "$j")"
        for ((i = 0; i < leaves; i++)); do
            downlinks+="${downlinks:+ }dn-l$i"
            echo "spine_${j}_downlink_${i}_port=dn-l$i"
            echo "spine_${j}_downlink_${i}_addr=$(link_spine_addr "$i" "$j")"
        done
        echo "spine_${j}_ports=$downlinks"
    done
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
