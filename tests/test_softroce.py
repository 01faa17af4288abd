"""scripts/softroce_compare.py: what it reads of a capture, how it tells when the kernel
cannot give namespaced rxe endpoints, and that it says so (and builds nothing) here, where
the kernel has no InfiniBand. The comparison itself runs in the VM (make vm-check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import softroce_compare as sc  # noqa: E402

SRC, DST = "198.19.0.1", "198.19.0.3"


def row(src: str, opcode: int, psn: int, a: bool = False, syndrome: str = "",
        sport: int = 49152, dscp: int = 26, ecn: int = 0, length: int = 1082) -> dict:
    return {"frame.len": str(length), "ip.src": src, "ip.dsfield.dscp": str(dscp),
            "ip.dsfield.ecn": str(ecn), "udp.srcport": str(sport),
            "infiniband.bth.opcode": str(opcode), "infiniband.bth.destqp": "0x11",
            "infiniband.bth.psn": str(psn), "infiniband.bth.a": "1" if a else "0",
            "infiniband.aeth.syndrome": syndrome, "infiniband.aeth.msn": "", "icrc_ok": True}


def test_traits_read_psn_progression_ackreq_coalescing_and_naks():
    rows = [row(SRC, 6, 0), row(SRC, 7, 1), row(SRC, 7, 2, a=True),
            row(DST, 0x11, 2, syndrome="0x1f"),
            row(SRC, 7, 3), row(SRC, 7, 5), row(DST, 0x11, 3, syndrome="0x60"),
            row(SRC, 7, 4), row(SRC, 8, 5, a=True, sport=49153),
            row(DST, 0x11, 5, syndrome="0x1f")]
    t = sc.traits(rows, SRC)
    assert t["data packets"] == 7 and t["ACKs"] == 3 and t["NAKs"] == 1
    assert t["opcodes (data)"] == {"RDMA_WRITE_FIRST": 1, "RDMA_WRITE_MIDDLE": 5,
                                   "RDMA_WRITE_LAST": 1}
    # steps within a QP's flow (its UDP source port): the last packet starts a flow
    assert t["PSN steps (per QP and flow)"] == {"+1": 3, "jump": 1, "back (resent)": 1}
    assert t["PSN of a message's first packet"] == {"starts anew": 1}
    assert t["AckReq set on"] == "2 of 7: RDMA_WRITE_LAST, RDMA_WRITE_MIDDLE"
    assert t["AETH syndromes"] == {"0x1f": 2, "0x60": 1}
    assert t["data packets per ACK"] == 2.3 and t["UDP source ports (data)"] == 2
    assert t["ICRC valid"] == "10 of 10" and t["DSCP (data)"] == [26]


def test_the_table_says_where_the_two_differ_and_why():
    ours = sc.traits([row(SRC, 0, 0, ecn=2), row(SRC, 2, 1, a=True, ecn=2),
                      row(DST, 0x11, 1, syndrome="0x1f")], SRC)
    rxe = sc.traits([row(SRC, 10, 0, a=True), row(SRC, 10, 1, a=True),
                     row(DST, 0x11, 0, syndrome="0x02")], SRC)
    lines = sc.table(rxe, ours)
    by_field = {ln.split(" | ")[0].lstrip("| "): ln for ln in lines[2:]}
    assert "| no | the agents mark every data packet ECT(0)" in by_field["ECN (data)"]
    assert "| no |" in by_field["AETH syndromes"]
    assert "| yes |" in by_field["PSN steps (per QP and flow)"]     # the kinds: +1 only
    assert by_field["ICRC valid"].endswith("| yes |  |")
    assert all(ln.count("|") == lines[0].count("|") for ln in lines)
    bad = sc.traits([row(SRC, 10, 0) | {"icrc_ok": False}], SRC)
    assert "| no |" in sc.table(bad, ours)[2 + list(bad).index("ICRC valid")]


def test_a_kernel_whose_rxe_is_not_namespaced_is_told_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(sc.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    module, syms = tmp_path / "rdma_rxe", tmp_path / "kallsyms"
    syms.write_text("ffffffffc0a01000 t rxe_net_init\t[rdma_rxe]\n")
    monkeypatch.setattr(sc, "sh", lambda args: subprocess.CompletedProcess(args, 1))
    assert "no rdma_rxe module" in sc.rxe_unavailable(module, syms)
    module.mkdir()
    assert "initial network namespace only" in sc.rxe_unavailable(module, syms)
    syms.write_text("ffffffffc0a02000 t rxe_ns_pernet_sk4\t[rdma_rxe]\n")
    assert sc.rxe_unavailable(module, syms) is None
    monkeypatch.setattr(sc.shutil, "which", lambda tool: None if tool == "rdma" else tool)
    assert sc.rxe_unavailable(module, syms).startswith("rdma is not installed")


@pytest.mark.root
def test_without_a_namespaced_rxe_it_says_why_and_builds_nothing(tmp_path, host_untouched):
    why = sc.rxe_unavailable()
    if why is None:
        pytest.skip("this kernel has namespaced rxe: the VM check runs the comparison")
    out = subprocess.run([sys.executable, "scripts/softroce_compare.py", "--out",
                          str(tmp_path / "sr")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 3 and f"unavailable: {why}" in out.stdout
    assert f"unavailable: {why}" in (tmp_path / "sr" / "softroce.md").read_text()


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    out = subprocess.run([sys.executable, "scripts/softroce_compare.py", "--out",
                          str(tmp_path / "x"), "--rate", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--rate: 0" in out.stderr
    assert not (tmp_path / "x").exists()
