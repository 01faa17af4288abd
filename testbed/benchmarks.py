"""results/bench.json: one flat JSON object, metric name -> number, shared by all benchmarks.

Every write also records the machine's calibration (testbed.calibrate, cached by
`testbed calibrate`) beside the figures, since machines of one class differ by 3-5x in
packet rate: `calibration_budget_pps_direct`, `calibration_us_per_hop`, `calibration_utc`
(or `calibration: "none cached"`).

The benchmarks that run at the rate `--rate auto` picks record each run's fidelity
verdict (`rate_auto`); every write merges them, one list per benchmark, into
`rate_auto_verdicts` and counts the share that came out faithful,
`rate_auto_faithful_fraction` over `rate_auto_runs`: whether the calibration's promise
held on this machine.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

BENCH_JSON = Path(__file__).resolve().parent.parent / "results" / "bench.json"
RATE_AUTO = "rate_auto_verdicts"


def rate_auto(bench: str, verdicts: list[str]) -> dict:
    """A benchmark's runs at the rate --rate auto picked, their verdicts in order, as
    update_bench_json merges them."""
    return {RATE_AUTO: {bench: list(verdicts)}}


def machine_calibration() -> dict:
    """The flat calibration fields bench.json carries beside every figure."""
    from testbed.rate import load_cached
    cal = load_cached()
    if cal is None:
        return {"calibration": "none cached (sudo testbed calibrate measures it)"}
    steals = [r["steal_percent"] for r in cal["runs"].values()
              if r.get("steal_percent") is not None]
    return {"calibration_budget_pps_direct": cal["budget_pps_direct"],
            "calibration_us_per_packet": cal["cost_us_per_packet"],
            "calibration_us_per_hop": cal["cost_us_per_hop"],
            "calibration_utc": cal["date_utc"],
            # the hypervisor's steal during the calibration (its CPU % counts it as busy)
            "calibration_steal_percent": max(steals) if steals else None}


def machine_line() -> str:
    """One line for a benchmark's output: this machine's calibration, or that it has none."""
    cal = machine_calibration()
    if "calibration" in cal:
        return f"machine calibration: {cal['calibration']}"
    return (f"machine calibration ({cal['calibration_utc']}): "
            f"{cal['calibration_budget_pps_direct']} packets/s direct, "
            f"{cal['calibration_us_per_hop']} us per switch hop, "
            + ("the hypervisor's steal not measured" if cal["calibration_steal_percent"] is None
               else f"the hypervisor's steal {cal['calibration_steal_percent']} % while it "
                    f"measured"))


def update_bench_json(path: str | Path, values: dict) -> None:
    """Merge `values` and the machine's calibration into the file (other benchmarks'
    figures stay)."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.pop("calibration", None)
    data.update(machine_calibration())
    auto = {**data.get(RATE_AUTO, {}), **values.get(RATE_AUTO, {})}
    data.update(values)
    if auto:
        runs = [v for verdicts in auto.values() for v in verdicts]
        data[RATE_AUTO] = auto
        data["rate_auto_runs"] = len(runs)
        data["rate_auto_faithful_fraction"] = round(
            sum(v == "faithful" for v in runs) / len(runs), 3) if runs else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def median_range(values: list[float], fmt: str = ".3f") -> str:
    """A benchmark's runs as "median (min-max)"."""
    return (f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-"
            f"{max(values):{fmt}})")
