"""What physics or the literature predicts, beside what a script measured.

Every experiment script ends its summary with a table of `Expectation`s: the quantity,
the formula in one line, its source, the predicted value (or range), the measured one,
and "matches" or why not. A number with nothing to compare it to convinces nobody.

    e = Expectation("RoCE JCT at 2 % loss", "JCT(0) x (1 + (W-1) P) / (1 - P)",
                    GBN_SOURCE, low=0.05, high=0.30, measured=0.18, unit="s")
    e.verdict()            # "matches"
    expectation_lines([e]) # markdown section for summary.md
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

TOLERANCE = 0.10    # a measurement this close (relative) to the prediction matches it

GBN_SOURCE = "Bertsekas & Gallager, Data Networks (2nd ed. 1992), sec. 2.4 (ARQ efficiency)"
RING_SOURCE = "Patarasuk & Yuan, J. Parallel Distrib. Comput. 69(2), 2009 (ring all-reduce)"


@dataclass
class Expectation:
    """A prediction [low, high] (low == high for a point) and what was measured."""

    what: str
    formula: str
    source: str
    low: float
    high: float
    measured: float
    unit: str = ""
    tolerance: float = TOLERANCE
    why_not: str = ""        # the known reason, printed when it does not match

    def matches(self) -> bool:
        return (self.low * (1 - self.tolerance) <= self.measured
                <= self.high * (1 + self.tolerance))

    def verdict(self) -> str:
        if self.matches():
            return "matches"
        side = "above" if self.measured > self.high else "below"
        return f"does not match ({side})" + (f": {self.why_not}" if self.why_not else "")

    def predicted(self) -> str:
        if self.low == self.high:
            return f"{self.low:.4g}"
        return f"{self.low:.4g} to {self.high:.4g}"

    def to_dict(self) -> dict:
        return {**asdict(self), "matches": self.matches(), "verdict": self.verdict()}


def ring_allreduce(what: str, ideal_s: float, measured_s: float, why_not: str = "",
                   formula: str = "2(n-1)/n x S/B") -> Expectation:
    """Ring all-reduce: each rank sends and receives 2(n-1)/n of the message S at its link
    rate B (`ideal_s`, computed by the run from the topology)."""
    return Expectation(what, formula, RING_SOURCE, ideal_s, ideal_s, measured_s, "s",
                       why_not=why_not)


def expectation_lines(expectations: list[Expectation]) -> list[str]:
    """The "expected vs measured" section of a summary (markdown)."""
    lines = ["", "## Expected vs measured", "",
             f"A measurement within {TOLERANCE:.0%} of the prediction (or its range) matches, "
             "unless the row says otherwise (published ranges: as published).",
             "", "| quantity | formula | source | predicted | measured | verdict |",
             "|---|---|---|---|---|---|"]
    for e in expectations:
        unit = f" {e.unit}" if e.unit else ""
        lines.append(f"| {e.what} | {e.formula} | {e.source} | {e.predicted()}{unit} | "
                     f"{e.measured:.4g}{unit} | {e.verdict()} |")
    return lines
