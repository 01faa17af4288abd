"""The agent's receive socket: UDP on 4791 at its loopback, a buffer that does not
overflow, the kernel's receive time of each datagram, and the kernel's drop count.

    frame ─▶ (namespace's IP stack: the kernel stamps its arrival) ─▶ UDP socket
        ─▶ recv_into (the agent, when it is scheduled) ─▶ arrival_ns(): the stamp

The receive time is the kernel's (taken when the frame entered this namespace), so a
one-way latency measured to it does not count the agent's own scheduling. Compiled and
without a delay line, the socket is read in batches: one recvmmsg(2) fills up to
RX_SLOTS buffers, each datagram with its stamp (SO_TIMESTAMPNS) and TOS byte as
ancillary data (traffic/rx.pxd); otherwise one recv_into(2) per datagram, and the stamp
by SIOCGSTAMPNS when it is asked for. Either way the agent reads `read(limit)` datagrams,
then each by `datagram(i)`. Drops (`drops()`, /proc/net/udp) are host-side: the
socket's buffer was full; they are never fabric loss.

Where the kernel has no netem, a link's propagation delay is emulated here, at the end
of the path (`DelayLine`): a datagram read from the socket is held until its kernel
arrival time plus the one-way propagation delay of the path it came by, then handled as
if it had just arrived. The transports see the scaled fabric's round-trip time and
bandwidth-delay product; the switches' queues in between see no delay (what the agent
delay line cannot give: a PFC pause still acts on the upstream at once).
"""

from __future__ import annotations

import errno
import fcntl
import socket
import struct
from collections import deque
from pathlib import Path

import cython

from traffic.agent_config import realtime_offset_ns
from traffic.packets import ROCE_UDP_PORT, now_ns

SO_RCVBUFFORCE = 33                 # <asm-generic/socket.h>
SIOCGSTAMPNS = 0x8907               # <asm-generic/sockios.h>: receive time of the last datagram
SO_TIMESTAMPNS = 35                 # <asm-generic/socket.h>: each datagram's, as ancillary data
RX_SLOTS = 32                       # datagrams per recvmmsg (the arrays of traffic/rx.pxd)
SLOT_BYTES = 16384                  # a slot's buffer: above any fabric MTU (longer: truncated)
UNBATCHED_BYTES = 65536
TIMESPEC = struct.Struct("=qq")
TOS_CMSG_BYTES = socket.CMSG_SPACE(1)
ECN_CE = 0b11


def is_ce(ancdata: list) -> bool:
    """The datagram's IP header was marked CE (ancillary data of `RxSocket.read_tos`)."""
    for level, kind, data in ancdata:
        if level == socket.IPPROTO_IP and kind == socket.IP_TOS and data:
            return data[0] & 3 == ECN_CE
    return False


class RxSocket:
    """A non-blocking UDP socket bound to (address, 4791) with `rcvbuf_bytes` of buffer.
    `batched`: read it in batches where compiled (not where the agent takes datagrams
    off it for a delay line: that reads the socket itself, stamps by SIOCGSTAMPNS)."""

    def __init__(self, address: str, rcvbuf_bytes: int, port: int = ROCE_UDP_PORT,
                 batched: bool = True):
        self.port = port
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf_bytes)
            sock.bind((address, port))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.fd = sock.fileno()
        self.recv_into = sock.recv_into
        self.kernel_stamps = True       # False: the kernel gave no stamp, read time used
        self.realtime_offset_ns = 0     # CLOCK_REALTIME - CLOCK_MONOTONIC
        self.tos = False
        self.batched = batched and cython.compiled
        self.bufs = ([bytearray(SLOT_BYTES) for _ in range(RX_SLOTS)] if self.batched
                     else [bytearray(UNBATCHED_BYTES)])
        self.cur = self.length = 0
        self.ce_mark = self.truncated = False
        self._enable_stamps()
        if self.batched:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            batch_setup(self)    # noqa: F821 (traffic/rx.pxd, compiled only)

    def fileno(self) -> int:
        return self.fd

    def read_tos(self) -> None:
        """Deliver each datagram's IP TOS byte (its ECN bits) as ancillary data
        (IP_RECVTOS): the receiver of a DCQCN flow answers CE marks with CNPs;
        `datagram(i)` sets `ce_mark`."""
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        self.tos = True

    def close(self) -> None:
        self.sock.close()

    def read(self, limit: int) -> int:
        """Read up to `limit` waiting datagrams (batched: one recvmmsg of at most
        RX_SLOTS; else one); how many (0: none waiting). `datagram(i)` gives each."""
        self.cur = 0
        if self.batched:
            return batch_read(self, min(limit, RX_SLOTS))   # noqa: F821 (rx.pxd)
        try:
            if self.tos:
                n, anc, flags, _ = self.sock.recvmsg_into(self.bufs, TOS_CMSG_BYTES)
                self.ce_mark = is_ce(anc)
            else:
                n, flags = self.recv_into(self.bufs[0]), 0
        except BlockingIOError:
            return 0
        self.length = n
        self.truncated = bool(flags & socket.MSG_TRUNC)  # recv_into: 64 KiB holds any
        return 1

    def hold_all(self, line: DelayLine) -> int | None:
        """Move every waiting datagram into the delay line `line`, by its sender's
        address and stamped with its arrival (unbatched sockets); the first one's arrival
        (None: nothing waited)."""
        rbuf = self.bufs[0]
        first = None
        ce = False
        while True:
            try:
                if self.tos:
                    n, anc, _, (address, _) = self.sock.recvmsg_into(self.bufs,
                                                                     TOS_CMSG_BYTES)
                    ce = is_ce(anc)
                else:
                    n, (address, _) = self.sock.recvfrom_into(rbuf)
            except BlockingIOError:
                return first
            at = self.last_stamp_ns()
            if first is None:
                first = at
            line.hold(rbuf[:n], address, at, ce)      # a slice of a bytearray is a copy

    def datagram(self, i: int) -> bytearray:
        """The `i`th datagram of the last `read` (its buffer: valid until the next read);
        sets `length`, `ce_mark` and `truncated` to its, and `arrival_ns()` to its stamp."""
        self.cur = i
        if self.batched:
            self.length = self.c_lens[i]
            self.ce_mark = self.c_tos[i] & 3 == ECN_CE
            self.truncated = self.c_trunc[i]
        return self.bufs[i]

    def _enable_stamps(self) -> None:
        """The first SIOCGSTAMPNS turns on receive timestamps for the socket (and answers
        ENOENT: nothing read yet); later ones give the last datagram's, in CLOCK_REALTIME."""
        try:
            fcntl.ioctl(self.fd, SIOCGSTAMPNS, bytes(TIMESPEC.size))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                self.kernel_stamps = False
        self.realtime_offset_ns = realtime_offset_ns()

    def arrival_ns(self) -> int:
        """When the datagram `datagram(i)` last gave reached this namespace
        (CLOCK_MONOTONIC)."""
        if self.batched:
            at = self.c_stamps[self.cur]
            return at if at else now_ns()
        return self.last_stamp_ns()

    def last_stamp_ns(self) -> int:
        """When the last datagram read from `sock` reached this namespace (SIOCGSTAMPNS;
        unbatched sockets)."""
        if self.kernel_stamps:
            try:
                sec, nsec = TIMESPEC.unpack(fcntl.ioctl(self.fd, SIOCGSTAMPNS,
                                                        bytes(TIMESPEC.size)))
                return sec * 1_000_000_000 + nsec - self.realtime_offset_ns
            except OSError:
                self.kernel_stamps = False
        return now_ns()

    def drops(self) -> int | None:
        """Datagrams the kernel dropped at this socket (its buffer was full)."""
        return socket_drops(self.port)


def socket_drops(port: int = ROCE_UDP_PORT) -> int | None:
    """The drop count of this namespace's UDP sockets on `port` (/proc/net/udp, last
    column), or None if it cannot be read."""
    try:
        rows = [ln.split() for ln in Path("/proc/net/udp").read_text().splitlines()[1:]]
    except OSError:
        return None
    drops = [int(r[-1]) for r in rows if len(r) > 12 and r[1].endswith(f":{port:04X}")]
    return sum(drops) if drops else None


class DelayLine:
    """Datagrams held until arrival + the propagation delay from their sender.

    `delay_ns` maps a sender's address to its path's one-way delay; datagrams from an
    address not in it are not delayed. One FIFO per distinct delay: within one, release
    times only grow, so the earliest due datagram is at the head of one of them."""

    def __init__(self, delay_ns: dict[str, int]):
        self.delay_ns = dict(delay_ns)
        self.fifos: dict[int, deque] = {d: deque() for d in {0, *self.delay_ns.values()}}
        self.held = 0

    def hold(self, data: bytes | bytearray, address: str, arrival_ns: int,
             ce: bool = False) -> None:
        """Hold `data` (with its IP header's CE mark, if the agent reads them)."""
        delay = self.delay_ns.get(address, 0)
        self.fifos[delay].append((arrival_ns + delay, data, ce))
        self.held += 1

    def next_due(self) -> int | None:
        """When the earliest held datagram is due (None: nothing held)."""
        heads = [q[0][0] for q in self.fifos.values() if q]
        return min(heads) if heads else None

    def pop(self, now_ns: int) -> tuple[int, bytes | bytearray, bool] | None:
        """(due time, datagram, CE) of the earliest datagram due by `now_ns`, or None."""
        best = None
        for q in self.fifos.values():
            if q and q[0][0] <= now_ns and (best is None or q[0][0] < best[0][0]):
                best = q
        if best is None:
            return None
        self.held -= 1
        return best.popleft()
