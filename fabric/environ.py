"""One environment variable set for a block, restored after: the switches that the
processes a run starts (the fabric's workers, the agents) read from their environment."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def environ(name: str, value: str):
    """os.environ[name] = value inside the block; its earlier value (or its absence)
    after."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
