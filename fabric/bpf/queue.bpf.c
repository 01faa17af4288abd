// SPDX-License-Identifier: GPL-2.0
/* A switch port's lossless-class programs (fabric.queue_counters loads them, one object
 * per hook, its `cfg` set before the load; the verifier drops what cfg turns off).
 *
 *   aft_count / aft_count_wake   tc clsact, a port's egress or its peer's ingress:
 *       an IPv4 frame of DSCP cfg.dscp  ─▶ [VOQ: its destination's queue, sub]
 *       ─▶ [trim: a UET data frame that would pass the
 *       threshold is cut to its headers, counted as trimmed, not as queued]
 *       ─▶ counters[slot] += (len, 1)  ─▶ [by ingress: counters[base + j] += (len, 1),
 *       j the port it came in by]  ─▶ [wake: the first frame while the controller is
 *       armed wakes it through the ring]  ─▶ [ECN: CE on the RED profile of the queue]
 *   aft_arm   run by the controller (BPF_PROG_TEST_RUN): armed = 1, a full barrier
 *
 * The queue of a port is counters[slot] (bytes in) - counters[slot + 1] (bytes out) -
 * counters[dropped].bytes (the controller writes the qdisc's drops there).
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "wire.h"                     /* the wire offsets, struct count (fabric.wire) */

#define MAX_PORTS 128                 /* ports of one switch that attribution names */
#define MAX_DSTS 64                   /* a port's virtual output queues (fabric.voq) */
#define PROB_ONE 65536

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct count);
	__uint(max_entries, 1);           /* the loader reuses the controller's map */
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);        /* the loader reuses the controller's ring */
} ring SEC(".maps");

/* Set by the loader (fabric.queue_counters.Hook); a feature is off at 0. */
const volatile struct {
	__u32 slot;                       /* this hook's (bytes, frames) entry */
	__u32 dscp;
	__u32 ingress_base;               /* base + j: came in by port j; base + n: other */
	__u32 ingress_ports;              /* n (0: no attribution) */
	__u32 dropped;                    /* (bytes the qdisc dropped, CE marks) entry */
	__u32 ecn_kmax;                   /* ECN: marks above kmin, all from kmax (0: off) */
	__u32 ecn_kmin;
	__u32 ecn_p16;                    /* pmax in 1/65536ths */
	__u32 trim_threshold;             /* trimming: the queue past which (0: off) */
	__u32 trim_entry;                 /* (bytes, frames) trimmed */
	__u32 wake_entry;                 /* (armed, wakes) */
	__u32 ifindex[MAX_PORTS];         /* the switch's ports, in attribution order */
	__u32 dst_count;                  /* virtual output queues: 0 none, else the port's */
	__u32 dst_addr[MAX_DSTS];         /* destinations (IPv4, as on the wire): queue 1 + j */
} cfg = {};

static __always_inline struct count *entry(__u32 key)
{
	return bpf_map_lookup_elem(&counters, &key);
}

static __always_inline int add(__u32 key, __u64 len)
{
	struct count *c = entry(key);

	if (!c)
		return -1;
	__sync_fetch_and_add(&c->bytes, len);
	__sync_fetch_and_add(&c->frames, 1);
	return 0;
}

/* Queue `sub` of the port (0: its lossless class, 1 + j: the virtual output queue of
 * destination j): bytes in - bytes out - bytes its qdisc dropped. Its entries follow the
 * port's: (in, out) at slot + 2 sub, attribution at ingress_base + sub (ports + 1). */
static __always_inline int queued(__u32 sub, __s64 *q)
{
	struct count *in = entry(cfg.slot + 2 * sub), *out = entry(cfg.slot + 1 + 2 * sub);
	struct count *dropped = entry(cfg.dropped + sub);

	if (!in || !out || !dropped)
		return -1;
	*q = (__s64)(in->bytes - out->bytes - dropped->bytes);
	return 0;
}

enum { KEEP, TRIMMED, BROKEN };

static __always_inline int trim(struct __sk_buff *skb, __u32 sub)
{
	__u8 hdr[BTH_DQPN_AT + 1 - IP_AT];   /* IPv4, UDP, BTH up to the dQPN */
	__u32 len = skb->len;
	__u16 old0, old_len, word[2];
	__s64 q;

	if (queued(sub, &q) || len <= TRIMMED_FRAME_BYTES)
		return KEEP;
	if (q + len <= (__s64)cfg.trim_threshold)
		return KEEP;
	if (bpf_skb_load_bytes(skb, IP_AT, hdr, sizeof(hdr)))
		return KEEP;              /* a short frame: not UET data */
	if (hdr[0] != IP_VERSION_IHL || hdr[IP_PROTO_AT - IP_AT] != IP_PROTO_UDP)
		return KEEP;
	if (*(__u16 *)&hdr[UDP_DPORT_AT - IP_AT] != bpf_htons(ROCE_UDP_PORT))
		return KEEP;
	if (hdr[BTH_OPCODE_AT - IP_AT] > DATA_OPCODE_MAX)
		return KEEP;              /* an ACK or CNP: never trimmed */
	if (!(hdr[BTH_DQPN_AT - IP_AT] & UET_QPN_FLAG_BYTE))
		return KEEP;              /* RoCE (RC): never trimmed */
	if (bpf_skb_change_tail(skb, TRIMMED_FRAME_BYTES, 0))
		return KEEP;              /* could not cut: it goes whole */
	old0 = *(__u16 *)&hdr[0];
	old_len = *(__u16 *)&hdr[IP_LEN_AT - IP_AT];
	word[0] = bpf_htons(IP_VERSION_IHL << 8 | TRIM_DSCP << DSCP_SHIFT |
			    (hdr[IP_TOS_AT - IP_AT] & ECN_MASK));   /* ECN kept */
	word[1] = bpf_htons(TRIMMED_FRAME_BYTES - ETH_BYTES);
	if (bpf_skb_store_bytes(skb, IP_AT, word, 4, 0) ||
	    bpf_l3_csum_replace(skb, IP_CSUM_AT, old0, word[0], 2) ||
	    bpf_l3_csum_replace(skb, IP_CSUM_AT, old_len, word[1], 2))
		return BROKEN;
	word[0] = bpf_htons(UDP_BYTES + TRIMMED_UDP_PAYLOAD);
	word[1] = 0;                      /* UDP checksum: none */
	if (bpf_skb_store_bytes(skb, UDP_LEN_AT, word, 4, 0))
		return BROKEN;
	add(cfg.trim_entry + sub, len);
	return TRIMMED;
}

static __always_inline void attribute(struct __sk_buff *skb, __u32 sub)
{
	__u32 base = cfg.ingress_base + sub * (cfg.ingress_ports + 1);
	__u32 key = base + cfg.ingress_ports;
	__u32 from = skb->ingress_ifindex;

	for (__u32 j = 0; j < MAX_PORTS && j < cfg.ingress_ports; j++) {
		if (cfg.ifindex[j] == from) {
			key = base + j;
			break;
		}
	}
	add(key, skb->len);
}

static __always_inline void wake(void)
{
	struct count *e = entry(cfg.wake_entry);
	__u64 now;

	if (!e || !e->bytes || !__sync_lock_test_and_set(&e->bytes, 0))
		return;                   /* not armed, or another CPU took it */
	__sync_fetch_and_add(&e->frames, 1);
	now = bpf_ktime_get_ns();
	bpf_ringbuf_output(&ring, &now, sizeof(now), BPF_RB_FORCE_WAKEUP);
}

static __always_inline void mark_ce(struct __sk_buff *skb, __u32 sub)
{
	struct count *marks;
	__u64 draw;
	__s64 q;

	if (queued(sub, &q) || q <= (__s64)cfg.ecn_kmin)
		return;
	if (q < (__s64)cfg.ecn_kmax) {
		draw = (bpf_get_prandom_u32() & (PROB_ONE - 1)) *
		       (__u64)(cfg.ecn_kmax - cfg.ecn_kmin);
		if (draw >= (__u64)(q - cfg.ecn_kmin) * cfg.ecn_p16)
			return;
	}
	if (!bpf_skb_ecn_set_ce(skb))
		return;                   /* not ECT: nothing marked */
	marks = entry(cfg.dropped + sub);
	if (marks)
		__sync_fetch_and_add(&marks->frames, 1);
}

/* The frame's queue at a port with virtual output queues: 1 + j for destination j, 0
 * for any other (or a frame too short to say). */
static __always_inline __u32 dest_queue(struct __sk_buff *skb)
{
	__u32 dst;

	if (bpf_skb_load_bytes(skb, IP_DST_AT, &dst, sizeof(dst)))
		return 0;
	for (__u32 j = 0; j < MAX_DSTS && j < cfg.dst_count; j++) {
		if (cfg.dst_addr[j] == dst)
			return 1 + j;
	}
	return 0;
}

static __always_inline int count(struct __sk_buff *skb, int may_wake)
{
	__u8 head[IP_TOS_AT + 1 - ETH_TYPE_AT];   /* ethertype, IPv4 version/IHL and TOS */
	__u32 sub = 0;

	/* copied, not read in place: a frame an agent sends through AF_PACKET has only
	 * its Ethernet header in the linear part */
	if (bpf_skb_load_bytes(skb, ETH_TYPE_AT, head, sizeof(head)))
		return TC_ACT_UNSPEC;
	if (*(__u16 *)head != bpf_htons(ETHERTYPE_IPV4) ||
	    head[IP_TOS_AT - ETH_TYPE_AT] >> DSCP_SHIFT != cfg.dscp)
		return TC_ACT_UNSPEC;
	if (cfg.dst_count)
		sub = dest_queue(skb);
	if (cfg.trim_threshold) {
		int done = trim(skb, sub);

		if (done == TRIMMED)
			return TC_ACT_UNSPEC;
		if (done == BROKEN)
			return TC_ACT_SHOT;   /* cut but not mended: dropped */
	}
	if (add(cfg.slot + 2 * sub, skb->len))
		return TC_ACT_UNSPEC;
	if (cfg.ingress_ports)
		attribute(skb, sub);
	if (may_wake)
		wake();
	if (cfg.ecn_kmax)
		mark_ce(skb, sub);
	return TC_ACT_UNSPEC;
}

SEC("tc")
int aft_count(struct __sk_buff *skb)
{
	return count(skb, 0);
}

SEC("tc")
int aft_count_wake(struct __sk_buff *skb)
{
	return count(skb, 1);
}

SEC("tc")
int aft_arm(struct __sk_buff *skb)
{
	struct count *e = entry(cfg.wake_entry);

	if (e)
		__sync_lock_test_and_set(&e->bytes, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
