"""Units: the one module that converts rates, sizes, times and the scale factor.

Rates are Mbit/s (10^6 bit/s) in the emulator and in every spec; the kernel's tc wants
bytes per second; a sender's wire clock wants nanoseconds per byte; the real fabric a
run stands for runs `scale_factor` times faster (100 Mbit/s x 4000 = 400 Gb/s). Bases
are decimal for rates (Mbit/s, Gb/s, GB/s = 10^9 B/s) and binary only where a name says
so (KiB, MiB).
"""

from __future__ import annotations

BITS_PER_BYTE = 8
NS_PER_S = 1_000_000_000
US_PER_S = 1_000_000
MS_PER_S = 1_000


def mbps_to_bytes_per_s(rate_mbps: float) -> float:
    """Mbit/s to bytes per second."""
    return rate_mbps * 1e6 / BITS_PER_BYTE


def bytes_per_s_to_mbps(rate_bytes_per_s: float) -> float:
    return rate_bytes_per_s * BITS_PER_BYTE / 1e6


def mbps(nbytes: float, seconds: float) -> float:
    """The rate, in Mbit/s, of `nbytes` moved in `seconds` (0 when no time passed)."""
    return nbytes * BITS_PER_BYTE / seconds / 1e6 if seconds > 0 else 0.0


def ns_per_byte(rate_mbps: float) -> float:
    """Wire time of one byte at `rate_mbps`, in nanoseconds (8000 / Mbit/s)."""
    return BITS_PER_BYTE * 1e3 / rate_mbps


def transfer_s(nbytes: float, rate_mbps: float) -> float:
    """Seconds to move `nbytes` at `rate_mbps`."""
    return nbytes / mbps_to_bytes_per_s(rate_mbps)


def bits_time_s(bits: float, rate_mbps: float) -> float:
    """Seconds that `bits` bit times last at `rate_mbps` (e.g. a PFC pause quantum)."""
    return bits / (rate_mbps * 1e6)


def ns_to_s(ns: float) -> float:
    return ns / NS_PER_S


# -- emulated <-> real ------------------------------------------------------------------
def real_mbps(rate_mbps: float, scale_factor: float) -> float:
    """The real fabric's rate that an emulated rate stands for."""
    return rate_mbps * scale_factor


def real_s(measured_s: float, scale_factor: float) -> float:
    """The real fabric moves the same bytes scale_factor times faster."""
    return measured_s / scale_factor


def rate_text(rate_mbps: float) -> str:
    """'400 Gb/s', '7.2 Tb/s', '100 Mbit/s': the largest unit the rate reaches."""
    for unit, div in (("Tb/s", 1e6), ("Gb/s", 1e3)):
        if rate_mbps >= div:
            return f"{rate_mbps / div:g} {unit}"
    return f"{rate_mbps:g} Mbit/s"
