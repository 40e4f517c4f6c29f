// ECN marking on the depth of a device's root qdisc: a tc-BPF program for
// the device's clsact egress hook (scripts/lib.sh build_ecn_marker, used by
// scripts/bench fairness and tree). It marks CE on ECT(0)/ECT(1) IPv4
// packets about to enter the root qdisc when that qdisc already holds more
// than MIN_BYTES (a -D at build time): with probability (backlog - MIN) /
// (MAX - MIN), always at MAX_BYTES or more. It counts what it saw in the
// array map ecn_counters (each load of the program has its own map): 0 ECT
// packets, 1 marked, 2 non-ECT packets, 3 sum of the backlog ECT packets
// found, 4 the same for non-ECT packets, 5 largest backlog seen.
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// Just the fields used; CO-RE finds them in the running kernel's BTF.
struct gnet_stats_queue { __u32 backlog; } __attribute__((preserve_access_index));
struct Qdisc { struct gnet_stats_queue qstats; } __attribute__((preserve_access_index));
struct net_device { struct Qdisc *qdisc; } __attribute__((preserve_access_index));
struct sk_buff { struct net_device *dev; } __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

enum { C_ECT, C_MARKED, C_OTHER, C_BACKLOG_ECT, C_BACKLOG_OTHER, C_BACKLOG_MAX, C_N };

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, C_N);
    __type(key, __u32);
    __type(value, __u64);
} ecn_counters SEC(".maps");

static __always_inline void add(__u32 k, __u64 v)
{
    __u64 *c = bpf_map_lookup_elem(&ecn_counters, &k);
    if (c)
        __sync_fetch_and_add(c, v);
}

SEC("tc")
int fair_ecn_mark(struct __sk_buff *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
        return TC_ACT_OK;

    struct sk_buff *kskb = bpf_cast_to_kern_ctx(ctx);
    struct net_device *dev = kskb->dev;
    if (!dev)
        return TC_ACT_OK;
    struct Qdisc *q = dev->qdisc;
    if (!q)
        return TC_ACT_OK;
    __u32 backlog = q->qstats.backlog;

    __u32 k = C_BACKLOG_MAX;
    __u64 *mx = bpf_map_lookup_elem(&ecn_counters, &k);
    if (mx && *mx < backlog)
        *mx = backlog;

    __u8 tos = ip->tos;
    __u8 ecn = tos & 3;
    if (ecn == 0 || ecn == 3) {
        // Not ECN-capable (or already CE): never marked, never dropped here.
        if (ecn == 0) {
            add(C_OTHER, 1);
            add(C_BACKLOG_OTHER, backlog);
        }
        return TC_ACT_OK;
    }
    add(C_ECT, 1);
    add(C_BACKLOG_ECT, backlog);
    if (backlog <= MIN_BYTES)
        return TC_ACT_OK;
    if (backlog < MAX_BYTES &&
        bpf_get_prandom_u32() % (MAX_BYTES - MIN_BYTES) >= backlog - MIN_BYTES)
        return TC_ACT_OK;

    // CE, and the IPv4 header checksum's first word (version/IHL, TOS).
    __u16 hi = (__u16)(*(__u8 *)ip) << 8;
    __be16 from = bpf_htons(hi | tos);
    __be16 to = bpf_htons(hi | (tos | 3));
    ip->tos = tos | 3;
    bpf_l3_csum_replace(ctx, ETH_HLEN + __builtin_offsetof(struct iphdr, check), from, to, 2);
    add(C_MARKED, 1);
    return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
