"""Flow-size distributions: the published CDFs the flow workload draws its sizes from.

A distribution is a piecewise-linear CDF, the points of a file in traffic/flow_cdfs/ or a
user's file in the same format (ns-3 HPCC's traffic generator reads the same files):

    # comment lines and blank lines are skipped
    0 0
    10000 15          <size in bytes> <cumulative percent>
    ...
    30000000 100

The first point is at 0 percent, the last at 100; sizes and percents never decrease. A
segment between two points holds the difference of their percents spread uniformly over
its sizes; two points with the same size make an atom at that size.

    sizes = load("websearch")
    sizes.sample(random.Random(1))    # an int >= 1, by inverse CDF
    sizes.mean_bytes()                # exact for the piecewise-linear CDF
    sizes.buckets()                   # size-bucket edges for a slowdown table
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from pathlib import Path

from topologies.files import InputError, read_input
from topologies.spec import SpecError, did_you_mean

CDF_DIR = Path(__file__).resolve().parent / "flow_cdfs"
MAX_LINES = 100_000
MAX_FILE_BYTES = 8 << 20          # 100,000 lines of up to 80 characters
MAX_SIZE_BYTES = 1 << 30          # 1 GiB: the largest flow a file may name
BUCKETS = 10                      # slowdown-table buckets: edges at the 10 %, 20 %, ... points

# name -> (file in flow_cdfs/, where the numbers come from)
DISTRIBUTIONS: dict[str, tuple[str, str]] = {
    "websearch": ("websearch.cdf", "DCTCP web search (Alizadeh et al., SIGCOMM 2010), "
                  "as shipped by HPCC (Li et al., SIGCOMM 2019)"),
    "fb_hadoop": ("fb_hadoop.cdf", "Facebook Hadoop (Roy et al., SIGCOMM 2015), "
                  "as shipped by HPCC (Li et al., SIGCOMM 2019)"),
    "ali_storage": ("ali_storage.cdf", "Alibaba storage 2019, as shipped by the HPCC "
                    "repository"),
    "google_rpc": ("google_rpc.cdf", "Google RPC 2008, as shipped by the HPCC repository "
                   "(Homa's W3 family, Montazeri et al., SIGCOMM 2018)"),
}


@dataclass(frozen=True)
class FlowSizes:
    """A flow-size distribution: points (size in bytes, cumulative fraction 0..1)."""

    name: str
    points: tuple[tuple[float, float], ...]
    source: str

    @cached_property
    def _fractions(self) -> list[float]:
        return [f for _, f in self.points]

    @property
    def max_bytes(self) -> int:
        return math.ceil(self.points[-1][0])

    def _segments(self):
        """(probability, low bytes, high bytes) of each segment that holds some mass."""
        for (a, fa), (b, fb) in pairwise(self.points):
            if fb > fa:
                yield fb - fa, a, b

    def quantile(self, q: float) -> float:
        """The size (bytes, not rounded) below which a fraction q of the flows fall: the
        first point whose fraction reaches q, interpolated linearly from the one before."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q!r}: must be in [0, 1]")
        i = max(1, bisect.bisect_left(self._fractions, q))
        (a, fa), (b, fb) = self.points[i - 1], self.points[i]
        if fb <= fa:
            return a
        return a + (b - a) * (q - fa) / (fb - fa)

    def sample(self, rng: random.Random) -> int:
        """One flow size: the quantile at u uniform in [0, 1), truncated to whole bytes,
        at least 1 byte (HPCC's traffic generator draws its sizes the same way)."""
        return max(1, int(self.quantile(rng.random())))

    def mean_bytes(self) -> float:
        """E[S]: a segment of probability p over [a, b] is uniform, so adds p (a + b) / 2."""
        return sum(p * (a + b) / 2 for p, a, b in self._segments())

    def second_moment(self) -> float:
        """E[S^2] in bytes^2: a uniform segment adds p (a^2 + a b + b^2) / 3."""
        return sum(p * (a * a + a * b + b * b) / 3 for p, a, b in self._segments())

    def buckets(self, n: int = BUCKETS) -> list[int]:
        """Size-bucket edges (bytes, strictly increasing) for a slowdown table: the
        distribution's own k/n quantiles for k = 1..n-1, rounded, repeats dropped. Bucket
        i holds the sizes in (edge[i-1], edge[i]] (0 before the first, max_bytes after the
        last), so each bucket holds about 1/n of the flows and none is empty: a fixed
        log2 ladder would leave most of its rungs empty for a narrow distribution
        (ali_storage) and lump web search's many small flows together."""
        if n < 1:
            raise ValueError(f"buckets n={n}: must be >= 1")
        edges: list[int] = []
        for k in range(1, n):
            edge = round(self.quantile(k / n))
            if edge > (edges[-1] if edges else 0) and edge < self.max_bytes:
                edges.append(edge)
        return edges


def load(spec: object, field: str = "flows.sizes") -> FlowSizes:
    """A shipped distribution by name, or a user's CDF file by path; SpecError(field, ...)
    on anything else."""
    if not isinstance(spec, str) or not spec:
        raise SpecError(field, f"{spec!r}: must be a shipped distribution "
                        f"({', '.join(DISTRIBUTIONS)}) or a path to a CDF file")
    if spec in DISTRIBUTIONS:
        filename, source = DISTRIBUTIONS[spec]
        return FlowSizes(spec, parse_file(CDF_DIR / filename, field), source)
    path = Path(spec)
    if "/" in spec or path.suffix or path.exists():
        return FlowSizes(path.stem, parse_file(path, field), str(path))
    raise SpecError(field, f"unknown distribution {spec!r}{did_you_mean(spec, DISTRIBUTIONS)}: "
                    f"use one of {', '.join(DISTRIBUTIONS)}, or a path to a CDF file "
                    "(lines of <bytes> <cumulative percent>)")


def parse_file(path: Path, field: str) -> tuple[tuple[float, float], ...]:
    """Read and check one CDF file: a regular file of at most MAX_FILE_BYTES, opened
    without blocking (topologies.files.read_input); nothing else is opened."""
    shown = str(path) if str(path).isprintable() else repr(str(path))   # one line
    allowed = f"a shipped distribution ({', '.join(DISTRIBUTIONS)}) or a path to a CDF file"
    try:
        text = read_input(path, MAX_FILE_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise SpecError(field, f"no such file: {shown} (use {allowed})") from None
    except IsADirectoryError:
        raise SpecError(field, f"{shown} is a directory, not a CDF file") from None
    except InputError as exc:
        raise SpecError(field, f"{shown} {exc}") from None
    except OSError as exc:
        raise SpecError(field, f"{shown} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SpecError(field, f"{shown} is not UTF-8 text (lines of <size in bytes> "
                        "<cumulative percent>)") from None
    except ValueError:          # a NUL byte in the path
        raise SpecError(field, f"{shown} is not a file name") from None
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        raise SpecError(field, f"{shown}: {len(lines):,} lines, more than {MAX_LINES:,}")
    return parse_points(lines, shown, field)


def parse_points(lines: list[str], where: str, field: str) -> tuple[tuple[float, float], ...]:
    """The points of a CDF's lines, as (bytes, fraction 0..1), or SpecError naming the
    first line that breaks the format."""
    points: list[tuple[float, float]] = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        at = f"{where} line {number}"
        words = line.split()
        try:
            size, percent = (float(w) for w in words) if len(words) == 2 else (None, None)
        except ValueError:
            size = percent = None
        if size is None or percent is None:
            raise SpecError(field, f"{at}: {line[:60]!r} is not two numbers "
                            "(<size in bytes> <cumulative percent>)")
        if not (math.isfinite(size) and math.isfinite(percent)):
            raise SpecError(field, f"{at}: {line!r}: sizes and percents must be finite")
        if size < 0 or percent < 0:
            raise SpecError(field, f"{at}: {line!r}: sizes and percents must be >= 0")
        if size > MAX_SIZE_BYTES:
            raise SpecError(field, f"{at}: size {size:g} bytes is above 1 GiB "
                            f"({MAX_SIZE_BYTES} bytes), the largest flow allowed")
        if percent > 100:
            raise SpecError(field, f"{at}: percent {percent:g} is above 100")
        if points and size < points[-1][0]:
            raise SpecError(field, f"{at}: size {size:g} is below the line before's "
                            f"{points[-1][0]:g}: sizes must not decrease")
        if points and percent / 100 < points[-1][1]:
            raise SpecError(field, f"{at}: percent {percent:g} is below the line before's "
                            f"{points[-1][1] * 100:g}: percents must not decrease")
        if not points and percent != 0:
            raise SpecError(field, f"{at}: the first point must be at 0 percent "
                            "(HPCC's files start with `0 0`)")
        points.append((size, percent / 100))
    if not points:
        raise SpecError(field, f"{where}: no points (lines of <size in bytes> "
                        "<cumulative percent>, from `0 0` to 100 percent)")
    if points[-1][1] != 1.0:
        raise SpecError(field, f"{where}: the last point is at {points[-1][1] * 100:g} "
                        "percent: a CDF must end at 100")
    if points[-1][0] <= 0:
        raise SpecError(field, f"{where}: every size is 0 bytes: a flow carries at least 1")
    return tuple(points)
