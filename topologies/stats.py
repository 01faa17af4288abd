"""Statistics the results share: one percentile definition for every p50/p99 we report.

Nearest rank: the q-th percentile of n values is the ceil(q/100 * n)-th smallest (the
first for q = 0), so it is always one of the values measured, never an interpolation.
Pure data, no root.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float):
    """Nearest-rank percentile (q in 0..100) of `values` (any order); None when empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q!r} is not in [0, 100]")
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
