// SPDX-License-Identifier: GPL-2.0
/*
 * agg_xdp: steers aggregation UDP frames to AF_XDP sockets; forwards plain
 * unicast between ports of the same Linux bridge through a DEVMAP (the fast
 * path) where the bridge would forward it too; passes everything else up the
 * normal stack (the Linux bridge) untouched.
 *
 * A frame goes to the XSKMAP slot `port_idx * MAX_QUEUES + rx_queue_index`
 * only when ALL of these hold:
 *   - the ingress ifindex is in `ports` (else XDP_PASS, not counted),
 *   - Ethernet II, no VLAN tag, EtherType IPv4,
 *   - IPv4 with IHL == 5 (no options) and not a fragment,
 *   - protocol UDP,
 *   - destination address is in `own_addrs`,
 *   - UDP destination port in config.agg_port .. agg_port + seq_lanes - 1
 *     (a switch with seq lanes takes DATA of seq s on agg_port + s mod
 *     seq_lanes, so that NIC rules can steer each lane to its own queue).
 * The redirect falls back to XDP_PASS when no socket sits in the slot. In
 * xdp-drop mode (config.mode == MODE_XDP_DROP, a benchmark baseline) such a
 * frame is dropped instead and counted as `dropped`.
 *
 * Forwarding fast path (config.forward != 0). switchd describes every port
 * in `port_info` (bridge ifindex, STP state, flags; see maps.h), read from
 * sysfs/netlink/ethtool at attach and about once a second after. The program
 * learns source MAC -> ingress port into `fdb` (an LRU hash; entries carry
 * the time last seen) from frames on ports that are in a bridge in learning
 * or forwarding state, and redirects a frame through the DEVMAP `tx_ports`
 * to the port its destination MAC was learned on when ALL of these hold:
 *   - the frame is not steered (above),
 *   - it is Ethernet II with EtherType IPv4, IPv6 or ARP (no VLAN tag in
 *     the frame),
 *   - the destination MAC is unicast, not in `local_macs` (the switch's own
 *     interfaces, filled by switchd) and learned less than FDB_AGE_NS ago,
 *   - the learned port is not the ingress port, and has a `tx_ports` entry,
 *   - and the bridge would forward it (otherwise a refusal, counted by
 *     reason as `fwd_*` on the ingress port):
 *       - both ports are enslaved to a bridge              (fwd_not_bridged)
 *       - to the SAME bridge                              (fwd_other_bridge)
 *       - both in STP state forwarding              (fwd_not_forwarding)
 *       - that bridge has vlan_filtering off          (fwd_vlan_filtering)
 *       - a VLAN tag on the ingress port cannot be hidden from the program
 *         by offload (PORT_F_TAGS_VISIBLE: switchd checks the port's receive
 *         VLAN offload, for a veth its peer's transmit VLAN offload)
 *                                                       (fwd_vlan_hidden)
 *       - not both ports isolated                          (fwd_isolated)
 *   - and the frame, if it is in several buffers (a jumbo frame), goes to
 *     a port whose driver transmits such frames (PORT_F_XMIT_SG: veth)
 *                                                   (fwd_multi_buffer)
 * Anything else (broadcast, multicast, unknown or aged destinations, frames
 * for the switch itself, VLAN-tagged, malformed IPv4, refusals) is XDP_PASSed
 * into the bridge exactly as without the fast path; the bridge applies its
 * own rules to it. What the program cannot judge goes to the bridge.
 *
 * Multi-buffer frames (jumbo frames on veth, see the SEC comment below) are
 * judged on their first buffer, which holds every header read here. The
 * XSKMAP takes them whole (switchd binds with XDP_USE_SG when the port MTU
 * needs it); the DEVMAP only to a port with PORT_F_XMIT_SG, as a driver
 * without it would drop them at redirect time.
 *
 * Before anything else, a frame on a known port whose source MAC is in
 * `local_macs` (the switch's own interfaces) or, for IPv4 with a whole
 * header, whose source address is in `own_addrs`, or an ARP whose sender
 * address is in `own_addrs`, is DROPPED and counted as
 * `own_address_forged`: the switch never receives its own frames, so it is
 * spoofed (a host on another port forging the switch's RESULTs or NACKs)
 * or looped. Neither the fast path nor the bridge ever forwards it, and it
 * is never steered. This is the one check that drops rather than passes.
 *
 * Otherwise it FAILS OPEN: a frame it cannot parse is passed, never dropped. Frames
 * that claim IPv4 (or IPv4/UDP) but are truncated or carry a bad IHL are
 * counted as `malformed` and passed.
 *
 * Sizes, counter kinds, flags and the map value structs live in maps.h,
 * from which switchd/build.rs generates the Rust side and checks it (a
 * drift fails the build).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "maps.h"

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_PORTS * MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32);   /* ifindex */
	__type(value, __u32); /* port index 0..MAX_PORTS-1 */
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_OWN_ADDRS);
	__type(key, __u32); /* IPv4 address, network byte order */
	__type(value, __u8);
} own_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct agg_config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32); /* port index */
	__type(value, struct bpf_devmap_val); /* egress ifindex */
} tx_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_FDB);
	__type(key, __u64); /* MAC in the first 6 bytes in memory, 2 zero bytes */
	__type(value, struct fdb_entry);
} fdb SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_LOCAL_MACS);
	__type(key, __u64); /* as in `fdb` */
	__type(value, __u8);
} local_macs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32); /* port index */
	__type(value, struct port_info);
} port_info SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_PORTS * CNT_PER_PORT);
	__type(key, __u32); /* port_idx * CNT_PER_PORT + counter_kind */
	__type(value, __u64);
} counters SEC(".maps");

/* Every counter kind must fit in a port's block of `counters`. */
_Static_assert(CNT_OWN_ADDRESS_FORGED < CNT_PER_PORT, "counter kinds overflow CNT_PER_PORT");

static __always_inline void count(__u32 port_idx, __u32 kind)
{
	__u32 key = port_idx * CNT_PER_PORT + kind;
	__u64 *v = bpf_map_lookup_elem(&counters, &key);

	if (v)
		*v += 1; /* per-CPU slot: no atomics needed */
}

/* `passed` counts every frame passed on a known port; `kind`, when not
 * CNT_PASSED, also counts the frame in a subset of `passed`: `malformed`
 * (claimed IPv4/UDP but truncated or a bad IHL) or a fast-path refusal. */
static __always_inline int pass(__u32 port_idx, __u32 kind)
{
	count(port_idx, CNT_PASSED);
	if (kind != CNT_PASSED)
		count(port_idx, kind);
	return XDP_PASS;
}

/* An ARP for IPv4 over Ethernet: the fixed header, then the sender's
 * hardware and protocol addresses (the rest is not read). */
struct arp_ipv4 {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 op;
	__u8 sha[ETH_ALEN];
	__u8 spa[4];
};

/* A frame that claims one of the switch's own addresses as its source:
 * dropped and counted, whatever it is and wherever it was going. */
static __always_inline int forged(__u32 port_idx)
{
	count(port_idx, CNT_OWN_ADDRESS_FORGED);
	return XDP_DROP;
}

static __always_inline __u64 mac_key(const __u8 *mac)
{
	__u64 key = 0;

	__builtin_memcpy(&key, mac, ETH_ALEN);
	return key;
}

/* Group bit (broadcast/multicast) or all zeros: never learned or forwarded. */
static __always_inline int mac_is_unicast(const __u8 *mac)
{
	if (mac[0] & 1)
		return 0;
	return (mac[0] | mac[1] | mac[2] | mac[3] | mac[4] | mac[5]) != 0;
}

/* Learns eth->h_source on port_idx. Writes only when the port changed or the
 * entry is older than FDB_REFRESH_NS, so a busy flow costs one lookup. */
static __always_inline void learn(struct ethhdr *eth, __u32 port_idx, __u64 now)
{
	struct fdb_entry *e;
	struct fdb_entry fresh = {};
	__u64 key;

	if (!mac_is_unicast(eth->h_source))
		return;
	key = mac_key(eth->h_source);
	e = bpf_map_lookup_elem(&fdb, &key);
	if (e && e->port_idx == port_idx &&
	    (__s64)(now - e->seen_ns) < (__s64)FDB_REFRESH_NS)
		return;
	if (bpf_map_lookup_elem(&local_macs, &key))
		return; /* someone sends with our MAC: not learned */
	fresh.port_idx = port_idx;
	fresh.seen_ns = now;
	bpf_map_update_elem(&fdb, &key, &fresh, BPF_ANY);
}

/* Whether the bridge would forward from port `in` to port `out` (both
 * described by `port_info`) and the redirect can carry the frame (`multi`:
 * it is in several buffers): CNT_FORWARDED if so, else the refusal reason. */
static __always_inline __u32 bridge_verdict(const struct port_info *in,
					    const struct port_info *out,
					    int multi)
{
	if (in->bridge_ifindex == 0 || out->bridge_ifindex == 0)
		return CNT_FWD_NOT_BRIDGED;
	if (in->bridge_ifindex != out->bridge_ifindex)
		return CNT_FWD_OTHER_BRIDGE;
	if ((in->flags | out->flags) & PORT_F_VLAN_FILTERING)
		return CNT_FWD_VLAN_FILTERING;
	if (in->stp_state != BR_STATE_FORWARDING ||
	    out->stp_state != BR_STATE_FORWARDING)
		return CNT_FWD_NOT_FORWARDING;
	if (!(in->flags & PORT_F_TAGS_VISIBLE))
		return CNT_FWD_VLAN_HIDDEN;
	if (in->flags & out->flags & PORT_F_ISOLATED)
		return CNT_FWD_ISOLATED;
	if (multi && !(out->flags & PORT_F_XMIT_SG))
		return CNT_FWD_MULTI_BUFFER;
	return CNT_FORWARDED;
}

/* The fast path for a frame that is not steered: redirect to the learned
 * egress port if the bridge would forward there, or pass into the bridge
 * (counted as `passed`, and by reason when refused). `in` is a copy of the
 * ingress port's `port_info`. */
static __always_inline int forward(struct xdp_md *ctx, struct ethhdr *eth,
				   __u32 port_idx, int fwd, __u64 now,
				   const struct port_info *in)
{
	struct port_info *out_info;
	struct port_info out_copy;
	struct fdb_entry *e;
	__u32 verdict;
	__u64 key;
	__u32 out;
	long ret;
	int multi;

	if (!fwd)
		return pass(port_idx, CNT_PASSED);
	if (eth->h_proto != bpf_htons(ETH_P_IP) &&
	    eth->h_proto != bpf_htons(ETH_P_IPV6) &&
	    eth->h_proto != bpf_htons(ETH_P_ARP))
		return pass(port_idx, CNT_PASSED); /* VLAN, LLDP, ...: the bridge's */
	if (!mac_is_unicast(eth->h_dest))
		return pass(port_idx, CNT_PASSED);
	key = mac_key(eth->h_dest);
	e = bpf_map_lookup_elem(&fdb, &key);
	if (!e)
		return pass(port_idx, CNT_PASSED); /* unknown: the bridge floods */
	if (bpf_map_lookup_elem(&local_macs, &key))
		return pass(port_idx, CNT_PASSED); /* for the switch itself */
	out = e->port_idx;
	if (out == port_idx || out >= MAX_PORTS)
		return pass(port_idx, CNT_PASSED);
	if ((__s64)(now - e->seen_ns) > (__s64)FDB_AGE_NS) /* another CPU may be ahead */
		return pass(port_idx, CNT_PASSED);
	out_info = bpf_map_lookup_elem(&port_info, &out);
	if (!out_info)
		return pass(port_idx, CNT_PASSED);
	/* One copy: switchd may rewrite the entry while we read it. */
	out_copy = *out_info;
	/* The whole frame is longer than its first buffer: a jumbo frame. */
	multi = bpf_xdp_get_buff_len(ctx) >
		(__u64)((long)ctx->data_end - (long)ctx->data);
	verdict = bridge_verdict(in, &out_copy, multi);
	if (verdict != CNT_FORWARDED)
		return pass(port_idx, verdict); /* the bridge decides */
	ret = bpf_redirect_map(&tx_ports, out, XDP_PASS);
	count(port_idx, ret == XDP_REDIRECT ? CNT_FORWARDED : CNT_PASSED);
	return ret;
}

/* "xdp.frags": loaded with BPF_F_XDP_HAS_FRAGS, so a driver may hand it a
 * frame in several buffers (veth then allows an MTU above one page). Every
 * header the program reads lies in the first buffer (data..data_end); the
 * rest of a frame is never touched, so a frame in several buffers is
 * judged like any other. */
SEC("xdp.frags")
int agg_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 ifindex = ctx->ingress_ifindex;
	__u32 *port_p;
	__u32 port_idx;
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	struct agg_config *cfg;
	__u32 zero = 0;
	__u32 daddr;
	__u32 saddr;
	struct arp_ipv4 *arp;
	__u64 mac;
	__u32 queue;
	struct port_info *in_info;
	struct port_info in = {}; /* all zeros: in no bridge */
	__u64 now = 0;
	int fwd;
	long ret;

	port_p = bpf_map_lookup_elem(&ports, &ifindex);
	if (!port_p)
		return XDP_PASS; /* not one of ours: untouched, uncounted */
	port_idx = *port_p;
	if (port_idx >= MAX_PORTS)
		return XDP_PASS; /* bad control-plane entry: fail open */

	eth = data;
	if ((void *)(eth + 1) > data_end)
		return pass(port_idx, CNT_PASSED); /* runt: not ours to judge */

	cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg)
		return pass(port_idx, CNT_PASSED);
	fwd = cfg->forward;
	if (fwd) {
		in_info = bpf_map_lookup_elem(&port_info, &port_idx);
		if (in_info)
			in = *in_info; /* one copy, see forward() */
		now = bpf_ktime_get_ns();
		/* The bridge learns in learning and forwarding state only. */
		if (in.bridge_ifindex != 0 &&
		    (in.stp_state == BR_STATE_LEARNING ||
		     in.stp_state == BR_STATE_FORWARDING))
			learn(eth, port_idx, now);
	}

	/* The switch's own MAC as a source: never forwarded, on the fast path
	 * or through the bridge (a host on a port spoofing it, or a loop). */
	mac = mac_key(eth->h_source);
	if (bpf_map_lookup_elem(&local_macs, &mac))
		return forged(port_idx);

	/* An ARP that claims one of its IPv4 addresses as the sender's: a
	 * host announcing itself as the switch (to draw the workers' DATA). */
	if (eth->h_proto == bpf_htons(ETH_P_ARP)) {
		arp = (void *)(eth + 1);
		if ((void *)(arp + 1) <= data_end &&
		    arp->ptype == bpf_htons(ETH_P_IP) && arp->plen == 4 &&
		    arp->hlen == ETH_ALEN) {
			__builtin_memcpy(&saddr, arp->spa, 4);
			if (bpf_map_lookup_elem(&own_addrs, &saddr))
				return forged(port_idx);
		}
	}

	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return forward(ctx, eth, port_idx, fwd, now, &in);

	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		return pass(port_idx, CNT_MALFORMED); /* claims IPv4, truncated */
	if (ip->version != 4 || ip->ihl < 5)
		return pass(port_idx, CNT_MALFORMED);
	/* The same for one of its own IPv4 addresses: a RESULT or NACK forged
	 * from the switch's address reaches no worker through it. */
	saddr = ip->saddr;
	if (bpf_map_lookup_elem(&own_addrs, &saddr))
		return forged(port_idx);
	if (ip->ihl != 5)
		return forward(ctx, eth, port_idx, fwd, now, &in); /* IP options */
	if (ip->frag_off & bpf_htons(0x3fff))
		return forward(ctx, eth, port_idx, fwd, now, &in); /* fragment */
	if (ip->protocol != IPPROTO_UDP)
		return forward(ctx, eth, port_idx, fwd, now, &in);

	udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > data_end)
		return pass(port_idx, CNT_MALFORMED); /* claims UDP, truncated */

	daddr = ip->daddr;
	if (!bpf_map_lookup_elem(&own_addrs, &daddr))
		return forward(ctx, eth, port_idx, fwd, now, &in);

	if (cfg->agg_port == 0 ||
	    (__u16)(bpf_ntohs(udp->dest) - bpf_ntohs(cfg->agg_port)) >=
		    (cfg->seq_lanes ? cfg->seq_lanes : 1))
		return forward(ctx, eth, port_idx, fwd, now, &in);

	if (cfg->mode == MODE_XDP_DROP) {
		count(port_idx, CNT_DROPPED); /* benchmark baseline only */
		return XDP_DROP;
	}

	queue = ctx->rx_queue_index;
	if (queue >= MAX_QUEUES)
		return pass(port_idx, CNT_PASSED); /* no XSKMAP slot for it */

	ret = bpf_redirect_map(&xsks, port_idx * MAX_QUEUES + queue, XDP_PASS);
	/* XDP_PASS here means no socket is registered for this queue. */
	count(port_idx, ret == XDP_REDIRECT ? CNT_STEERED : CNT_PASSED);
	return ret;
}

char _license[] SEC("license") = "GPL";
