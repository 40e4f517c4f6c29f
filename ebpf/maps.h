/* SPDX-License-Identifier: GPL-2.0 OR MIT OR Apache-2.0 */
/*
 * maps.h: the contract between ebpf/agg_xdp.c and switchd (Rust): sizes,
 * counter kinds, flags and the value structs of the program's maps.
 *
 * ONE source: switchd/build.rs parses this file, generates the Rust
 * constants and `#[repr(C)]` structs from it ($OUT_DIR/maps.rs, included by
 * switchd/src/xdp/loader.rs), and compiles a C file of _Static_asserts with
 * clang that checks every value and every field offset the generator read
 * against what the C compiler makes of this header. The Rust side asserts
 * the same sizes and offsets at compile time. Drift fails the build.
 *
 * The parser is deliberately small, so this file keeps to a dialect:
 *   - `#define NAME INTEGER` with an optional U/UL/ULL suffix (no
 *     expressions), one per line; the include guard is the only other
 *     #define;
 *   - `enum NAME { A = INTEGER, ... };` with every value written out;
 *   - `struct NAME { TYPE field; ... };` with TYPE one of __u8, __u16,
 *     __u32, __u64 (optionally an array `field[N]`), no padding: add
 *     explicit `_pad` fields so that the size is the sum of the fields;
 *   - comments anywhere (block comments may span lines).
 * Anything else makes the build fail with the line number.
 */
#ifndef AGG_MAPS_H
#define AGG_MAPS_H

#include <linux/types.h>

/* Ports (interfaces) the program serves; port_idx is 0..MAX_PORTS-1. */
#define MAX_PORTS 64
/* Receive queues per port with an XSKMAP slot: port_idx * MAX_QUEUES + queue. */
#define MAX_QUEUES 64
#define MAX_OWN_ADDRS 256
#define MAX_FDB 4096
#define MAX_LOCAL_MACS 256
/* A learned entry older than this is ignored (the bridge's default ageing, 300 s). */
#define FDB_AGE_NS 300000000000ULL
/* Refresh an unchanged entry's timestamp at most this often (1 s). */
#define FDB_REFRESH_NS 1000000000ULL

/* config.mode */
#define MODE_STEER 0
#define MODE_XDP_DROP 1

/* Bridge port STP states, as in /sys/class/net/PORT/brport/state
 * (linux/if_bridge.h BR_STATE_*). */
#define BR_STATE_DISABLED 0
#define BR_STATE_LISTENING 1
#define BR_STATE_LEARNING 2
#define BR_STATE_FORWARDING 3
#define BR_STATE_BLOCKING 4

/* port_info.flags */
/* A VLAN tag on a frame received on this port is always in the frame's
 * bytes, where the program sees it (no receive VLAN offload; for a veth, the
 * peer inserts no tag out of band). Without it nothing from this port is
 * forwarded in XDP: a redirect would drop a tag the program cannot see. */
#define PORT_F_TAGS_VISIBLE 1
/* The port's bridge has vlan_filtering on: the bridge's VLAN rules apply,
 * which the program does not implement, so it forwards nothing. */
#define PORT_F_VLAN_FILTERING 2
/* brport/isolated: the bridge forwards nothing between two isolated ports. */
#define PORT_F_ISOLATED 4
/* A DEVMAP redirect to this port carries a frame in several buffers (a
 * jumbo frame on veth): the driver has NETDEV_XDP_ACT_NDO_XMIT_SG. switchd
 * sets it for veth, which has it whenever it can take redirects at all.
 * Without it such a frame to this port goes to the bridge: the redirect
 * would drop it. */
#define PORT_F_XMIT_SG 8

/* Counters per port in `counters`: key port_idx * CNT_PER_PORT + kind.
 * `passed` counts every passed frame on a known port; `dropped` and
 * `own_address_forged` count dropped ones; `malformed` and the
 * `fwd_*` refusals are subsets of `passed`. A refusal is counted only for a
 * frame the fast path would otherwise have forwarded (plain unicast to a
 * destination learned on another port): the bridge's rules forbid it, or the
 * program cannot judge them, so the bridge gets it. */
enum counter_kind {
	CNT_STEERED = 0,
	CNT_PASSED = 1,
	CNT_MALFORMED = 2,
	CNT_DROPPED = 3,
	CNT_FORWARDED = 4,
	/* ingress or egress port is in no bridge (or switchd could not tell) */
	CNT_FWD_NOT_BRIDGED = 5,
	/* ingress and egress ports are in different bridges */
	CNT_FWD_OTHER_BRIDGE = 6,
	/* ingress or egress port is not in forwarding state */
	CNT_FWD_NOT_FORWARDING = 7,
	/* the bridge has vlan_filtering on */
	CNT_FWD_VLAN_FILTERING = 8,
	/* the ingress port may hide a VLAN tag from the program (offload) */
	CNT_FWD_VLAN_HIDDEN = 9,
	/* both ports are isolated */
	CNT_FWD_ISOLATED = 10,
	/* a frame in several buffers to a port not known to transmit one */
	CNT_FWD_MULTI_BUFFER = 11,
	/* dropped: its source IPv4 address is in `own_addrs` or its source MAC
	 * in `local_macs`, from whatever port (the switch never receives its
	 * own frames: spoofed or looped); not a subset of `passed` */
	CNT_OWN_ADDRESS_FORGED = 12,
	CNT_PER_PORT = 16,
};

/* `config` value (ARRAY, one entry). */
struct agg_config {
	__u16 agg_port;  /* network byte order */
	__u8 mode;       /* MODE_STEER or MODE_XDP_DROP */
	__u8 forward;    /* 1: forwarding fast path on */
	__u16 seq_lanes; /* ports agg_port..agg_port+seq_lanes-1 (0: as 1) */
	__u16 _pad;
};

/* `fdb` value (LRU_HASH keyed by the MAC in the first 6 bytes of a u64). */
struct fdb_entry {
	__u32 port_idx; /* 0..MAX_PORTS-1 */
	__u32 _pad;
	__u64 seen_ns;  /* bpf_ktime_get_ns() when last seen as a source */
};

/* `port_info` value (ARRAY indexed by port_idx), written by switchd at
 * attach and refreshed about once a second. All zeros (the initial value)
 * means "in no bridge": nothing is forwarded to or from the port in XDP. */
struct port_info {
	__u32 bridge_ifindex; /* the bridge the port is enslaved to; 0: none */
	__u8 stp_state;       /* BR_STATE_* of the port in that bridge */
	__u8 flags;           /* PORT_F_* */
	__u16 _pad;
};

#endif /* AGG_MAPS_H */
