"""The kernel's share named (testbed.kernel_split, no root): a sample's stack picks its
part, perf stat's intervals are cut to the workload's window, and the ports' layout
switch (fabric.shaping.port_layout) takes only what it knows."""

from __future__ import annotations

import os

import pytest

from fabric.shaping import PLAIN, PORT_LAYOUT_ENV, SHAPED, layout_env, port_layout
from testbed.kernel_split import PARTS, classify, parse_stat_intervals, per_packet, window_counts


@pytest.mark.parametrize(("stack", "part"), [
    # innermost first: the first frame that names a part wins
    (["memcpy_orig", "_copy_from_iter", "packet_sendmsg", "__sys_sendto"], "socket_send"),
    (["_raw_spin_lock", "htb_dequeue", "__qdisc_run", "net_tx_action"], "qdisc"),
    (["fib_table_lookup", "ip_route_input_slow", "ip_rcv", "process_backlog"], "forwarding"),
    (["veth_xmit", "dev_hard_start_xmit", "sch_direct_xmit"], "veth"),
    (["bpf_prog_bdde612b084c90f1_aft_count", "cls_bpf_classify", "tcf_classify"], "ebpf"),
    (["u32_classify", "tcf_classify", "htb_enqueue"], "classifier"),
    (["read_tsc", "ktime_get", "htb_dequeue"], "timestamps"),
    (["kmem_cache_alloc_node_noprof", "__alloc_skb", "packet_sendmsg"], "memory"),
    (["do_select", "core_sys_select"], "poll"),
    (["finish_task_switch.isra.0", "__schedule"], "scheduler"),
    (["some_unknown_function"], "other"),
    ([], "other"),
    # interrupts back on: a timer interrupt's handler, or a watchdog armed in a dequeue
    (["handle_softirqs", "__irq_exit_rcu", "sysvec_apic_timer_interrupt"], "timer_interrupt"),
    (["_raw_spin_unlock_irqrestore", "htb_dequeue", "__qdisc_run"], "timer_interrupt"),
    # ... otherwise the frame that turned them back on is its caller's
    (["_raw_spin_unlock_irqrestore", "enqueue_to_backlog", "netif_rx_internal"], "netdev"),
    (["handle_softirqs", "__irq_exit_rcu", "common_interrupt", "ip_rcv"], "forwarding"),
])
def test_a_sample_goes_to_the_innermost_part_it_names(stack, part):
    assert part in PARTS
    assert classify(stack) == part


def test_per_packet_has_every_part():
    got = per_packet({"qdisc": 0.5, "veth": 0.25}, 100_000)
    assert set(got) == set(PARTS)
    assert got["qdisc"] == 5.0 and got["veth"] == 2.5 and got["other"] == 0.0
    assert set(per_packet({"qdisc": 1.0}, 0).values()) == {0.0}


STAT = """# started on Mon Dec  7 12:19:13 2026

     0.100199260,100,,raw_syscalls:sys_enter,200775590,100.00,,
     0.100199260,10,,irq_vectors:local_timer_entry,200775119,100.00,,
     0.200754413,200,,raw_syscalls:sys_enter,201151603,100.00,,
     0.200754413,<not counted>,,net:net_dev_xmit,0,100.00,,
     0.300754413,400,,raw_syscalls:sys_enter,201151603,100.00,,
"""


def test_perf_stat_intervals_are_cut_to_the_window():
    rows = parse_stat_intervals(STAT)
    assert len(rows) == 4 and rows[0] == (0.10019926, "raw_syscalls:sys_enter", 100)
    # perf started at 10.0 s; the window holds half the first interval, the second
    # whole and a quarter of the third
    got = window_counts(rows, 10.0, (10.05, 10.225), 0.1)
    assert got["syscalls"] == pytest.approx(100 * 0.5 + 200 + 400 * 0.25, rel=0.01)
    assert got["timer_interrupts"] == pytest.approx(10 * 0.5, rel=0.01)
    assert window_counts(rows, 10.0, (20.0, 21.0), 0.1) == {}


def test_port_layout_takes_only_what_it_knows(monkeypatch):
    monkeypatch.delenv(PORT_LAYOUT_ENV, raising=False)
    assert port_layout() == SHAPED
    with layout_env(PLAIN):
        assert port_layout() == PLAIN and os.environ[PORT_LAYOUT_ENV] == PLAIN
    assert PORT_LAYOUT_ENV not in os.environ                # restored
    monkeypatch.setenv(PORT_LAYOUT_ENV, "bare")
    with pytest.raises(ValueError, match="AFT_PORT_LAYOUT='bare': expected one of shaped"):
        port_layout()
    with pytest.raises(ValueError, match="expected one of"), layout_env("tbf"):
        pass
    assert os.environ[PORT_LAYOUT_ENV] == "bare"            # untouched by the refusal


@pytest.mark.root
@pytest.mark.parametrize("layout", [SHAPED, PLAIN])
def test_each_layout_forwards_and_plain_has_no_qdisc(fabric, layout):
    """Both layouts forward between every pair; the shaped ports hold HTB and a bfifo,
    the plain ones only the veth's own noqueue."""
    from fabric.probe import ping_all
    from topologies import one_tier
    with layout_env(layout):
        fab = fabric(one_tier(nodes=3, planes=1))
    reach = ping_all(fab, fab.topo.endpoints())
    assert all(reach.values()), reach
    for node in ("cpu0", "plane0"):
        with fab.ipr(node) as ipr:
            kinds = {q.get_attr("TCA_KIND") for q in ipr.get_qdiscs()
                     if q["index"] != 1}                          # not lo
        assert kinds == ({"htb", "bfifo"} if layout == SHAPED else {"noqueue"}), (node, kinds)
