// SPDX-License-Identifier: GPL-2.0
/* How late the qdisc watchdog fires (fabric.shaping_timers): two tracepoint programs.
 *
 *   timer:hrtimer_start (function == qdisc_watchdog)        ─▶ timers[hrtimer] = expiry
 *   timer:hrtimer_expire_entry (function == qdisc_watchdog) ─▶ late = now - expiry
 *       ─▶ firings, sum, max, the firings later than the burst and by how much, and a
 *          histogram of `late` in 2^14 ns bins (one array value the loader mmaps)
 *
 * The records' field offsets come from the events' format files (cfg, set by the
 * loader), so no kernel structure layout is assumed; a tracepoint program may not read
 * its context at an offset it computes, so the fields are copied with
 * bpf_probe_read_kernel.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define TIMERS 16384                  /* armed watchdogs tracked at once */
#define BIN_SHIFT 14
#define BINS 1024                     /* the last bin holds everything later */

struct stats {
	__u64 firings, late_sum, late_max, over, over_sum, unmatched, pad[2];
	__u64 bins[BINS];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);               /* the hrtimer */
	__type(value, __u64);             /* its hard expiry, ns */
	__uint(max_entries, TIMERS);
} timers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct stats);
	__uint(max_entries, 1);
} stats SEC(".maps");

/* Set by the loader (fabric.shaping_timers.TimersConfig). */
const volatile struct {
	__u64 watchdog;                   /* &qdisc_watchdog, from /proc/kallsyms */
	__u64 burst_ns;
	__u32 start_hrtimer, start_function, start_expires;    /* hrtimer_start's fields */
	__u32 expire_hrtimer, expire_function, expire_now;     /* hrtimer_expire_entry's */
} cfg = {};

static __always_inline __u64 field(void *ctx, __u32 offset)
{
	__u64 value = 0;

	bpf_probe_read_kernel(&value, sizeof(value), ctx + offset);
	return value;
}

SEC("tracepoint")
int aft_wd_start(void *ctx)
{
	__u64 timer, expires;

	if (field(ctx, cfg.start_function) != cfg.watchdog)
		return 0;
	timer = field(ctx, cfg.start_hrtimer);
	expires = field(ctx, cfg.start_expires);
	bpf_map_update_elem(&timers, &timer, &expires, BPF_ANY);
	return 0;
}

SEC("tracepoint")
int aft_wd_fire(void *ctx)
{
	__u32 zero = 0;
	struct stats *s = bpf_map_lookup_elem(&stats, &zero);
	__u64 timer, *expiry, late, bin;

	if (!s || field(ctx, cfg.expire_function) != cfg.watchdog)
		return 0;
	timer = field(ctx, cfg.expire_hrtimer);
	expiry = bpf_map_lookup_elem(&timers, &timer);
	if (!expiry) {
		__sync_fetch_and_add(&s->unmatched, 1);   /* a firing never seen armed */
		return 0;
	}
	late = field(ctx, cfg.expire_now) - *expiry;
	if ((__s64)late < 0)
		late = 0;                 /* early, within its slack */
	__sync_fetch_and_add(&s->firings, 1);
	__sync_fetch_and_add(&s->late_sum, late);
	if (late > s->late_max)
		s->late_max = late;       /* racy: good enough for a peak */
	if (late > cfg.burst_ns) {
		__sync_fetch_and_add(&s->over, 1);
		__sync_fetch_and_add(&s->over_sum, late - cfg.burst_ns);
	}
	bin = late >> BIN_SHIFT;
	if (bin > BINS - 1)
		bin = BINS - 1;
	__sync_fetch_and_add(&s->bins[bin], 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
