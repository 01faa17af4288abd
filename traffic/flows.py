"""An agent's flows and steps: built once from its config, then gated as data arrives.

    AgentConfig.steps x iterations ─▶ AgentFlows: SendFlow / RecvFlow per transfer, each with
        its entropy, egress ports and patchable frames (templates built with scapy, once)
    AgentFlows.advance(now): start every step whose gate is open; AgentFlows.flow_done(f, now)

Steps: a step's sends start when every receive of the rank's previous step has
completed. Step 0 of iteration i+1 also waits for iteration i to be done at this rank
(its receives complete and its sends acknowledged), so iterations never overlap, even
for ranks that only send. Data arriving for a later step or iteration is accounted at
once (receivers are keyed by message id, `recv_by_msg`). Message ids on the wire are
`msg_id + iteration * 2**20`; ACKs carry their low 24 bits in the AETH MSN
(`send_by_msn`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from topologies import units
from traffic.agent_config import ITERATION_MSG_STRIDE, MSN_MASK, AgentConfig, ConfigError, qpn
from traffic.cc import CnpGate, Dcqcn
from traffic.entropy import Entropy
from traffic.nscc import NsccSender
from traffic.packets import CNP_DSCP, ECN_NOT_ECT, QPN_MASK, Addresses, Opcode, Patcher, Template
from traffic.port import Port, ack_queue, dest_queue
from traffic.transport import make_sender, packet_bytes, packet_count
from traffic.transport_settings import STAMP_BYTES


@dataclass(eq=False)
class Flow:
    tag: str
    src: str
    dst: str
    size_bytes: int
    iteration: int
    msg: int                 # message id on the wire
    role: str
    start_ns: int | None = None
    end_ns: int | None = None
    path_ns: float = 0.0     # ns per byte at its path's bottleneck (0: the port's rate)

    @property
    def msn(self) -> int:
        return self.msg & MSN_MASK


@dataclass(eq=False)
class SendFlow(Flow):
    tx: object = None
    entropy: Entropy | None = None
    ports: list[Port] = field(default_factory=list)
    slots: list[tuple] = field(default_factory=list)   # per port: 4 x (buf, patch)
    npackets: int = 0
    cc: Dcqcn | None = None  # its QP's DCQCN state (shared by the flows to one peer)
    starved_ns: float = 0.0  # its ports' starvation (traffic.port) while it ran

    def results(self) -> dict:
        tx = self.tx
        ent = self.entropy
        return {
            "tag": self.tag, "iteration": self.iteration, "src": self.src, "dst": self.dst,
            "size_bytes": self.size_bytes, "role": "send", "start_ns": self.start_ns,
            "end_ns": self.end_ns, "npackets": self.npackets,
            "packets": tx.packets if tx else 0,
            "retransmits": tx.retransmits if tx else 0, "naks": tx.naks if tx else 0,
            "timeouts": tx.timeouts if tx else 0, "acks": tx.acks if tx else 0,
            "rto_wait_ns": tx.rto_wait_ns if tx else 0,
            "rtt_mean_ns": tx.rtt_sum_ns // tx.rtt_samples if tx and tx.rtt_samples else None,
            "window_packets": tx.window if tx else None,
            "starved_ns": int(self.starved_ns) if self.end_ns is not None else None,
            "ooo_packets": 0, "dup_packets": 0, "max_reorder": 0,
            "bytes_delivered": (self.size_bytes if self.end_ns is not None else 0),
            "exactly_once": None, "flowlet_changes": ent.changes,
            # its path: the sport every packet carries (None: it varies) and its ports
            "sport": ent.fixed, "ifnames": [p.ifname for p in self.ports]}


@dataclass(eq=False)
class RecvFlow(Flow):
    rx: object = None
    entropy: Entropy | None = None
    ports: list[Port] = field(default_factory=list)
    acks: list[Patcher] = field(default_factory=list)   # per port: Template.ack_patcher
    npackets: int = 0
    last_wire: int = 0       # wire payload of the last packet (at least the stamp)
    samples: int = 0
    last_ns: int = 0         # last data arrival (the delayed-ACK timer runs from it)
    gate: CnpGate | None = None     # cc = dcqcn: its QP's CNP rate limit
    cnps: list[tuple] = field(default_factory=list)   # per port: (buf, patch) of a CNP

    def results(self) -> dict:
        rx = self.rx
        return {
            "tag": self.tag, "iteration": self.iteration, "src": self.src, "dst": self.dst,
            "size_bytes": self.size_bytes, "role": "recv", "start_ns": self.start_ns,
            "end_ns": self.end_ns, "npackets": self.npackets,
            "packets": rx.packets if rx else 0, "retransmits": 0,
            "naks": rx.naks if rx else 0, "timeouts": 0, "acks": rx.acks if rx else 0,
            "ooo_packets": rx.ooo_packets if rx else 0,
            "dup_packets": rx.dup_packets if rx else 0,
            "max_reorder": rx.max_reorder if rx else 0,
            "trimmed": rx.trimmed if rx else 0,     # arrived cut to headers (a switch's)
            "bytes_delivered": rx.bytes_delivered if rx else 0,
            "exactly_once": bool(rx and rx.exactly_once),
            "flowlet_changes": self.entropy.changes}     # of its ACKs


@dataclass(eq=False)
class StepState:
    iteration: int
    index: int
    sends: list[SendFlow]
    recvs: list[RecvFlow]
    # a job's step (traffic.job): what it waits for, what it computes, when it did what
    after: tuple = ()
    compute_ns: int = 0
    label: str = ""
    op: int = -1
    ready_ns: int | None = None      # its dependencies were done
    begin_ns: int | None = None      # its computation began (the stream was free)
    sent_ns: int | None = None       # its computation ended and its sends began
    done_ns: int | None = None       # ... and its receives have all arrived
    waiting: int = 0                 # dependencies not yet done
    due_ns: int = 0                  # when the last of them was done (as due, see below)

    def record(self) -> dict:
        return {"iteration": self.iteration, "index": self.index, "op": self.op,
                "label": self.label, "compute_ns": self.compute_ns,
                "ready_ns": self.ready_ns, "begin_ns": self.begin_ns,
                "sent_ns": self.sent_ns, "done_ns": self.done_ns}


class AgentFlows:
    """Every flow of every step and iteration of one agent, and which have started."""

    def __init__(self, cfg: AgentConfig, ports: dict[str, Port]):
        self.cfg = cfg
        self.params = cfg.params
        self.ports = ports
        self._templates: dict[tuple, tuple[bytearray, object]] = {}
        self._ack_templates: dict[tuple, tuple[Template, bytearray]] = {}
        self.steps: list[StepState] = []
        self.sends: list[SendFlow] = []
        self.recvs: list[RecvFlow] = []
        self.recv_by_msg: dict[int, RecvFlow] = {}
        self.send_by_msn: dict[int, SendFlow] = {}
        self.cc_by_qpn: dict[int, Dcqcn] = {}     # cc = dcqcn: per QP (peer) we send to
        self.gates: dict[str, CnpGate] = {}       # ... and per QP (peer) we receive from
        self.active: list[SendFlow] = []         # started, not acknowledged
        self.receiving: list[RecvFlow] = []      # started, not complete
        self.next_step = 0
        self.iter_start: list[int | None] = [None] * cfg.iterations
        self.iter_end: list[int | None] = [None] * cfg.iterations
        self.iter_left = [0] * cfg.iterations
        self.done_ns: int | None = None
        # a job (steps with dependencies or computation) runs as a graph, else in order
        self.graph = any("after" in s or s.get("compute_ns") for s in cfg.steps)
        self.wake_ns: int | None = None          # the next computation to end (graph)
        self._computing: list[StepState] = []
        self._step_of: dict[int, StepState] = {}  # recv message id -> its step
        self._compute_free = 0                   # the compute stream is busy until then
        self._it = 0                             # the iteration the graph runs
        self._needed: list[list[int]] = []        # per step: the steps that wait for it
        for it in range(cfg.iterations):
            for k, step in enumerate(cfg.steps):
                sends = [self._send_flow(t, it) for t in step.get("sends", [])]
                recvs = [self._recv_flow(t, it) for t in step.get("recvs", [])]
                after = step.get("after")
                st = StepState(it, k, sends, recvs,
                               tuple(after) if after is not None else
                               ((k - 1,) if k else ()),
                               int(step.get("compute_ns", 0)), step.get("label", ""),
                               int(step.get("op", -1)))
                self.steps.append(st)
                self.iter_left[it] += len(sends) + len(recvs)
                if self.graph:
                    for f in recvs:
                        self._step_of[f.msg] = st
        if self.graph:
            self._needed = [[] for _ in cfg.steps]
            for k, step in enumerate(self.steps[:len(cfg.steps)]):
                for d in step.after:
                    if not 0 <= d < k:
                        raise ConfigError(f"step {k}: waits for step {d}, not an earlier one")
                    self._needed[d].append(k)

    # -- building ----------------------------------------------------------------------
    def _flow_ports(self, peer: str) -> list[Port]:
        """The queues a flow toward `peer` sends on: its own per egress where the NIC
        keeps one per destination (traffic.port.nic_ports), else the egress's."""
        ports = self.ports
        return [ports.get(dest_queue(i, peer)) or ports[i] for i in self.cfg.routes[peer]]

    def _reply_ports(self, peer: str) -> list[Port]:
        """The queues ACKs and CNPs toward `peer` go out on: the control queue where they
        have one (ack_class "control"), else its data's."""
        ports = self.ports
        return [ports.get(ack_queue(i)) or ports.get(dest_queue(i, peer)) or ports[i]
                for i in self.cfg.routes[peer]]

    def _path_ns(self, peer: str) -> float:
        mbps = self.cfg.path_mbps.get(peer)
        return units.ns_per_byte(mbps) if mbps else 0.0

    def _send_flow(self, t: dict, it: int) -> SendFlow:
        cfg = self.cfg
        if t["src"] != cfg.node:
            raise ConfigError(f"send {t['tag']}: src is {t['src']}, not {cfg.node}")
        msg = int(t["msg_id"]) + it * ITERATION_MSG_STRIDE
        size = int(t["size_bytes"])
        n = packet_count(size, cfg.payload_bytes)
        f = SendFlow(t["tag"], t["src"], t["dst"], size, it, msg, "send",
                     entropy=Entropy(cfg.entropy, cfg.seed, f"{t['tag']}#{it}",
                                     cfg.flowlet_gap_us),
                     ports=self._flow_ports(t["dst"]), npackets=n,
                     path_ns=self._path_ns(t["dst"]))
        f.slots = [self._data_slots(t["dst"], port.ifname, size, n) for port in f.ports]
        if cfg.cc == "dcqcn":
            f.cc = self._reaction_point(t["dst"])
        self.sends.append(f)
        return f

    def _recv_flow(self, t: dict, it: int) -> RecvFlow:
        cfg = self.cfg
        if t["dst"] != cfg.node:
            raise ConfigError(f"recv {t['tag']}: dst is {t['dst']}, not {cfg.node}")
        msg = int(t["msg_id"]) + it * ITERATION_MSG_STRIDE
        size = int(t["size_bytes"])
        n = packet_count(size, cfg.payload_bytes)
        f = RecvFlow(t["tag"], t["src"], t["dst"], size, it, msg, "recv",
                     entropy=Entropy(cfg.entropy, cfg.seed, f"{t['tag']}#{it}#ack",
                                     cfg.flowlet_gap_us),
                     ports=self._reply_ports(t["src"]), npackets=n,
                     path_ns=self._path_ns(t["src"]),
                     last_wire=max(STAMP_BYTES, packet_bytes(n - 1, size, cfg.payload_bytes)))
        f.acks = [t_.ack_patcher(buf) for t_, buf in
                  (self.ack_template(t["src"], port.ifname) for port in f.ports)]
        if cfg.cc == "dcqcn":
            gate = self.gates.get(t["src"])
            if gate is None:
                gate = self.gates[t["src"]] = CnpGate(cfg.dcqcn["cnp_interval_ns"], f)
            f.gate = gate
            f.cnps = [self.cnp_template(t["src"], port.ifname) for port in f.ports]
        if msg in self.recv_by_msg:
            raise ConfigError(f"recv {t['tag']}: msg_id {t['msg_id']} is used twice")
        self.recv_by_msg[msg] = f
        self.recvs.append(f)
        return f

    def _addresses(self, peer: str, ifname: str) -> Addresses:
        port = self.cfg.ports[ifname]
        return Addresses(port["src_mac"], port["dst_mac"], self.cfg.loopback,
                         self.cfg.peers[peer])

    def _data_slots(self, dst: str, ifname: str, size: int, n: int) -> tuple:
        """(first, middle, middle with AckReq, last): (buf, patch) for each."""
        cfg = self.cfg
        full = cfg.payload_bytes
        last_wire = max(STAMP_BYTES, packet_bytes(n - 1, size, full))
        every = cfg.ack_every
        if n == 1:
            only = self._template(dst, ifname, Opcode.RC_SEND_ONLY, last_wire, True)
            return (only, only, only, only)
        first = self._template(dst, ifname, Opcode.RC_SEND_FIRST, full, every == 1)
        middle = self._template(dst, ifname, Opcode.RC_SEND_MIDDLE, full, every == 1)
        middle_ack = self._template(dst, ifname, Opcode.RC_SEND_MIDDLE, full, True)
        last = self._template(dst, ifname, Opcode.RC_SEND_LAST, last_wire, True)
        return (first, middle, middle_ack, last)

    def _template(self, dst: str, ifname: str, opcode: int, wire: int, ackreq: bool) -> tuple:
        key = (dst, ifname, int(opcode), wire, ackreq)
        got = self._templates.get(key)
        if got is None:
            cfg = self.cfg
            t = Template.build(opcode, self._addresses(dst, ifname),
                               dqpn=qpn(cfg.node, dst, cfg.transport), payload_bytes=wire,
                               dscp=cfg.dscp, ackreq=ackreq)
            buf = t.buffer()
            got = self._templates[key] = (buf, t.patcher(buf))
        return got

    def ack_template(self, src: str, ifname: str) -> tuple[Template, bytearray]:
        """The ACK template (and a buffer of it) toward `src` out of `ifname`."""
        key = (src, ifname)
        got = self._ack_templates.get(key)
        if got is None:
            cfg = self.cfg
            t = Template.build(Opcode.RC_ACK, self._addresses(src, ifname),
                               dqpn=qpn(src, cfg.node, cfg.transport),
                               dscp=cfg.dscp if cfg.ack_dscp is None else cfg.ack_dscp,
                               sack=cfg.transport == "uet")
            got = self._ack_templates[key] = (t, t.buffer())
        return got

    def _reaction_point(self, dst: str) -> Dcqcn:
        """The DCQCN state of the QP toward `dst`, at its first port's line rate."""
        cfg = self.cfg
        q = qpn(cfg.node, dst, cfg.transport) & QPN_MASK
        got = self.cc_by_qpn.get(q)
        if got is None:
            line = cfg.ports[cfg.routes[dst][0]].get("rate_mbps")
            if not line:
                raise ConfigError(f"dcqcn: port {cfg.routes[dst][0]} has no rate_mbps")
            got = self.cc_by_qpn[q] = Dcqcn(line, cfg.dcqcn, burst_ns=cfg.coalesce_ns)
        return got

    def cnp_template(self, src: str, ifname: str) -> tuple[bytearray, Patcher]:
        """A CNP toward the QP of `src`'s flows to us (BTH opcode 0x81, BECN set, 16
        reserved bytes), out of `ifname`, on the CNP class (DSCP 48, not ECN-capable)."""
        key = ("cnp", src, ifname)
        got = self._templates.get(key)
        if got is None:
            cfg = self.cfg
            t = Template.build(Opcode.CNP, self._addresses(src, ifname),
                               dqpn=qpn(src, cfg.node, cfg.transport), payload_bytes=16,
                               dscp=CNP_DSCP, ecn=ECN_NOT_ECT, becn=True)
            buf = t.buffer()
            got = self._templates[key] = (buf, t.patcher(buf))
        return got

    # -- progress ----------------------------------------------------------------------
    def advance(self, now: int) -> None:
        """Start every step whose gate is open."""
        if self.graph:
            self._advance_graph(now)
            return
        steps = self.steps
        while self.next_step < len(steps):
            k = self.next_step
            st = steps[k]
            if k > 0:
                prev = steps[k - 1]
                if any(r.end_ns is None for r in prev.recvs):
                    return
                if st.index == 0 and self.iter_end[prev.iteration] is None:
                    return
            if st.index == 0:
                self.iter_start[st.iteration] = now
                if self.iter_left[st.iteration] == 0:
                    self._iteration_done(st.iteration, now)
            self._start_sends(st, now)
            self.next_step = k + 1

    def _start_sends(self, st: StepState, now: int) -> None:
        for f in st.sends:
            f.tx = (NsccSender(f.npackets, self.params, self.cfg.nscc)
                    if self.cfg.cc == "nscc"
                    else make_sender(self.cfg.transport, f.npackets, self.params))
            f.start_ns = now
            f.starved_ns = -sum([p.wire.starved_ns for p in f.ports])
            self.send_by_msn[f.msn] = f
            self.active.append(f)

    # -- a job's steps: a graph per iteration, computations on one stream ---------------
    def _advance_graph(self, now: int, done: StepState | None = None) -> None:
        """Start what the graph allows at `now` (after `done`'s receives completed).

        Time on the compute stream is kept as it was due, not as the agent noticed it:
        a computation that ended while the agent slept ended at its due time, and what
        waited only for it is ready from then (a chain of computations does not drift by
        the agent's wake-up lag at every link; an open-loop flow's instants stay
        Poisson). A step's record says so (ready, begin, sent, done as due); its flows
        start when the agent sends them, and receives complete when they arrive."""
        n = len(self.cfg.steps)
        todo: list[StepState] = [done] if done is not None else []
        while self._it < self.cfg.iterations:
            it = self._it
            if self.iter_start[it] is None:
                self.iter_start[it] = self._compute_free = now
                mine = self.steps[it * n:(it + 1) * n]
                for st in mine:
                    st.waiting = len(st.after)
                todo += [st for st in mine if not st.after]
            for st in [st for st in self._computing if st.begin_ns + st.compute_ns <= now]:
                self._computing.remove(st)
                todo.append(st)
            while todo:
                st = todo.pop()
                t = min(now, st.due_ns) if st.waiting == 0 and st.after else now
                if st.ready_ns is None:       # its dependencies are done
                    st.ready_ns = t
                    if st.compute_ns:
                        st.begin_ns = max(t, self._compute_free)
                        self._compute_free = st.begin_ns + st.compute_ns
                        if st.begin_ns + st.compute_ns > now:
                            self._computing.append(st)
                            continue
                        t = st.begin_ns + st.compute_ns
                    else:
                        st.begin_ns = t
                elif st.compute_ns and st.sent_ns is None:   # its computation just ended
                    t = st.begin_ns + st.compute_ns
                if st.sent_ns is None:        # its computation is over: it sends (now)
                    st.sent_ns = t
                    self._start_sends(st, now)
                if st.done_ns is None and all(r.end_ns is not None for r in st.recvs):
                    at = st.done_ns = now if st.recvs else t   # receives: when they arrived
                    for k in self._needed[st.index]:
                        nxt = self.steps[it * n + k]
                        nxt.waiting -= 1
                        nxt.due_ns = max(nxt.due_ns, at)
                        if nxt.waiting == 0:
                            todo.append(nxt)
            self.wake_ns = min((st.begin_ns + st.compute_ns for st in self._computing),
                               default=None)
            if self.iter_left[it] or any(st.done_ns is None
                                         for st in self.steps[it * n:(it + 1) * n]):
                return
            self._iteration_done(it, now)
            self._it += 1

    def step_records(self) -> list[dict]:
        """A job's steps, every iteration's: when each was ready, computed, sent, done."""
        return [st.record() for st in self.steps] if self.graph else []

    def flow_done(self, f: Flow, now: int) -> None:
        f.end_ns = now
        if f.role == "send":
            f.starved_ns += sum([p.wire.starved_ns for p in f.ports])
        it = f.iteration
        self.iter_left[it] -= 1
        if self.graph:
            st = self._step_of.get(f.msg) if f.role == "recv" else None
            ready = st is not None and st.iteration == self._it and st.sent_ns is not None
            self._advance_graph(now, st if ready else None)
            return
        if self.iter_left[it] == 0 and self.iter_start[it] is not None:
            self._iteration_done(it, now)
        self.advance(now)

    def _iteration_done(self, it: int, now: int) -> None:
        self.iter_end[it] = now
        if all(e is not None for e in self.iter_end):
            self.done_ns = now

    # -- what is left, what was done ---------------------------------------------------
    def missing(self, after_s: float) -> str:
        parts = []
        for f in self.recvs:
            if f.end_ns is None:
                got = f.rx.delivered_packets if f.rx is not None else 0
                parts.append(f"recv {f.tag} (iteration {f.iteration}): "
                             f"{got}/{f.npackets} packets")
        for f in self.sends:
            if f.end_ns is None:
                if f.tx is None:
                    parts.append(f"send {f.tag} (iteration {f.iteration}): not started")
                else:
                    parts.append(f"send {f.tag} (iteration {f.iteration}): "
                                 f"{f.tx.una}/{f.npackets} packets acknowledged")
        shown = "; ".join(parts[:6]) + (f"; and {len(parts) - 6} more" if len(parts) > 6 else "")
        return f"{shown} after {after_s:g} s" if parts else f"not finished after {after_s:g} s"

    def iterations(self) -> list[dict]:
        """Completed iterations, in order."""
        return [{"start_ns": s, "end_ns": e}
                for s, e in zip(self.iter_start, self.iter_end, strict=True) if e is not None]
