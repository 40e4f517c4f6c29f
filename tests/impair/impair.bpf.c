// SPDX-License-Identifier: GPL-2.0
/*
 * impair.bpf.c: a tc (cls_bpf, direct-action) program that impairs what a
 * testbed interface sends or receives, standing in for netem and RED-ECN,
 * which this project's CI kernel lacks. The one copy used by
 * scripts/impair.sh (and through it tests/tests/faults.rs,
 * tests/tests/congestion.rs and scripts/bench soak), built per use with the
 * parameters as -D defines:
 *
 *   LOSS_PPM        drop this many packets per million
 *   DUP_PPM         send this many per million twice (bpf_clone_redirect)
 *   REORDER_PPM     delay this many per million behind the rest: on egress
 *                   they go to HTB class 1:20, slower than the default 1:10;
 *                   on ingress they are redirected to IFB_IFINDEX, an ifb
 *                   whose slow HTB class hands them back to the interface
 *   INGRESS         1 when attached to the ingress hook (duplicates are then
 *                   re-injected on ingress)
 *   IFB_IFINDEX     ingress only: the ifb for the delayed share (0: none)
 *   MATCH_UDP_PORT  impair only UDP over IPv4 from or to this port (0: every
 *                   IPv4 packet)
 *   ECN_RATE_KBPS   with ECN_THRESH_BYTES: a phantom queue drained at this
 *                   rate; ECN-capable packets arriving while it holds more
 *                   than ECN_THRESH_BYTES get CE (as RED with `ecn` would on
 *                   the real queue of a link of that rate)
 *
 * The `counts` map counts what it did (see enum count); `scripts/impair.sh
 * NS DEV --stats [--ingress]` prints it. Everything not matched passes
 * untouched. Test tooling, not part of the switch.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef LOSS_PPM
#define LOSS_PPM 0
#endif
#ifndef DUP_PPM
#define DUP_PPM 0
#endif
#ifndef REORDER_PPM
#define REORDER_PPM 0
#endif
#ifndef ECN_RATE_KBPS
#define ECN_RATE_KBPS 0
#endif
#ifndef INGRESS
#define INGRESS 0
#endif
#ifndef IFB_IFINDEX
#define IFB_IFINDEX 0
#endif
#ifndef MATCH_UDP_PORT
#define MATCH_UDP_PORT 0
#endif
#ifndef ECN_THRESH_BYTES
#define ECN_THRESH_BYTES 30000
#endif

/* HTB class ids (major 1): skb->priority equal to a class id picks it. */
#define CLASS_SLOW 0x00010020
/* Marks the clones made below, which come back through this program. */
#define CLONE_MARK 0x1a7a1e

enum count { SEEN, DROPPED, DUPLICATED, DELAYED, MARKED, N_COUNTS };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, N_COUNTS);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

struct phantom {
	__u64 last_ns;
	__u64 backlog;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct phantom);
} phantom_q SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&counts, &i);

	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline int chance(__u32 ppm)
{
	return ppm && (bpf_get_prandom_u32() % 1000000) < ppm;
}

/* An IPv4 packet to impair: all of them, or UDP from/to MATCH_UDP_PORT. */
static __always_inline int matches(struct __sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return 0;
#if MATCH_UDP_PORT
	bpf_skb_pull_data(skb, sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr));
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	struct udphdr *u = (void *)(ip + 1);

	if ((void *)(u + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP ||
	    (ip->frag_off & bpf_htons(0x1fff)))
		return 0;
	return u->source == bpf_htons(MATCH_UDP_PORT) || u->dest == bpf_htons(MATCH_UDP_PORT);
#else
	return 1;
#endif
}

SEC("tc")
int impair(struct __sk_buff *skb)
{
	if (skb->mark == CLONE_MARK || !matches(skb))
		return TC_ACT_OK;
	count(SEEN);
	if (chance(LOSS_PPM)) {
		count(DROPPED);
		return TC_ACT_SHOT;
	}
#if ECN_RATE_KBPS > 0
	{
		__u32 k = 0;
		struct phantom *q = bpf_map_lookup_elem(&phantom_q, &k);

		if (q) {
			__u64 now = bpf_ktime_get_ns();
			__u64 drained = (now - q->last_ns) * ECN_RATE_KBPS / 8000000ULL;
			__u64 b = q->backlog > drained ? q->backlog - drained : 0;

			b += skb->len;
			q->backlog = b;
			q->last_ns = now;
			if (b > ECN_THRESH_BYTES && bpf_skb_ecn_set_ce(skb))
				count(MARKED);
		}
	}
#endif
	if (chance(DUP_PPM)) {
		__u32 mark = skb->mark;

		count(DUPLICATED);
		skb->mark = CLONE_MARK;
		bpf_clone_redirect(skb, skb->ifindex, INGRESS ? BPF_F_INGRESS : 0);
		skb->mark = mark;
	}
	if (chance(REORDER_PPM)) {
#if INGRESS
		if (IFB_IFINDEX) {
			count(DELAYED);
			return bpf_redirect(IFB_IFINDEX, 0);
		}
#else
		count(DELAYED);
		skb->priority = CLASS_SLOW;
#endif
	}
	return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
