#!/usr/bin/env python3
"""How many of the runs made since a moment were faithful: the last line of `make demo`.

Every run folder under RESULTS (the scripts nest theirs inside their own folder) whose
metrics.json was written after the file MARK was touched is counted by its fidelity
verdict (testbed.fidelity); the runs that were not faithful are listed with the reason
their verdict gives, so a newcomer knows which figures to trust.

    python scripts/demo_verdicts.py MARK [RESULTS]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def verdicts(results: Path, since_s: float) -> list[tuple[Path, str, str]]:
    """(run folder, verdict, first reason) of every run written after `since_s`."""
    out = []
    for metrics in sorted(results.rglob("metrics.json")):
        if metrics.stat().st_mtime < since_s:
            continue
        try:
            fidelity = json.loads(metrics.read_text()).get("fidelity") or {}
        except (OSError, json.JSONDecodeError):
            continue
        if "verdict" in fidelity:   # a script's own folder has none: its runs do
            reasons = fidelity.get("reasons") or [""]
            out.append((metrics.parent, fidelity["verdict"], reasons[-1]))
    return out


def report(found: list[tuple[Path, str, str]]) -> str:
    counts = Counter(v for _, v, _ in found)
    lines = [f"demo: {counts['faithful']} of {len(found)} runs faithful"
             + (f" ({', '.join(f'{n} {v}' for v, n in counts.items() if v != 'faithful')})"
                if len(counts) > 1 or (found and not counts['faithful']) else "")]
    lines += [f"  {v}: {folder} ({why})" for folder, v, why in found if v != "faithful"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mark", help="a file touched before the runs")
    ap.add_argument("results", nargs="?", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    mark, results = Path(args.mark), Path(args.results)
    if not mark.is_file():
        print(f"error: mark: {mark} is not a file", file=sys.stderr)
        return 2
    if not results.is_dir():
        print(f"error: results: {results} is not a folder", file=sys.stderr)
        return 2
    print(report(verdicts(results, mark.stat().st_mtime)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
