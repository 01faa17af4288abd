"""Reliable transports as pure state machines: RoCE RC (go-back-N) and UET-style (SACK).

No sockets and no clock of their own: the agent (traffic/agent.py) moves packets, and
every call that needs the time takes it (`now_ns`, CLOCK_MONOTONIC), so unit tests drive
them with simulated loss, reordering and duplication.

    sender                                        receiver
    take(now) -> PSN to put on the wire  ──data──▶ on_data(psn, ackreq, ts) -> action
    on_ack(now, syndrome, psn, base, bitmap, ce) ◀─ack── ack_fields(action)
    on_timer(now): retransmission timeout

PSNs are packet indices within one message (0 .. npackets-1): every message has its own
PSN space, so they never wrap (a message has fewer than 2^23 packets).

roce (RC): the sender keeps `window_packets` outstanding and sets AckReq on every
`ack_every`-th packet and on the last. The receiver accepts only the expected PSN
(ePSN); it sends a coalesced ACK (PSN = last in order) on AckReq, every `ack_every`
packets and at message end; on a gap (PSN > ePSN) one NAK (PSN sequence error, carrying
ePSN), then no other until ePSN advances; duplicates (PSN < ePSN) are dropped and
re-ACKed when they ask for it. The sender goes back N on a NAK (resends everything from
its PSN) and, after `rto_ms` without ACK progress, from the oldest unacked packet.
Either receiver also ACKs what it owes once `ack_delay_us` passed since the last data
packet (`delayed_ack`, a timer the agent runs), so a pause does not wait for the RTO.

uet (UET-style reliable unordered delivery): the receiver accepts every PSN once, in any
order, and acknowledges selectively (cumulative base = first missing PSN, and a 64-bit
bitmap of the PSNs from the base up) every `ack_every` packets, on AckReq, on message
completion, and on an out-of-order arrival (at most one such SACK per
`max(1, ack_every // 4)` arrivals). The sender retransmits a packet only when packets
sent after it (by transmission order, as RACK does, so a resend is judged against what
was sent after the resend) have been acknowledged `reorder_threshold` times over, or at
RTO (then every unacked packet in flight). It NAKs only a trimmed packet (its payload
cut by a switch, fabric.trimming: `on_trimmed`), at once, with its PSN in the BTH and
the SACK block as usual; the sender resends that PSN first. At the tail (every new PSN
sent) fewer than `reorder_threshold` packets may follow a loss, which only the RTO would
then find: there a packet counts as lost once something sent after it was acknowledged
and nothing sent after it is still in flight (every later transmission acknowledged or
itself declared lost), as RACK's tail rule does; on one path (ECMP) that is exact, with
spraying a late packet may be resent once, costing a duplicate rather than an RTO.

CE echo (cc = "nscc", traffic.nscc): the agent counts CE-marked data packets into the
receiver's `ce_marks`; a UET ACK carries that count since the previous ACK (saturating at
255) in the top byte of its SACK base word, whose low 24 bits are the base PSN. A RoCE
ACK never carries it.

Exactly once: either receiver keeps a per-PSN delivery count; `exactly_once` holds when
every PSN was delivered once and the delivered bytes equal the message size.

The settings a user sets live in traffic/transport_settings.py, the UDP source port of
each packet (entropy) in traffic/entropy.py.
"""

from __future__ import annotations

from collections import deque

from traffic.transport_settings import MAX_PACKETS, STAMP_BYTES, TRANSPORTS, TransportParams

# AETH syndromes (IBA 9.7.5.2.1), as in traffic.packets.Syndrome.
SYNDROME_ACK = 0x1F
SYNDROME_NAK_SEQ = 0x60

# What a receiver asks the agent to send after a data packet.
NO_ACTION, SEND_ACK, SEND_NAK = 0, 1, 2

SACK_BITS = 64
CE_ECHO_SHIFT, CE_ECHO_MAX = 24, 255     # the CE count in the SACK base word's top byte


def packet_count(size_bytes: int, payload_bytes: int) -> int:
    """Packets of a message: ceil(size / payload), at least one (an empty message)."""
    if payload_bytes < STAMP_BYTES:
        raise ValueError(f"payload_bytes must be at least {STAMP_BYTES}, got {payload_bytes}")
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
    n = max(1, -(-size_bytes // payload_bytes))
    if n >= MAX_PACKETS:
        raise ValueError(f"a message of {n} packets exceeds {MAX_PACKETS - 1}")
    return n


def packet_bytes(psn: int, size_bytes: int, payload_bytes: int) -> int:
    """Message bytes carried by packet `psn` (the last one carries the remainder)."""
    return max(0, min(payload_bytes, size_bytes - psn * payload_bytes))


def wants_ack(psn: int, npackets: int, ack_every: int) -> bool:
    """AckReq on every ack_every-th packet and on the last."""
    return psn == npackets - 1 or (psn + 1) % ack_every == 0


# -- senders ---------------------------------------------------------------------------
class _Sender:
    """What both senders count and how the agent drives them."""

    def __init__(self, npackets: int, params: TransportParams):
        if not 1 <= npackets < MAX_PACKETS:
            raise ValueError(f"npackets must be in [1, {MAX_PACKETS - 1}], got {npackets}")
        self.n = npackets
        self.window = params.window_packets
        self.ack_every = params.ack_every
        self.rto_ns = params.rto_ns
        self.una = 0                 # oldest PSN not yet acknowledged
        self.done = False
        self.packets = 0             # transmissions, resends included
        self.retransmits = 0
        self.naks = 0                # NAKs received
        self.acks = 0                # ACK/NAK/SACK packets received
        self.timeouts = 0
        self.rto_wait_ns = 0         # from the last progress to each timeout that fired
        # round-trip samples, one packet timed at a time: one that asks for its ACK at
        # once (no coalescing wait in the sample), never a resent one (Karn)
        self.rtt_psn = -1
        self.rtt_sent_ns = self.rtt_sum_ns = self.rtt_samples = 0
        self.last_progress_ns = 0    # RTO runs from here while packets are outstanding

    def ackreq(self, psn: int) -> bool:
        return wants_ack(psn, self.n, self.ack_every)

    def deadline_ns(self) -> int | None:
        """When the retransmission timer fires (None: nothing outstanding)."""
        if self.done or not self._outstanding():
            return None
        return self.last_progress_ns + self.rto_ns

    def _outstanding(self) -> bool:
        raise NotImplementedError


class RoceSender(_Sender):
    """RC requester: in-order PSNs, a window, go-back-N on NAK and on timeout."""

    def __init__(self, npackets: int, params: TransportParams):
        super().__init__(npackets, params)
        self.next = 0                # next PSN to (re)send
        self.high = 0                # one past the highest PSN ever sent

    def _outstanding(self) -> bool:
        return self.una < self.high

    def ready(self) -> bool:
        nxt = self.next
        return nxt < self.n and nxt - self.una < self.window

    def take(self, now_ns: int) -> int:
        """The PSN to send now (counted as sent), or -1 (window full or all sent)."""
        nxt = self.next
        if nxt >= self.n or nxt - self.una >= self.window:
            return -1
        if self.una >= self.high:    # nothing was outstanding: the timer starts now
            self.last_progress_ns = now_ns
        self.next = nxt + 1
        if nxt < self.high:
            self.retransmits += 1
        else:
            self.high = nxt + 1
            if self.rtt_psn < 0 and ((nxt + 1) % self.ack_every == 0 or nxt == self.n - 1):
                self.rtt_psn = nxt                  # it asks for its ACK (wants_ack)
                self.rtt_sent_ns = now_ns
        self.packets += 1
        return nxt

    def on_ack(self, now_ns: int, syndrome: int, psn: int, sack_base: int = 0,
               sack_bitmap: int = 0, ce_count: int = 0) -> None:
        if self.done:
            return
        self.acks += 1
        if syndrome == SYNDROME_NAK_SEQ:
            self.naks += 1
            if psn < self.una or psn > self.high:   # stale (overtaken by an ACK) or bogus
                return
            self.una = psn                          # everything before psn arrived
            self.next = psn                         # go back N
            self.rtt_psn = -1
            self.last_progress_ns = now_ns
        elif syndrome == SYNDROME_ACK and psn < MAX_PACKETS:   # 0xFFFFFF: nothing yet
            cum = min(psn + 1, self.high)
            if cum > self.una:
                self.una = cum
                self.last_progress_ns = now_ns
                if 0 <= self.rtt_psn < cum:         # the timed packet is in
                    self.rtt_sum_ns += now_ns - self.rtt_sent_ns
                    self.rtt_samples += 1
                    self.rtt_psn = -1
                if self.next < cum:
                    self.next = cum
        if self.una >= self.n:
            self.done = True

    def on_timer(self, now_ns: int) -> bool:
        """Go back to the oldest unacked PSN if `rto_ms` passed without progress."""
        deadline = self.deadline_ns()
        if deadline is None or now_ns < deadline:
            return False
        self.timeouts += 1
        self.rto_wait_ns += now_ns - self.last_progress_ns
        self.rtt_psn = -1
        self.next = self.una
        self.last_progress_ns = now_ns
        return True


class UetSender(_Sender):
    """UET-style sender: selective acknowledgement, retransmits only what is missing."""

    def __init__(self, npackets: int, params: TransportParams):
        super().__init__(npackets, params)
        self.threshold = params.reorder_threshold
        self.next_new = 0            # next never-sent PSN
        self.acked = bytearray(npackets)
        self.queued = bytearray(npackets)       # waiting in the resend queue
        self.sent_seq = [0] * npackets          # transmission number of the last send
        self.seq = 0
        self.resend: deque[int] = deque()
        self.flight: deque[tuple[int, int]] = deque()   # (seq, psn) in send order
        self.newly_acked = 0         # by the last ACK ...
        self.newest_seq = 0          # ... and the newest transmission among them

    def _outstanding(self) -> bool:
        return self.una < self.next_new

    def ready(self) -> bool:
        if self.resend:
            return True
        nxt = self.next_new
        return nxt < self.n and nxt - self.una < self.window

    def take(self, now_ns: int) -> int:
        psn = -1
        idle = self.una >= self.next_new     # nothing outstanding before this send
        resend = self.resend
        while resend:
            p = resend.popleft()
            self.queued[p] = 0
            if not self.acked[p]:    # acknowledged while it waited: skip it
                psn = p
                self.retransmits += 1
                if p == self.rtt_psn:
                    self.rtt_psn = -1
                break
        if psn < 0:
            nxt = self.next_new
            if nxt >= self.n or nxt - self.una >= self.window:
                return -1
            psn = nxt
            self.next_new = nxt + 1
            if self.rtt_psn < 0 and ((nxt + 1) % self.ack_every == 0 or nxt == self.n - 1):
                self.rtt_psn = nxt                  # it asks for its ACK (wants_ack)
                self.rtt_sent_ns = now_ns
        if idle:
            self.last_progress_ns = now_ns   # the timer starts with the first outstanding
        self.seq += 1
        self.sent_seq[psn] = self.seq
        self.flight.append((self.seq, psn))
        self.packets += 1
        return psn

    def on_ack(self, now_ns: int, syndrome: int, psn: int, sack_base: int = 0,
               sack_bitmap: int = 0, ce_count: int = 0) -> None:
        """A SACK: everything below `sack_base`, and bit i of the bitmap = sack_base + i
        (`ce_count`, the CE marks it echoes, is for traffic.nscc's sender)."""
        self.newly_acked = 0
        if self.done:
            return
        self.acks += 1
        nak = syndrome == SYNDROME_NAK_SEQ       # a trimmed packet: resend it first
        if not nak and syndrome != SYNDROME_ACK:
            return
        acked, n, sent_seq = self.acked, self.n, self.sent_seq
        base = min(sack_base, self.next_new)
        newly = newest = 0
        for p in range(self.una, base):
            if not acked[p]:
                acked[p] = 1
                newly += 1
                if sent_seq[p] > newest:
                    newest = sent_seq[p]
        bits = sack_bitmap
        while bits:
            low = bits & -bits
            p = base + low.bit_length() - 1
            if p >= self.next_new or p >= n:
                break
            if not acked[p]:
                acked[p] = 1
                newly += 1
                if sent_seq[p] > newest:
                    newest = sent_seq[p]
            bits ^= low
        self.newly_acked, self.newest_seq = newly, newest
        if newly:
            self.last_progress_ns = now_ns
            if self.rtt_psn >= 0 and acked[self.rtt_psn]:   # the timed packet is in
                self.rtt_sum_ns += now_ns - self.rtt_sent_ns
                self.rtt_samples += 1
                self.rtt_psn = -1
            una = self.una
            while una < n and acked[una]:
                una += 1
            self.una = una
            if una >= n:
                self.done = True
                self.resend.clear()
                self.flight.clear()
                return
        if nak:
            self.naks += 1
            if psn < self.next_new and not acked[psn] and not self.queued[psn]:
                self.queued[psn] = 1
                self.resend.appendleft(psn)
        if sack_bitmap:
            self._detect_losses()

    def _detect_losses(self) -> None:
        """Queue every unacked packet that `threshold` later transmissions overtook."""
        flight, acked, sent_seq, queued = self.flight, self.acked, self.sent_seq, self.queued
        while flight:
            seq, p = flight[0]
            if acked[p] or sent_seq[p] != seq:
                flight.popleft()
            else:
                break
        later = 0
        in_flight_later = False          # an unacked later transmission not yet declared lost
        tail = self.next_new >= self.n   # no new packet will follow to reveal a loss
        lost = []
        for seq, p in reversed(flight):
            if sent_seq[p] != seq:
                continue                 # an older transmission of a resent packet
            if acked[p]:
                later += 1
            elif queued[p]:
                continue
            elif later >= self.threshold or (tail and later and not in_flight_later):
                lost.append(p)
            else:
                in_flight_later = True
        if lost:
            lost.sort()
            for p in lost:
                queued[p] = 1
            self.resend.extend(lost)

    def on_timer(self, now_ns: int) -> bool:
        """At RTO, queue every unacked packet still in flight."""
        deadline = self.deadline_ns()
        if deadline is None or now_ns < deadline:
            return False
        self.timeouts += 1
        self.rto_wait_ns += now_ns - self.last_progress_ns
        self.last_progress_ns = now_ns
        acked, sent_seq, queued = self.acked, self.sent_seq, self.queued
        lost = sorted({p for seq, p in self.flight
                       if not acked[p] and sent_seq[p] == seq and not queued[p]})
        if not lost and self.una < self.next_new and not queued[self.una]:
            lost = [self.una]
        for p in lost:
            queued[p] = 1
        self.resend.extend(lost)
        return True


# -- receivers -------------------------------------------------------------------------
class _Receiver:
    """What both receivers count; `exactly_once` is the delivery check."""

    def __init__(self, npackets: int, size_bytes: int, payload_bytes: int,
                 params: TransportParams):
        if npackets != packet_count(size_bytes, payload_bytes):
            raise ValueError(f"npackets {npackets} does not fit {size_bytes} bytes "
                             f"in {payload_bytes}-byte packets")
        self.n = npackets
        self.size_bytes = size_bytes
        self.payload_bytes = payload_bytes
        self.last_bytes = packet_bytes(npackets - 1, size_bytes, payload_bytes)
        self.ack_every = params.ack_every
        self.delivered = bytearray(npackets)   # deliveries per PSN (must end all 1s)
        self.delivered_packets = 0
        self.bytes_delivered = 0
        self.complete = False
        self.packets = 0             # arrivals, duplicates and discarded ones included
        self.ooo_packets = 0         # arrived while a lower PSN was still missing
        self.dup_packets = 0
        self.bad_packets = 0         # PSN outside the message
        self.double_deliveries = 0
        self.max_reorder = 0         # PSNs overtaken in the network (see _reorder)
        self.acks = 0                # ACK/SACK packets asked for
        self.naks = 0                # NAKs asked for
        self.highest = -1            # highest PSN seen
        self.newest_ts = -1          # newest send stamp seen
        self.since_ack = 0
        self.dup_run = 0             # consecutive duplicates
        self.ce_marks = 0            # CE-marked arrivals since the last ACK (the agent counts)
        self.trimmed = 0             # trimmed arrivals (payload cut in the fabric)

    def delayed_ack(self) -> int:
        """The delayed-ACK timer fired: ACK what arrived since the last ACK, if anything
        (without it, packets that arrive after the last AckReq before a pause, a loss or
        the end of a burst would be acknowledged only after the sender's RTO)."""
        if not self.since_ack:
            return NO_ACTION
        self.since_ack = 0
        self.acks += 1
        return SEND_ACK

    def _duplicate(self, ackreq: bool) -> int:
        """Drop a duplicate; re-ACK it on AckReq and on the 1st, (1 + ack_every)th, ...
        of a run of duplicates (so a resend burst without AckReq is answered too)."""
        self.dup_packets += 1
        self.dup_run += 1
        if ackreq or self.dup_run % self.ack_every == 1 or self.ack_every == 1:
            self.since_ack = 0
            self.acks += 1
            return SEND_ACK
        return NO_ACTION

    def _deliver(self, psn: int) -> None:
        count = self.delivered[psn]
        if count:
            self.double_deliveries += 1
        self.delivered[psn] = min(count + 1, 255)
        self.delivered_packets += 1
        self.bytes_delivered += self.last_bytes if psn == self.n - 1 else self.payload_bytes
        if self.delivered_packets == self.n:
            self.complete = True

    def _reorder(self, psn: int, ts_ns: int) -> None:
        """Reorder distance: highest PSN seen minus this one, for a packet that arrives
        below the highest and was sent before the newest stamp seen (overtaken in the
        network; a resend, stamped later, is not reordering)."""
        if psn > self.highest:
            self.highest = psn
        elif ts_ns < self.newest_ts and self.highest - psn > self.max_reorder:
            self.max_reorder = self.highest - psn
        if ts_ns > self.newest_ts:
            self.newest_ts = ts_ns

    @property
    def exactly_once(self) -> bool:
        return (self.complete and self.double_deliveries == 0
                and self.bytes_delivered == self.size_bytes
                and self.delivered.count(1) == self.n)


class RoceReceiver(_Receiver):
    """RC responder: accepts the expected PSN only; one NAK per gap."""

    def __init__(self, npackets: int, size_bytes: int, payload_bytes: int,
                 params: TransportParams):
        super().__init__(npackets, size_bytes, payload_bytes, params)
        self.epsn = 0
        self.nak_armed = True        # a NAK may be sent for the current ePSN

    def on_data(self, psn: int, ackreq: bool, ts_ns: int = 0) -> int:
        self.packets += 1
        epsn = self.epsn
        if psn == epsn:
            if psn >= self.n:
                self.bad_packets += 1
                return NO_ACTION
            self.dup_run = 0
            self._reorder(psn, ts_ns)
            self._deliver(psn)
            self.epsn = epsn + 1
            self.nak_armed = True
            self.since_ack += 1
            if ackreq or self.since_ack >= self.ack_every or self.complete:
                self.since_ack = 0
                self.acks += 1
                return SEND_ACK
            return NO_ACTION
        if psn > epsn:
            if psn >= self.n:
                self.bad_packets += 1
                return NO_ACTION
            self.dup_run = 0
            self._reorder(psn, ts_ns)
            self.ooo_packets += 1
            if self.nak_armed:
                self.nak_armed = False
                self.naks += 1
                return SEND_NAK
            return NO_ACTION
        return self._duplicate(ackreq)

    def ack_fields(self, action: int) -> tuple[int, int, int, int]:
        """(syndrome, BTH PSN, SACK base, SACK bitmap) of the ACK or NAK to send."""
        if action == SEND_NAK:
            return SYNDROME_NAK_SEQ, self.epsn, self.epsn, 0
        return SYNDROME_ACK, self.epsn - 1, self.epsn, 0


class UetReceiver(_Receiver):
    """UET-style receiver: any order, each PSN once, selective acknowledgement."""

    def __init__(self, npackets: int, size_bytes: int, payload_bytes: int,
                 params: TransportParams):
        super().__init__(npackets, size_bytes, payload_bytes, params)
        self.base = 0                # first missing PSN
        self.above = 0               # bit i: base + i arrived
        self.ooo_ack_gap = max(1, params.ack_every // 4)
        self.nak_psn = 0             # the trimmed PSN the next NAK names

    def on_trimmed(self, psn: int) -> int:
        """A trimmed packet (headers only, fabric.trimming): NAK its PSN at once, unless
        a whole copy arrived already."""
        self.packets += 1
        if not 0 <= psn < self.n:
            self.bad_packets += 1
            return NO_ACTION
        self.trimmed += 1
        if self.delivered[psn]:
            return NO_ACTION
        self.nak_psn = psn
        self.naks += 1
        return SEND_NAK

    def on_data(self, psn: int, ackreq: bool, ts_ns: int = 0) -> int:
        self.packets += 1
        off = psn - self.base
        if off < 0 or (self.above >> off) & 1:
            return self._duplicate(ackreq)
        if psn >= self.n:
            self.bad_packets += 1
            return NO_ACTION
        self.dup_run = 0
        self._reorder(psn, ts_ns)
        self._deliver(psn)
        self.since_ack += 1
        ooo = off > 0
        if ooo:
            self.ooo_packets += 1
            self.above |= 1 << off
        else:                        # the first missing PSN: the base moves up
            above = (self.above | 1) >> 1
            base = psn + 1
            while above & 1:
                above >>= 1
                base += 1
            self.above = above
            self.base = base
            ooo = base - psn > 1     # it filled a gap: tell the sender at once too
        if (ackreq or self.complete or self.since_ack >= self.ack_every
                or (ooo and self.since_ack >= self.ooo_ack_gap)):
            self.since_ack = 0
            self.acks += 1
            return SEND_ACK
        return NO_ACTION

    def ack_fields(self, action: int) -> tuple[int, int, int, int]:
        """(syndrome, BTH PSN = last in order (a NAK: the trimmed PSN), SACK base word,
        64-bit bitmap from the base). The base word's top byte echoes the CE marks since
        the last ACK (at most 255), which building this ACK resets; its low 24 bits are
        the base PSN."""
        word = self.base
        if self.ce_marks:
            word |= min(self.ce_marks, CE_ECHO_MAX) << CE_ECHO_SHIFT
            self.ce_marks = 0
        bitmap = self.above & 0xFFFF_FFFF_FFFF_FFFF
        if action == SEND_NAK:
            return SYNDROME_NAK_SEQ, self.nak_psn, word, bitmap
        return SYNDROME_ACK, self.base - 1, word, bitmap


SENDERS = {"roce": RoceSender, "uet": UetSender}
RECEIVERS = {"roce": RoceReceiver, "uet": UetReceiver}


def make_sender(transport: str, npackets: int, params: TransportParams) -> RoceSender | UetSender:
    if transport not in SENDERS:
        raise ValueError(f"transport: {transport!r} is not one of {', '.join(TRANSPORTS)}")
    return SENDERS[transport](npackets, params)


def make_receiver(transport: str, size_bytes: int, payload_bytes: int,
                  params: TransportParams) -> RoceReceiver | UetReceiver:
    if transport not in RECEIVERS:
        raise ValueError(f"transport: {transport!r} is not one of {', '.join(TRANSPORTS)}")
    n = packet_count(size_bytes, payload_bytes)
    return RECEIVERS[transport](n, size_bytes, payload_bytes, params)
