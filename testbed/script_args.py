"""The claim and benchmark scripts' shared flag names, with `testbed`'s vocabulary:
`--servers` is always a host list (HOST,HOST), so a script's server count is
`--server-count` (the topology builders' `servers`, as in `--set servers=N`), and a link
rate is `--rate` in Mbit/s (or auto), as in `testbed run --rate`.

Renamed flags keep their old spelling as a hidden alias that still works and says once,
on stderr, which name to use instead.
"""

from __future__ import annotations

import argparse
import math
import sys

from testbed.experiment import rate_arg


class _Renamed(argparse.Action):
    """Stores like the flag it stands for, after one line on stderr naming that flag."""

    def __init__(self, option_strings, dest, instead: str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.instead = instead
        self.warned = False

    def __call__(self, parser, namespace, values, option_string=None):
        if not self.warned:
            print(f"{parser.prog}: {option_string} is deprecated, use {self.instead}",
                  file=sys.stderr)
            self.warned = True
        setattr(namespace, self.dest, values)


def add_renamed(ap: argparse.ArgumentParser, flag: str, old: str,
                **kwargs) -> argparse.Action:
    """ap.add_argument(flag, **kwargs), and `old` as its deprecated spelling (same
    destination and type, hidden from --help)."""
    action = ap.add_argument(flag, **kwargs)
    ap.add_argument(old, dest=action.dest, type=action.type, metavar=action.metavar,
                    default=argparse.SUPPRESS, help=argparse.SUPPRESS, action=_Renamed,
                    instead=flag)
    return action


def add_server_count(ap: argparse.ArgumentParser, default: int = 4) -> argparse.Action:
    """--server-count N (dest `servers`, the builders' parameter); --servers N still works."""
    return add_renamed(ap, "--server-count", "--servers", dest="servers", type=int,
                       default=default, metavar="N",
                       help=f"servers in the fabric (the builder's servers; default {default})")


def add_rate(ap: argparse.ArgumentParser, **kwargs) -> argparse.Action:
    """--rate (dest `rate_mbps`, in Mbit/s); --rate-mbps still works. kwargs: type,
    default, metavar, help as add_argument's."""
    kwargs.setdefault("metavar", "MBPS")
    return add_renamed(ap, "--rate", "--rate-mbps", dest="rate_mbps", **kwargs)


def rate_flag_error(text: str) -> str:
    """Why a script's `--rate` text is refused ("" for a finite rate above 0, or auto)."""
    try:
        rate = rate_arg(text)
    except (ValueError, argparse.ArgumentTypeError):
        return f"--rate {text}: a number of Mbit/s or auto"
    if rate != "auto" and not (math.isfinite(rate) and rate > 0):
        return f"--rate {text}: a finite number of Mbit/s above 0, or auto"
    return ""
