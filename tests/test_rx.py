"""Tests for the agents' receive socket (traffic.rx): both engines read every datagram once,
in order, with its length, its CE mark and a kernel stamp; compiled, in recvmmsg batches."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.test_engine import run_python
from traffic.rx import RX_SLOTS

ROOT = Path(__file__).resolve().parent.parent

# Datagrams on the loopback to an RxSocket bound to a free port: sizes 100..139, every
# third one sent with the IP header's ECN field CE, then one longer than a batch slot.
PROBE = """
import json, socket, time
from traffic.rx import RxSocket, SLOT_BYTES
rx = RxSocket("127.0.0.1", 1 << 20, port=0)
rx.read_tos()
port = rx.sock.getsockname()[1]
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# The kernel turns receive stamps on for the whole machine from a work item after the
# first socket asks (net_enable_timestamp); until it has run, a datagram is stamped when
# it is read. Wait for one stamped on arrival: well before a read 20 ms after its send.
for _ in range(250):
    sent = time.monotonic_ns()
    tx.sendto(b"w", ("127.0.0.1", port))
    time.sleep(0.02)
    while not rx.read(1):
        time.sleep(0.001)
    rx.datagram(0)
    if rx.arrival_ns() - sent < 20_000_000:
        break
t0 = time.monotonic_ns()
for k in range(40):
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 3 if k % 3 == 0 else 0)
    tx.sendto(bytes([k]) * (100 + k), ("127.0.0.1", port))
tx.sendto(b"x" * (SLOT_BYTES + 100), ("127.0.0.1", port))
time.sleep(0.05)
got, reads = [], []
while True:
    n = rx.read(64)
    if not n:
        break
    reads.append(n)
    for i in range(n):
        buf = rx.datagram(i)
        got.append([rx.length, buf[0], rx.ce_mark, rx.truncated, rx.arrival_ns()])
print(json.dumps({"batched": rx.batched, "reads": reads, "got": got, "t0": t0,
                  "t1": time.monotonic_ns(), "slot": SLOT_BYTES}))
"""


@pytest.mark.parametrize("engine", ["compiled", "interpreted"])
def test_every_datagram_read_once_in_order_with_its_mark_and_stamp(engine):
    out = json.loads(run_python(["-c", PROBE], engine))
    got = out["got"]
    assert len(got) == 41 and sum(out["reads"]) == 41
    assert [g[:3] for g in got[:40]] == [[100 + k, k, k % 3 == 0] for k in range(40)]
    stamps = [g[4] for g in got]
    assert out["t0"] <= stamps[0] and stamps == sorted(stamps) and stamps[-1] <= out["t1"]
    last = got[40]
    if engine == "compiled":
        assert out["batched"] and max(out["reads"]) == RX_SLOTS
        assert last[0] == out["slot"] and last[3], "a datagram past its slot reads truncated"
    else:
        assert not out["batched"] and set(out["reads"]) == {1}
        assert last[0] == out["slot"] + 100 and not last[3]
    assert not any(g[3] for g in got[:40])


def test_batch_arrays_hold_rx_slots():
    pxd = (ROOT / "traffic" / "rx.pxd").read_text()
    arrays = re.findall(r"cdef .* c_\w+\[(\d+)\]", pxd)        # the slot arrays
    loops = re.findall(r"range\((\d+)\)", pxd)
    assert len(arrays) == 7 and loops and {int(n) for n in arrays + loops} == {RX_SLOTS}
