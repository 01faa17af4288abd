"""The `testbed` command's progress and diagnostics, through the standard logging module.

Records go to stderr as "  [HH:MM:SS] message" (stdout stays for what a verb prints:
a summary, a table, JSON). The level is the user's: INFO by default (progress lines),
WARNING with -q, DEBUG with -v.
"""

from __future__ import annotations

import logging
import sys

LOGGER = logging.getLogger("testbed")
FORMAT, DATE_FORMAT = "  [%(asctime)s] %(message)s", "%H:%M:%S"


def level_of(verbose: int, quiet: int) -> int:
    """The logging level -v and -q (counted) ask for: more -v than -q is DEBUG, more -q
    WARNING, else INFO."""
    if verbose > quiet:
        return logging.DEBUG
    return logging.WARNING if quiet > verbose else logging.INFO


def setup(level: int) -> None:
    """Log the testbed's records at `level` and above to stderr (as it is now)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    LOGGER.handlers = [handler]
    LOGGER.setLevel(level)
    LOGGER.propagate = False


def progress(msg: str) -> None:
    """A progress line (INFO): the `progress` callback every verb hands down."""
    LOGGER.info(msg)
