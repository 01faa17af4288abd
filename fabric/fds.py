"""Waiting on a file descriptor whatever its number.

select(2) takes no fd at or above FD_SETSIZE, and a run over a large fabric (rail128:
a namespace, sockets and pipes per node) holds thousands; its forked workers inherit
them. poll(2) takes any fd but rounds a wait up to whole milliseconds.
"""

from __future__ import annotations

import math
import select

FD_SETSIZE = 1024


def readable(fd: int, timeout: float) -> bool:
    """Whether `fd` becomes readable within `timeout` s: select(2), precise to
    microseconds, below FD_SETSIZE; poll(2), to the millisecond above."""
    return bool(ready([fd], timeout))


def ready(fds: list[int], timeout: float) -> list[int]:
    """Those of `fds` readable within `timeout` s (as readable())."""
    if max(fds) < FD_SETSIZE:
        return select.select(fds, [], [], timeout)[0]
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(math.ceil(max(0.0, timeout) * 1000))]
