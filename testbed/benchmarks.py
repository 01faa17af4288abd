"""results/bench.json: one flat JSON object, metric name -> number, shared by all benchmarks."""

from __future__ import annotations

import json
from pathlib import Path

BENCH_JSON = Path(__file__).resolve().parent.parent / "results" / "bench.json"


def update_bench_json(path: str | Path, values: dict) -> None:
    """Merge `values` into the file (other benchmarks' figures stay)."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(values)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
