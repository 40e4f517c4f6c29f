// SPDX-License-Identifier: GPL-2.0
/*
 * agg_xdp: steers aggregation UDP frames to AF_XDP sockets; everything else
 * continues up the normal stack untouched.
 *
 * A frame goes to the XSKMAP slot `port_idx * MAX_QUEUES + rx_queue_index`
 * only when ALL of these hold:
 *   - the ingress ifindex is in `ports` (else XDP_PASS, not counted),
 *   - Ethernet II, no VLAN tag, EtherType IPv4,
 *   - IPv4 with IHL == 5 (no options) and not a fragment,
 *   - protocol UDP,
 *   - destination address is in `own_addrs`,
 *   - UDP destination port == config.agg_port.
 * The redirect falls back to XDP_PASS when no socket sits in the slot.
 *
 * It FAILS OPEN: a frame it cannot parse is passed, never dropped. Frames
 * that claim IPv4 (or IPv4/UDP) but are truncated or carry a bad IHL are
 * counted as `malformed` and passed.
 *
 * The map layout is mirrored by switchd/src/xdp/loader.rs: keep them in sync.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_PORTS 64
#define MAX_QUEUES 64
#define MAX_OWN_ADDRS 256

enum counter_kind {
	CNT_STEERED = 0,
	CNT_PASSED = 1,
	CNT_MALFORMED = 2,
	CNT_PER_PORT = 4,
};

struct agg_config {
	__u16 agg_port; /* network byte order */
	__u16 _pad;
};

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
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_PORTS * CNT_PER_PORT);
	__type(key, __u32); /* port_idx * 4 + counter_kind */
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 port_idx, __u32 kind)
{
	__u32 key = port_idx * CNT_PER_PORT + kind;
	__u64 *v = bpf_map_lookup_elem(&counters, &key);

	if (v)
		*v += 1; /* per-CPU slot: no atomics needed */
}

/* `passed` counts every frame passed on a known port; `malformed` is the
 * subset of those that claimed IPv4/UDP but were truncated or had a bad IHL. */
static __always_inline int pass(__u32 port_idx, __u32 kind)
{
	count(port_idx, CNT_PASSED);
	if (kind == CNT_MALFORMED)
		count(port_idx, CNT_MALFORMED);
	return XDP_PASS;
}

SEC("xdp")
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
	__u32 queue;
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
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return pass(port_idx, CNT_PASSED);

	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		return pass(port_idx, CNT_MALFORMED); /* claims IPv4, truncated */
	if (ip->version != 4 || ip->ihl < 5)
		return pass(port_idx, CNT_MALFORMED);
	if (ip->ihl != 5)
		return pass(port_idx, CNT_PASSED); /* IP options: slow path */
	if (ip->frag_off & bpf_htons(0x3fff))
		return pass(port_idx, CNT_PASSED); /* fragment */
	if (ip->protocol != IPPROTO_UDP)
		return pass(port_idx, CNT_PASSED);

	udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > data_end)
		return pass(port_idx, CNT_MALFORMED); /* claims UDP, truncated */

	daddr = ip->daddr;
	if (!bpf_map_lookup_elem(&own_addrs, &daddr))
		return pass(port_idx, CNT_PASSED);

	cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->agg_port == 0 || udp->dest != cfg->agg_port)
		return pass(port_idx, CNT_PASSED);

	queue = ctx->rx_queue_index;
	if (queue >= MAX_QUEUES)
		return pass(port_idx, CNT_PASSED); /* no XSKMAP slot for it */

	ret = bpf_redirect_map(&xsks, port_idx * MAX_QUEUES + queue, XDP_PASS);
	/* XDP_PASS here means no socket is registered for this queue. */
	count(port_idx, ret == XDP_REDIRECT ? CNT_STEERED : CNT_PASSED);
	return ret;
}

char _license[] SEC("license") = "GPL";
