"""The kernel's share of a delivered packet, named: which kernel work a perf sample was.

scripts/profile_packet.py splits a run's CPU into the agents' user time, their system
calls, softirq/irq work and the rest. This names the kernel part of it (the agents'
system calls and every softirq/irq sample): each sample goes to the first of its stack's
frames, from the innermost outward, that names a part below, so a copy inside
packet_sendmsg is the send system call's and a spin lock inside htb_dequeue is the
qdisc's.

    timer_interrupt   the APIC timer's interrupt and its hrtimers (the qdisc watchdogs
                      that pace shaped ports, perf's own sampling), arming them
    qdisc             enqueue and dequeue: HTB, tbf, the FIFOs, __qdisc_run
    classifier        tc classifiers (u32 on the DSCP, cls_bpf's entry)
    ebpf              the clsact eBPF counters' programs themselves
    veth              veth transmit and receive
    forwarding        IP receive, the route lookup and multipath hash, forward, output,
                      neighbours
    netdev            the device layer between them: queueing to the backlog, the
                      receive loop, GRO, flow dissection
    socket_send       the agents' send(2) below the syscall entry (packet_sendmsg, copy)
    socket_receive    the agents' receive: UDP and packet sockets, copy to user
    poll              select/poll/epoll
    scheduler         wake-ups and context switches
    memory            skb and page allocation and freeing
    timestamps        clock reads (ktime_get, read_tsc)
    syscall_entry     system call entry and exit, file-descriptor lookups
    other             anything else

A cpu-clock sample cannot land while interrupts are off (perf's own timer is an
interrupt): time spent with them off lands where they come back on. So a sample at
handle_softirqs just out of an APIC timer interrupt is that interrupt's handler (the
hrtimers it ran, a guest's exits to program the next one), and a sample at
_raw_spin_unlock_irqrestore goes to its caller, except that one straight under a qdisc's
dequeue is the watchdog being armed (hrtimer_start's tail calls leave no frame of their
own): `timer_interrupt` too.
"""

from __future__ import annotations

import re

PARTS = ("timer_interrupt", "qdisc", "classifier", "ebpf", "veth", "forwarding", "netdev",
         "socket_send", "socket_receive", "poll", "scheduler", "memory", "timestamps",
         "syscall_entry", "other")

_PATTERNS = (
    ("timer_interrupt", r"hrtimer_|__hrtimer|qdisc_watchdog|lapic_|clockevents_|tick_"
                        r"|__sysvec_apic_timer|sysvec_apic_timer|native_write_msr"
                        r"|hpet_|apic_timer"),
    ("timestamps", r"ktime_get|read_tsc|kvm_clock|pvclock_|__ktime"),
    ("ebpf", r"bpf_prog_|___bpf|__bpf_prog|bpf_skb_|bpf_map_|array_map_"),
    ("classifier", r"tcf_classify|u32_classify|cls_bpf|tcf_|__tcf_|tc_run|tcx_"),
    ("qdisc", r"htb_|tbf_|bfifo|pfifo|fifo_|qdisc_|__qdisc|sch_direct_xmit|dev_qdisc"
              r"|__dev_xmit_skb|netem_|drr_|psched_"),
    ("veth", r"veth_"),
    ("forwarding", r"ip_forward|ip_rcv|ip_route|ip_output|ip_finish_output|__ip_finish"
                   r"|ip_sublist|ip_list_rcv|ip_local|fib_|__fib|neigh_|ip_mkroute|rt_"
                   r"|dst_|udp_v4_early_demux|ip_skb_dst_mtu|nf_hook|ipv4_"),
    ("socket_send", r"packet_sendmsg|packet_snd|__sys_sendto|__x64_sys_sendto"
                    r"|sock_sendmsg|__sock_sendmsg|_copy_from_iter|sock_alloc_send"
                    r"|packet_direct_xmit|sendmsg"),
    ("socket_receive", r"packet_rcv|tpacket_rcv|packet_recvmsg|udp_|__udp|sock_def"
                       r"|skb_copy_datagram|__skb_datagram|raw_|skb_recv|__skb_recv"
                       r"|_copy_to_iter|sock_recvmsg|__sys_recvfrom|recvmsg|recvfrom"
                       r"|sock_queue_rcv|__sock_queue_rcv|skb_consume_udp"),
    ("poll", r"do_select|core_sys_select|do_sys_poll|ep_|__x64_sys_select"
             r"|__x64_sys_poll|__x64_sys_pselect|__x64_sys_epoll|poll_"),
    ("scheduler", r"schedule|__schedule|finish_task_switch|try_to_wake_up|ttwu_"
                  r"|pick_next|enqueue_task|dequeue_task|__wake_up|wake_up|update_curr"
                  r"|psi_|select_task_rq|sched_|switch_mm|__switch_to|do_nanosleep"),
    ("memory", r"__alloc_skb|alloc_skb|kfree_skb|__kfree_skb|skb_release|kmem_cache"
               r"|__slab|___slab|__kmalloc|kmalloc|kfree|consume_skb|skb_free"
               r"|napi_consume|__build_skb|page_frag|memcg|__memcg|skb_clone|pskb_"
               r"|__rmqueue|get_page_from|free_unref|__free_pages|__alloc_pages"),
    ("netdev", r"__dev_queue_xmit|dev_hard_start_xmit|netif_rx|__netif_rx"
               r"|enqueue_to_backlog|process_backlog|__netif_receive|netif_receive"
               r"|net_rx_action|net_tx_action|__napi|napi_|gro_|dev_gro|skb_flow_dissect"
               r"|__skb_flow_dissect|__skb_get_hash|eth_type_trans|validate_xmit"
               r"|dev_xmit|netdev_|skb_network_protocol|__netif_schedule"),
    ("syscall_entry", r"do_syscall_64|entry_SYSCALL|syscall_exit|__x64_sys|fdget|__fget"
                      r"|exit_to_user|syscall_return|__fdget|fput|x64_sys_call"),
)
_MATCH = [(name, re.compile(f"^(?:{pattern})")) for name, pattern in _PATTERNS]
# where interrupts come back on: the time before lands on these frames
_IRQS_ON = {"handle_softirqs", "__do_softirq", "_raw_spin_unlock_irqrestore",
            "_raw_spin_unlock_irq", "__local_bh_enable_ip", "irqentry_exit"}
_ARMS = re.compile(r"^(htb_dequeue|tbf_dequeue|qdisc_watchdog)")
_TIMER_IRQ = {"sysvec_apic_timer_interrupt", "asm_sysvec_apic_timer_interrupt",
              "__sysvec_apic_timer_interrupt"}


def _named(symbol: str) -> str | None:
    for name, pattern in _MATCH:
        if pattern.match(symbol):
            return name
    return None


def classify(symbols: list[str]) -> str:
    """The part a kernel sample belongs to, from its stack's symbols, innermost first
    (offsets already cut off)."""
    if not symbols:
        return "other"
    if symbols[0] in _IRQS_ON:
        # a timer interrupt that ended here: its handler's time (irqs were off)
        if symbols[0] in ("handle_softirqs", "__do_softirq") \
                and any(s in _TIMER_IRQ for s in symbols[1:4]):
            return "timer_interrupt"
        # a dequeue that ends in an irq-restoring unlock: the watchdog's hrtimer_start
        # (tail calls: its frames are gone), the time spent programming the timer
        if symbols[0] == "_raw_spin_unlock_irqrestore" and len(symbols) > 1 \
                and _ARMS.match(symbols[1]):
            return "timer_interrupt"
        symbols = symbols[1:]
    for symbol in symbols:
        name = _named(symbol)
        if name is not None:
            return name
    return "other"


def per_packet(counts: dict[str, float], packets: int) -> dict[str, float]:
    """Seconds per part to microseconds per delivered packet, every part present."""
    return {k: round(1e6 * counts.get(k, 0.0) / packets, 3) if packets else 0.0
            for k in PARTS}


# -- events: what the kernel did per packet, counted by perf stat -----------------------
EVENTS = {"timer_interrupts": "irq_vectors:local_timer_entry",
          "syscalls": "raw_syscalls:sys_enter",
          "context_switches": "sched:sched_switch",
          "device_transmits": "net:net_dev_xmit"}
EVENT_NAMES = {v: k for k, v in EVENTS.items()}


def parse_stat_intervals(text: str) -> list[tuple[float, str, int]]:
    """`perf stat -x, -I ms` output: (seconds since perf started, event, count) rows;
    rows perf could not count are left out."""
    rows = []
    for line in text.splitlines():
        f = line.strip().split(",")
        if len(f) < 4 or not f[1].strip().isdigit():
            continue
        try:
            rows.append((float(f[0]), f[3], int(f[1])))
        except ValueError:
            continue
    return rows


def window_counts(rows: list[tuple[float, str, int]], start_s: float,
                  window: tuple[float, float], interval_s: float) -> dict[str, float]:
    """Each event's count inside `window` (monotonic seconds): the intervals it covers,
    the two at its edges in proportion. `start_s` is perf's start on the same clock."""
    got: dict[str, float] = {}
    for t_end, event, count in rows:
        end = start_s + t_end
        begin = end - interval_s
        overlap = min(end, window[1]) - max(begin, window[0])
        if overlap > 0:
            name = EVENT_NAMES.get(event, event)
            got[name] = got.get(name, 0.0) + count * overlap / interval_s
    return got
