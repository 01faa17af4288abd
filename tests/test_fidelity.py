"""The fidelity verdict as a pure function: figures in, verdict and reasons out."""

from testbed import fidelity


def agent(starved_ns=0, busy_ns=10**9, lags_us=(50.0,), drops=0, packets=1000):
    return {"fidelity": {"starved_ns": starved_ns, "busy_ns": busy_ns,
                         "timer_lag_us": list(lags_us)},
            "udp_rcvbuf_errors": drops,
            "flows": [{"role": "recv", "packets": packets}]}


def test_a_run_that_kept_up_is_faithful():
    v = fidelity.verdict({"a": agent(), "b": agent(starved_ns=10**7)}, cpu_mean_percent=40)
    assert v["verdict"] == "faithful" and v["reasons"] == []
    assert v["figures"]["starved_fraction"] < 0.01
    assert "faithful" in fidelity.summary_line(v)


def test_each_figure_can_decide_the_verdict():
    assert fidelity.verdict({"a": agent(starved_ns=5 * 10**7)})["verdict"] == "degraded"
    assert fidelity.verdict({"a": agent(starved_ns=5 * 10**8)})["verdict"] == "unfaithful"
    assert fidelity.verdict({"a": agent(lags_us=[8_000.0] * 10)})["verdict"] == "degraded"
    assert fidelity.verdict({"a": agent(lags_us=[30_000.0] * 10)})["verdict"] == "unfaithful"
    assert fidelity.verdict({"a": agent(drops=1)})["verdict"] == "degraded"
    assert fidelity.verdict({"a": agent(drops=50)})["verdict"] == "unfaithful"
    v = fidelity.verdict({"a": agent()}, pfc_poll_gap_p99_ms=5.0)
    assert v["verdict"] == "degraded" and "pfc_poll_gap_p99_ms" in v["reasons"][0]


def test_cpu_alone_only_warns_but_corroborates_a_figure():
    v = fidelity.verdict({"a": agent()}, cpu_mean_percent=97)
    assert v["verdict"] == "degraded" and "cpu_mean_percent" in v["reasons"][0]
    v = fidelity.verdict({"a": agent(starved_ns=5 * 10**7)}, cpu_mean_percent=97)
    assert v["verdict"] == "unfaithful" and "saturated" in " ".join(v["reasons"])


def test_thresholds_are_reported_beside_the_figures():
    v = fidelity.verdict({"a": agent()})
    assert set(v["thresholds"]) >= set(fidelity.LIMITS)
    assert v["thresholds"]["starved_fraction"]["degraded"] == 0.10


def test_two_signs_together_are_unfaithful():
    one = agent(starved_ns=5 * 10**7)
    assert fidelity.verdict({"a": one}, cpu_mean_percent=50)["verdict"] == "degraded"
    two = agent(starved_ns=5 * 10**7, lags_us=[8000.0] * 10)
    v = fidelity.verdict({"a": two}, cpu_mean_percent=50)
    assert v["verdict"] == "unfaithful" and "two figures" in v["reasons"][-1]
