// SPDX-License-Identifier: GPL-2.0
/* Switch-side load balancing (fabric.switch_lb): the ingress program of one switch's
 * ports picks the egress among a destination's equal-cost next hops by how loaded they
 * are, and sets the skb hash that makes the kernel's multipath routing take it.
 *
 *   dst IP ─▶ routes[(switch, dst)] (longest prefix): the next hops, each with its egress
 *   port's counter slot and the path hash that selects it
 *   quality of each = in - out - dropped (its queue) + load (bytes sent lately, raised by
 *   every frame steered there); the least wins, ties to the first from a start the flow
 *   hash (dlb) or a random number (adaptive) picks
 *   dlb: a flow keeps its egress until idle for cfg.gap_ns (flowlets[switch, hash])
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "wire.h"                     /* the wire offsets, struct count (fabric.wire) */

#define MAX_PATHS 8
#define FLOWLET_SLOTS 4096            /* flow-hash buckets per switch (a power of 2) */

struct route_key {
	__u32 prefixlen;                  /* 32 + the route's prefix: the switch is exact */
	__u32 switch_no;
	__u32 dst;                        /* network order */
};

struct route {
	__u32 n;                          /* next hops (1: the kernel's choice) */
	__u32 pad;
	struct {
		__u32 slot;               /* its egress port's counter slot */
		__u32 hash;               /* the skb hash the kernel maps to it */
	} hop[MAX_PATHS];
};

struct flowlet {
	__u64 last_ns;
	__u32 flow;
	__u32 choice;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct count);
	__uint(max_entries, 1);           /* the loader reuses the counters' map */
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct route_key);
	__type(value, struct route);
	__uint(max_entries, 1);           /* the loader's, filled from the kernel's routes */
} routes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct flowlet);
	__uint(max_entries, 1);           /* the loader's: FLOWLET_SLOTS per switch */
} flowlets SEC(".maps");

/* Set by the loader (fabric.switch_lb.LbConfig). */
const volatile struct {
	__u32 switch_no;
	__u32 dlb;                        /* 1: per flowlet; 0: adaptive, per packet */
	__u64 gap_ns;
	__u32 ecn_base;                   /* (dropped bytes, marks) entries, per slot */
	__u32 load_base;                  /* (recent bytes, frames steered) entries */
} cfg = {};

static __always_inline __u64 bytes_at(__u32 key, int *missing)
{
	struct count *c = bpf_map_lookup_elem(&counters, &key);

	if (!c) {
		*missing = 1;
		return 0;
	}
	return c->bytes;
}

SEC("tc")
int aft_lb(struct __sk_buff *skb)
{
	struct route_key key = {.prefixlen = 64, .switch_no = cfg.switch_no};
	struct flowlet *bucket = NULL;
	__u32 n, start, best_i = 0, hash = 0, bucket_key;
	__s64 best_q = 0x7FFFFFFFFFFFFFFFLL;
	struct count *load;
	struct route *r;
	__u16 ethertype;
	__u64 now;

	if (bpf_skb_load_bytes(skb, ETH_TYPE_AT, &ethertype, 2) ||
	    ethertype != bpf_htons(ETHERTYPE_IPV4))
		return TC_ACT_UNSPEC;     /* not IPv4: the kernel's choice */
	if (bpf_skb_load_bytes(skb, IP_DST_AT, &key.dst, 4))
		return TC_ACT_UNSPEC;
	r = bpf_map_lookup_elem(&routes, &key);
	if (!r || r->n <= 1)
		return TC_ACT_UNSPEC;     /* no route, or one next hop: the kernel's */
	n = r->n;
	now = bpf_ktime_get_ns();
	if (cfg.dlb) {
		hash = bpf_get_hash_recalc(skb);
		bucket_key = (hash & (FLOWLET_SLOTS - 1)) + cfg.switch_no * FLOWLET_SLOTS;
		bucket = bpf_map_lookup_elem(&flowlets, &bucket_key);
		if (!bucket)
			return TC_ACT_UNSPEC;
		if (bucket->flow == hash && now - bucket->last_ns <= cfg.gap_ns) {
			best_i = bucket->choice;      /* the same flowlet: its egress stays */
			goto chosen;
		}
		start = hash % n;
	} else {
		start = bpf_get_prandom_u32() % n;
	}
	for (__u32 j = 0; j < MAX_PATHS; j++) {
		__u32 idx = start + j, slot;
		int missing = 0;
		__s64 q;

		if (j >= n)
			break;
		if (idx >= n)
			idx -= n;
		if (idx >= MAX_PATHS)
			return TC_ACT_UNSPEC;
		slot = r->hop[idx].slot;
		q = (__s64)(bytes_at(2 * slot, &missing) - bytes_at(2 * slot + 1, &missing) -
			    bytes_at(cfg.ecn_base + slot, &missing) +
			    bytes_at(cfg.load_base + slot, &missing));
		if (missing)
			return TC_ACT_UNSPEC;
		if (q < best_q) {
			best_q = q;
			best_i = idx;
		}
	}
chosen:
	if (best_i >= MAX_PATHS)
		return TC_ACT_UNSPEC;
	if (bucket) {
		bucket->last_ns = now;
		bucket->flow = hash;
		bucket->choice = best_i;
	}
	bpf_set_hash(skb, r->hop[best_i].hash);   /* the kernel takes that path */
	bucket_key = cfg.load_base + r->hop[best_i].slot;
	load = bpf_map_lookup_elem(&counters, &bucket_key);
	if (load) {                       /* its load += this frame, at once */
		__sync_fetch_and_add(&load->bytes, skb->len);
		__sync_fetch_and_add(&load->frames, 1);
	}
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "GPL";
