// SPDX-License-Identifier: GPL-2.0
/*
 * impair.bpf.c: a tc (cls_bpf, direct-action) program that impairs the
 * egress of a testbed interface, standing in for netem and RED-ECN, which
 * this project's CI kernel lacks. Built per use by scripts/impair.sh with
 * the parameters as -D defines:
 *
 *   LOSS_PPM       drop this many packets per million
 *   DUP_PPM        send this many per million twice (bpf_clone_redirect)
 *   REORDER_PPM    put this many per million into HTB class 1:20, a slower
 *                  class than the default 1:10, so they fall behind the rest
 *   INGRESS        1 when attached to the ingress hook (duplicates are
 *                  then re-injected on ingress; no reordering there)
 *   ECN_RATE_KBPS  with ECN_THRESH_BYTES: a phantom queue drained at this
 *                  rate; ECN-capable packets arriving while it holds more
 *                  than ECN_THRESH_BYTES get CE (as RED with `ecn` would on
 *                  the real queue of a link of that rate)
 *
 * Only IPv4 is touched; everything else passes. Test tooling, not part of
 * the switch.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
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
#ifndef ECN_THRESH_BYTES
#define ECN_THRESH_BYTES 30000
#endif

/* HTB class ids (major 1): skb->priority equal to a class id picks it. */
#define CLASS_SLOW 0x00010020

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

static __always_inline int chance(__u32 ppm)
{
	return ppm && (bpf_get_prandom_u32() % 1000000) < ppm;
}

SEC("tc")
int impair(struct __sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	/* Clones made below come back through here: leave them alone. */
	if (skb->mark == 0x1a7a1e)
		return TC_ACT_OK;
	if (chance(LOSS_PPM))
		return TC_ACT_SHOT;
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
			if (b > ECN_THRESH_BYTES)
				bpf_skb_ecn_set_ce(skb);
		}
	}
#endif
	if (!INGRESS && chance(REORDER_PPM))
		skb->priority = CLASS_SLOW;
	if (chance(DUP_PPM)) {
		__u32 mark = skb->mark;
		skb->mark = 0x1a7a1e;
		bpf_clone_redirect(skb, skb->ifindex, INGRESS ? BPF_F_INGRESS : 0);
		skb->mark = mark;
	}
	return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
