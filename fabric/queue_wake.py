"""The kernel wakes the PFC controller: it sleeps while no switch holds a lossless byte.

A controller that polls every switch every 0.5 ms spends its CPU mostly on a fabric with
nothing queued (the 16-switch incast of bench_pfc: 2.9 s of controller wall time, 0.5 s
of it incast). While every switch queue is empty nothing can cross XOFF without first
being enqueued, and every lossless frame a switch enqueues passes its egress counter
(fabric.queue_counters). So the controller arms a flag and sleeps; the first counter
program to count a frame while it is armed claims it and wakes the controller through a
BPF ring buffer, whose fd the controller select()s on beside the run's pipe:

    controller                                    a switch port's egress program
    drain the ring; arm(): armed = 1, an xchg     counts the frame in (an atomic add);
      in the kernel (BPF_PROG_TEST_RUN of a         if armed: xchg it to 0; the one CPU
      tiny program), so the counters read after     that took the 1 counts a wake and
      it are read after the flag was set            puts the time (ktime, CLOCK_MONOTONIC)
    re-read the counters: a byte came in?           into the ring (forced wake-up)
      disarm, poll on
    select(ring, pipe, until the next timeline sample); disarm; drain: that time

Both sides do a fully ordered atomic before they read the other's variable, so either
the controller sees the frame's bytes and stays awake, or the program sees the flag and
wakes it: no frame slips between. The time in the ring is the first byte's, so the
reaction to a queue that crossed XOFF before the first poll is timed from there.

The ring buffer map needs Linux 5.8; where the kernel refuses it, QueueCounters says why
(`wake_unavailable`) and the controller polls as before. Both programs are in
fabric/bpf/queue.bpf.c: `wake()` of aft_count_wake, and aft_arm.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable

RING_BYTES = 4096                       # one 16-byte record per arm at most
BUSY_BIT = 1 << 31
MECHANISM = ("kernel: the switch ports' eBPF counters wake the controller through a "
             "BPF ring buffer when a lossless frame is enqueued while it sleeps")

__all__ = ["MECHANISM", "Waker"]


class Waker:
    """The ring the egress programs write to and the controller's side of it (module
    doc). `values` is the counters' map as mapped by QueueCounters; `entry` the slot
    whose bytes are the armed flag and frames the wakes."""

    def __init__(self, ring_fd: int, arm_fd: int, values: memoryview, entry: int,
                 run: Callable[[int, bytes], object]):
        self.ring_fd, self.arm_fd, self.values, self.entry = ring_fd, arm_fd, values, entry
        self.run = run                  # BPF_PROG_TEST_RUN (fabric.libbpf.test_run)
        page = mmap.PAGESIZE
        self.consumer = mmap.mmap(ring_fd, page, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self.producer = mmap.mmap(ring_fd, page + 2 * RING_BYTES, mmap.MAP_SHARED,
                                  mmap.PROT_READ, offset=page)
        self.frame = bytes(64)

    def fileno(self) -> int:
        return self.ring_fd

    def arm(self) -> None:
        """Set the flag with a fully ordered atomic in the kernel (see the module doc);
        what was left in the ring is dropped first."""
        self.drain()
        self.run(self.arm_fd, self.frame)

    def disarm(self) -> None:
        self.values[2 * self.entry] = 0

    def wakes(self) -> int:
        """How many times a switch port's program woke the controller."""
        return self.values[2 * self.entry + 1]

    def drain(self) -> float | None:
        """Empty the ring; the time (time.monotonic() seconds) of the first record it
        held, None if it held none."""
        prod = struct.unpack_from("=Q", self.producer, 0)[0]
        cons = struct.unpack_from("=Q", self.consumer, 0)[0]
        if prod == cons:
            return None
        at = mmap.PAGESIZE + cons % RING_BYTES
        length, _ = struct.unpack_from("=II", self.producer, at)
        stamp = None if length & BUSY_BIT else struct.unpack_from("=Q", self.producer,
                                                                   at + 8)[0] / 1e9
        struct.pack_into("=Q", self.consumer, 0, prod)
        return stamp

    def close(self) -> None:
        self.consumer.close()
        self.producer.close()
        for fd in (self.ring_fd, self.arm_fd):
            os.close(fd)
        self.ring_fd = self.arm_fd = -1
