"""Chakra execution traces: schema, stream framing, and Jobs through traces (no root)."""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import replace

import pytest

from traffic.chakra import (
    COLL_OF_TYPE,
    COMM_TYPES,
    KIND_OF_TYPE,
    NODE_TYPES,
    AttributeProto,
    ChakraError,
    GlobalMetadata,
    Node,
    _read_messages,
    _write_message,
    read_traces,
    write_traces,
)
from traffic.job import Job, Op

RANKS = ["s0g0", "s0g1", "s1g0", "s1g1"]
COMP, SEND, RECV, COLL, MEM_LOAD = 4, 5, 6, 7, 2
ALL_REDUCE, BROADCAST = 0, 5


def _job() -> Job:
    a, b, c, d = RANKS
    ops = {r: [Op(0, "comp", "fwd", duration_ns=1_500_000),
               Op(1, "coll", "grads", (0,), coll="allreduce", size_bytes=1 << 20,
                  group=tuple(RANKS)),
               Op(2, "comp", "opt", (1,), duration_ns=1234)] for r in RANKS}
    ops[a] += [Op(3, "coll", "experts", (2,), coll="alltoall", size_bytes=4096, group=(c, a)),
               Op(4, "send", "act", (0,), size_bytes=999, peer=b, tag="act/0")]
    ops[c] += [Op(3, "coll", "experts", (), coll="alltoall", size_bytes=4096, group=(c, a))]
    ops[b] += [Op(3, "recv", "act", (), size_bytes=999, peer=a, tag="act/0"),
               Op(4, "comp", "use", (3, 2), duration_ns=7),
               Op(5, "coll", "shard", (4,), coll="reducescatter", size_bytes=64, group=(d, b))]
    ops[d] += [Op(3, "coll", "shard", (2,), coll="reducescatter", size_bytes=64, group=(d, b))]
    return Job(ranks=ops, name="tiny")


def _attr(name: str, **value) -> AttributeProto:
    return AttributeProto(name=name, **value)


def _write(path, nodes, meta=None) -> None:
    """A trace as Chakra writes one: metadata, then the nodes, each after its varint size."""
    with open(path, "wb") as out:
        _write_message(out, meta or GlobalMetadata(version="0.0.4"))
        for node in nodes:
            _write_message(out, node)


def _coll(nid: int, name: str, pg: str = "", comm: int = ALL_REDUCE, **deps) -> Node:
    return Node(id=nid, name=name, type=COLL, **deps, attr=[
        _attr("comm_type", int64_val=comm), _attr("comm_size", int64_val=1024),
        _attr("pg_name", string_val=pg)])


def test_schema_numbers_and_known_bytes_are_chakras():
    fields = Node.DESCRIPTOR.fields_by_name
    assert [fields[n].number for n in ("id", "name", "type", "ctrl_deps", "data_deps",
                                       "start_time_micros", "duration_micros", "attr")] == [
        1, 2, 3, 4, 5, 6, 7, 10]
    attr = AttributeProto.DESCRIPTOR.fields_by_name
    assert (attr["int32_val"].number, attr["int64_val"].number, attr["bool_val"].number,
            attr["string_val"].number, attr["bool_list"].number) == (7, 9, 27, 29, 28)
    enum = Node.DESCRIPTOR.file.enum_types_by_name
    assert enum["NodeType"].values_by_name["COMM_COLL_NODE"].number == 7
    assert enum["CollectiveCommType"].values_by_name["REDUCE_SCATTER"].number == 7
    assert [v.name for v in enum["NodeType"].values] == list(NODE_TYPES)
    assert [v.name for v in enum["CollectiveCommType"].values] == list(COMM_TYPES)
    assert {NODE_TYPES[t]: k for t, k in KIND_OF_TYPE.items()} == {
        "COMP_NODE": "comp", "COMM_COLL_NODE": "coll", "COMM_SEND_NODE": "send",
        "COMM_RECV_NODE": "recv"}
    assert {COMM_TYPES[t]: c for t, c in COLL_OF_TYPE.items()} == {
        "ALL_REDUCE": "allreduce", "ALL_GATHER": "allgather",
        "REDUCE_SCATTER": "reducescatter", "ALL_TO_ALL": "alltoall"}
    # id 1, type COMP_NODE, data_deps [1, 2, 3] packed, one int64 attr
    node = Node(id=1, type=COMP, data_deps=[1, 2, 3], attr=[_attr("x", int64_val=300)])
    assert node.SerializeToString() == bytes.fromhex("0801" "1804" "2a03010203"
                                                     "5206" "0a0178" "48ac02")


def test_length_prefix_is_a_varint_of_the_size():
    msg = GlobalMetadata(version="x" * 297)
    assert len(msg.SerializeToString()) == 300
    out = io.BytesIO()
    _write_message(out, msg)
    _write_message(out, GlobalMetadata(version="abc"))
    data = out.getvalue()
    assert data[:2] == b"\xac\x02" and len(data) == 302 + 6 and data[302] == 5
    assert list(_read_messages(data, "t")) == [msg.SerializeToString(), b"\n\x03abc"]
    with pytest.raises(ChakraError, match="cut short"):
        list(_read_messages(data[:-1], "t"))


def test_job_round_trips_through_traces(tmp_path):
    job = _job()
    (tmp_path / "tr").mkdir()
    _write(tmp_path / "tr" / "trace.4.et", [])          # an earlier, larger job's
    paths = write_traces(job, tmp_path / "tr")
    assert not (tmp_path / "tr" / "trace.4.et").exists()
    assert [p.name for p in paths] == [f"trace.{i}.et" for i in range(4)] + ["comm_group.json"]
    assert json.loads(paths[-1].read_text()) == {"1": [0, 1, 2, 3], "2": [2, 0], "3": [3, 1]}
    back = read_traces(tmp_path / "tr")
    assert back.name == "tiny" and list(back.ranks) == RANKS
    for rank in RANKS:
        assert len(back.ranks[rank]) == len(job.ranks[rank])
        for got, want in zip(back.ranks[rank], job.ranks[rank], strict=True):
            assert got == want, rank
    assert back == job


def test_durations_are_micros_with_exact_ns_kept(tmp_path):
    write_traces(_job(), tmp_path)
    data = (tmp_path / "trace.0.et").read_bytes()
    fwd, _, opt = (Node.FromString(m) for m in list(_read_messages(data, "t"))[1:4])
    assert fwd.duration_micros == 1500 and "duration_ns" not in {a.name for a in fwd.attr}
    assert opt.duration_micros == 1
    assert {a.name: a.int64_val for a in opt.attr}["duration_ns"] == 1234


def test_caller_names_the_ranks(tmp_path):
    write_traces(_job(), tmp_path)
    hosts = ["h0", "h1", "h2", "h3"]
    job = read_traces(sorted(tmp_path.glob("*.et")), ranks=hosts)
    assert list(job.ranks) == hosts
    assert job.ranks["h0"][3].group == ("h2", "h0") and job.ranks["h0"][4].peer == "h1"
    with pytest.raises(ChakraError, match="3 rank names for 4 traces"):
        read_traces(tmp_path, ranks=hosts[:3])


def _chakra_pair(tmp_path, gz: bool = False) -> None:
    """Two ranks as Chakra's tools write them: ids only, ctrl_deps, durations in micros."""
    rank0 = [Node(id=10, name="fwd", type=COMP, duration_micros=5),
             _coll(11, "ncclDevKernel_AllReduce", ctrl_deps=[10]),
             Node(id=12, name="send", type=SEND, data_deps=[11], attr=[
                 _attr("comm_dst", int32_val=1), _attr("comm_tag", int32_val=7),
                 _attr("comm_size", int64_val=64)])]
    rank1 = [Node(id=20, name="fwd", type=COMP, duration_micros=5),
             _coll(21, "ncclDevKernel_AllReduce", ctrl_deps=[20]),
             Node(id=22, name="recv", type=RECV, data_deps=[21], attr=[
                 _attr("comm_src", int32_val=0), _attr("comm_dst", int32_val=1),
                 _attr("comm_tag", int32_val=7), _attr("comm_size", uint64_val=64)])]
    for i, nodes in enumerate((rank0, rank1)):
        _write(tmp_path / f"chakra.{i}.et", nodes)
        if gz:
            path = tmp_path / f"chakra.{i}.et"
            path.write_bytes(gzip.compress(path.read_bytes()))


@pytest.mark.parametrize("gz", [False, True])
def test_chakra_written_trace_reads_to_known_ops(tmp_path, gz):
    _chakra_pair(tmp_path, gz)
    job = read_traces(tmp_path)
    group = ("rank0", "rank1")
    assert job.name == "chakra"
    assert job.ranks["rank0"] == [
        Op(10, "comp", "fwd", duration_ns=5000),
        Op(11, "coll", "ncclDevKernel_AllReduce", (10,), coll="allreduce", size_bytes=1024,
           group=group),
        Op(12, "send", "send", (11,), size_bytes=64, peer="rank1", tag="rank0>rank1:7")]
    assert job.ranks["rank1"][2] == Op(22, "recv", "recv", (21,), size_bytes=64, peer="rank0",
                                       tag="rank0>rank1:7")


def test_collective_names_and_groups(tmp_path):
    (tmp_path / "comm_group.json").write_text('{"5": [1, 0]}')
    _write(tmp_path / "t.0.et", [_coll(0, "a", "5"), _coll(1, "same", "5"),
                                 _coll(2, "twice", "5"), _coll(3, "twice", "5")])
    _write(tmp_path / "t.1.et", [_coll(0, "b", "5"), _coll(1, "same", "5"),
                                 _coll(2, "twice", "5"), _coll(3, "twice", "5")])
    job = read_traces(tmp_path)
    # node names differ, agree, agree but repeat
    assert [op.name for op in job.ranks["rank1"]] == ["pg5#0", "same", "pg5#2", "pg5#3"]
    assert {op.group for op in job.ranks["rank0"]} == {("rank1", "rank0")}


def test_a_collective_needs_its_group(tmp_path):
    _write(tmp_path / "t.0.et", [_coll(0, "x", "3")])
    with pytest.raises(ChakraError, match=r"t\.0\.et: node 0 \('x'\): names process group "
                                          r"'3', and there is no .*comm_group\.json"):
        read_traces(tmp_path)


def test_unknown_node_type_is_named(tmp_path):
    _write(tmp_path / "t.0.et", [Node(id=4, name="load", type=MEM_LOAD)])
    with pytest.raises(ChakraError, match=r"t\.0\.et: node 4 \('load'\): type MEM_LOAD_NODE is "
                                          r"not supported; supported: COMP_NODE, COMM_COLL_NODE"):
        read_traces(tmp_path)


def test_unsupported_collective_is_named(tmp_path):
    _write(tmp_path / "t.0.et", [_coll(9, "bcast", comm=BROADCAST)])
    with pytest.raises(ChakraError, match=r"node 9 \('bcast'\): comm_type BROADCAST is not "
                                          r"supported; supported: ALL_REDUCE, ALL_GATHER"):
        read_traces(tmp_path)


def test_a_send_needs_its_receive(tmp_path):
    send = [Node(id=0, name="s", type=SEND, attr=[
        _attr("comm_src", int32_val=0), _attr("comm_dst", int32_val=1),
        _attr("comm_size", int64_val=8)])]
    _write(tmp_path / "t.0.et", send)
    _write(tmp_path / "t.1.et", [Node(id=0, name="c", type=COMP)])
    with pytest.raises(ChakraError, match=r"transfer rank0>rank1:0: send .* receive None"):
        read_traces(tmp_path)


def test_deps_order_nodes_and_stray_ctrl_deps_drop(tmp_path):
    # node 1 listed after 2, which needs it; 2's ctrl_deps name a later node and a lost one
    _write(tmp_path / "t.0.et", [Node(id=2, name="b", type=COMP, data_deps=[1],
                                      ctrl_deps=[3, 99]),
                                 Node(id=1, name="a", type=COMP),
                                 Node(id=3, name="c", type=COMP, ctrl_deps=[2])])
    assert [(op.id, op.deps) for op in read_traces(tmp_path).ranks["rank0"]] == [
        (1, ()), (2, (1,)), (3, (2,))]
    _write(tmp_path / "t.0.et", [Node(id=1, name="a", type=COMP, data_deps=[2]),
                                 Node(id=2, name="b", type=COMP, data_deps=[1])])
    with pytest.raises(ChakraError, match="data_deps cycle"):
        read_traces(tmp_path)


def test_writer_needs_one_collective_order_per_group(tmp_path):
    g = ("r0", "r1")
    ops = [Op(0, "coll", "x", coll="allreduce", size_bytes=8, group=g),
           Op(1, "coll", "y", coll="allreduce", size_bytes=8, group=g)]
    job = Job(ranks={"r0": ops, "r1": [replace(ops[1], id=0), replace(ops[0], id=1)]})
    with pytest.raises(ChakraError, match="matches them by order"):
        write_traces(job, tmp_path)


def test_trace_files_are_one_prefix_ids_0_to_n_minus_1(tmp_path):
    for name in ("t.0.et", "t.2.et"):
        _write(tmp_path / name, [Node(id=0, name="c", type=COMP)])
    with pytest.raises(ChakraError, match=r"rank ids \[0, 2\] are not 0 to 1"):
        read_traces(tmp_path)
    _write(tmp_path / "u.1.et", [Node(id=0, name="c", type=COMP)])
    with pytest.raises(ChakraError, match="traces of prefixes t, u"):
        read_traces(tmp_path)
    assert list(read_traces([tmp_path / "t.0.et"]).ranks) == ["rank0"]
