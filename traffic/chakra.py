"""MLCommons Chakra execution traces (per-rank .et files) read into, and written from, a Job.

Schema: package ChakraProtoMsg of mlcommons/chakra schema/protobuf/et_def.proto (tag v0.0.4,
unchanged at 21585d8), declared below without protoc, with Chakra's field numbers and enum
values, so Chakra's own traces parse. A file `<prefix>.<rank id>.et` is a stream of messages,
each after a varint of its size (as Chakra's protolib encodeMessage writes): GlobalMetadata,
then one Node per op. Gzipped files are read too.
Bounds: a trace is read in chunks, gunzipped as it is read, and refused past MAX_TRACE_BYTES
(decompressed), all of a job's past MAX_TRACES_BYTES, a rank past MAX_NODES_PER_RANK nodes:
what a job of a real model needs, and what this machine holds without trouble. A file that
is not a regular file (a FIFO, a device) is refused unopened.

    Node                                              Op
    COMP_NODE: duration_micros                        comp: duration_ns
    COMM_COLL_NODE: comm_type, comm_size, pg_name     coll: coll, size_bytes, group
    COMM_SEND_NODE, COMM_RECV_NODE: comm_src,         send, recv: peer, size_bytes, tag
        comm_dst, comm_size, comm_tag
    id, name, data_deps (+ ctrl_deps, read)           id, name, deps

Attribute types are those ASTRA-sim's feeder reads: comm_type, comm_size int64; comm_src,
comm_dst, comm_tag int32; pg_name string; is_cpu_op bool (written false). The reader takes an
integer of any type. Our own attributes: GlobalMetadata `rank_name`, `job_name`; Node
`duration_ns` (int64, written when a duration is not whole microseconds: duration_micros then
holds it rounded, and the reader prefers `duration_ns`) and `tag_name` (the Op's tag).

Deps: a node comes after its data_deps (else in file order); a ctrl_dep counts when it names a
node placed before it. Chakra's feeder runs on data_deps alone, and PyTorch-converted traces use
ctrl_deps for parent ops, some absent from the trace, some later (a cycle if obeyed).
Ranks: the writer's trace i is the i-th rank of `job.ranks`. The reader names rank id i
`ranks[i]` when the caller gives names, else by its `rank_name`, else `rank<i>`.
Groups: comm_group.json beside the traces is ASTRA-sim's --comm-group-configuration,
{"<pg_name>": [rank ids, in ring order]}, pg names integers; the writer numbers groups 1, 2, ...
A pg_name of "" or "0" is every rank in id order, as in ASTRA-sim.
Collectives: Chakra has no collective id; the members of a group issue its collectives in one
order, so the k-th collective of group P at each member is one collective. Its name is the
members' node name when they agree on it and no other collective has it, else `pg<P>#<k>`.
Tags: the writer numbers distinct tags in sorted order as comm_tag. Without `tag_name` the
reader names a transfer `<src>><dst>:<comm_tag>`, its k-th repeat (k > 0, in node order)
`<src>><dst>:<comm_tag>#<k>`, so a send and its receive match.
"""

from __future__ import annotations

import glob
import gzip
import heapq
import json
import os
import re
import stat
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from traffic.job import Job, JobError, Op, check

SCHEMA_VERSION = "0.0.4"
COMM_GROUP_FILE = "comm_group.json"
NODE_TYPES = ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE",
              "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE")
COMM_TYPES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST",
              "ALL_TO_ALL", "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")
COMP, SEND, RECV, COLL = 4, 5, 6, 7
KIND_OF_TYPE = {COMP: "comp", COLL: "coll", SEND: "send", RECV: "recv"}
TYPE_OF_KIND = {k: t for t, k in KIND_OF_TYPE.items()}
COLL_OF_TYPE = {0: "allreduce", 2: "allgather", 7: "reducescatter", 6: "alltoall"}
TYPE_OF_COLL = {c: t for t, c in COLL_OF_TYPE.items()}
# AttributeProto's oneof `value`, in field order: each type's scalar, then its list
_VALUE_TYPES = ("double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
                "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes")
_NAME = re.compile(r"(.+)\.(\d+)\.et")
MAX_TRACE_BYTES = 64 << 20       # one rank's trace, decompressed
MAX_TRACES_BYTES = 256 << 20     # every rank's together, decompressed
MAX_NODES_PER_RANK = 200_000     # some 200 MB of nodes and ops (a real step has thousands)
CHUNK_BYTES = 1 << 20            # read (and gunzipped) this much at a time


class ChakraError(ValueError):
    """A trace that does not read as a Job: names the file, the node and what is wrong."""


def _schema() -> descriptor_pb2.FileDescriptorProto:
    """et_def.proto less its Tensor message; fields `[repeated] type name`, numbered 1, 2, ..."""
    fdp = descriptor_pb2.FileDescriptorProto(name="chakra/et_def.proto",
                                             package="ChakraProtoMsg", syntax="proto3")
    f = descriptor_pb2.FieldDescriptorProto
    for name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COMM_TYPES)):
        enum = fdp.enum_type.add(name=name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)

    def message(name: str, *fields: str, oneof: tuple[str, ...] = ()) -> None:
        msg = fdp.message_type.add(name=name)
        for number, spec in enumerate(fields + oneof, 1):
            *repeated, kind, fname = spec.split()
            fd = msg.field.add(name=fname, number=number,
                               label=f.LABEL_REPEATED if repeated else f.LABEL_OPTIONAL)
            if kind in _VALUE_TYPES:
                fd.type = getattr(f, f"TYPE_{kind.upper()}")
            else:
                fd.type = f.TYPE_ENUM if kind == "NodeType" else f.TYPE_MESSAGE
                fd.type_name = f".ChakraProtoMsg.{kind}"
            if number > len(fields):
                fd.oneof_index = 0
        if oneof:
            msg.oneof_decl.add(name="value")

    for kind in _VALUE_TYPES:
        message(f"{kind.capitalize()}List", f"repeated {kind} values")
    message("AttributeProto", "string name", "string doc_string", oneof=tuple(
        s for k in _VALUE_TYPES for s in (f"{k} {k}_val", f"{k.capitalize()}List {k}_list")))
    message("GlobalMetadata", "string version", "repeated AttributeProto attr")
    message("IOInfo", "string values", "string shapes", "string types")
    message("Node", "uint64 id", "string name", "NodeType type", "repeated uint64 ctrl_deps",
            "repeated uint64 data_deps", "uint64 start_time_micros", "uint64 duration_micros",
            "IOInfo inputs", "IOInfo outputs", "repeated AttributeProto attr")
    return fdp


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_schema())
AttributeProto, GlobalMetadata, Node = (
    message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"ChakraProtoMsg.{name}"))
    for name in ("AttributeProto", "GlobalMetadata", "Node"))


def _varint(n: int) -> bytes:
    """n as a protobuf varint: 7 bits a byte, low bits first, the high bit on all but the last."""
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _write_message(out: BinaryIO, msg) -> None:
    """Write msg after a varint of its serialized size."""
    data = msg.SerializeToString()
    out.write(_varint(len(data)) + data)


def _read_messages(data: bytes, path: Path | str) -> Iterator[bytes]:
    """Each message of a stream of varint-size-prefixed messages."""
    pos = 0
    while pos < len(data):
        start, size, shift = pos, 0, 0
        while True:
            if pos == len(data) or shift == 35:
                raise ChakraError(f"{path}: broken size prefix at byte {start}")
            size |= (data[pos] & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if data[pos - 1] < 0x80:
                break
        if pos + size > len(data):
            raise ChakraError(f"{path}: the message at byte {start} is cut short")
        yield data[pos:pos + size]
        pos += size


def _attr(name: str, value: int | str | bool, kind: str = "int64"):
    return AttributeProto(name=name, **{f"{kind}_val": value})


def _attrs(msg) -> dict:
    """A message's single-valued attributes, name to value."""
    return {a.name: getattr(a, a.WhichOneof("value")) for a in msg.attr
            if a.WhichOneof("value") and a.WhichOneof("value").endswith("_val")}


def write_traces(job: Job, folder: Path | str, prefix: str = "trace") -> list[Path]:
    """Write `<prefix>.<i>.et` for the i-th rank of job.ranks, and comm_group.json, into
    folder, in place of any earlier traces of prefix; return their paths, the traces in rank
    order, comm_group.json last."""
    check(job)
    ids = {rank: i for i, rank in enumerate(job.ranks)}
    groups: dict[tuple[str, ...], str] = {}
    order: dict[tuple[tuple[str, ...], str], list[str]] = {}
    tags = {t: i for i, t in enumerate(sorted(
        {op.tag for ops in job.ranks.values() for op in ops if op.kind in ("send", "recv")}))}
    for rank, ops in job.ranks.items():
        for op in (op for op in ops if op.kind == "coll"):
            groups.setdefault(op.group, str(len(groups) + 1))
            order.setdefault((op.group, rank), []).append(op.name)
    for (group, rank), names in order.items():
        if names != order[group, group[0]]:
            raise ChakraError(f"rank {rank} holds group {list(group)}'s collectives in the "
                              f"order {names}, rank {group[0]} in {order[group, group[0]]}: "
                              "Chakra matches them by order")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{prefix}.{i}.et" for i in range(len(ids))]
    for old in folder.glob(f"{glob.escape(prefix)}.*.et"):
        if (m := _NAME.fullmatch(old.name)) and m[1] == prefix:
            old.unlink()
    for path, (rank, ops) in zip(paths, job.ranks.items(), strict=True):
        with path.open("wb") as out:
            _write_message(out, GlobalMetadata(version=SCHEMA_VERSION, attr=[
                _attr("rank_name", rank, "string"), _attr("job_name", job.name, "string")]))
            for op in ops:
                _write_message(out, _node(op, ids[rank], ids, groups, tags))
    comm_groups = {pg: [ids[r] for r in group] for group, pg in groups.items()}
    (folder / COMM_GROUP_FILE).write_text(json.dumps(comm_groups, indent=1) + "\n")
    return [*paths, folder / COMM_GROUP_FILE]


def _node(op: Op, me: int, ids: dict[str, int], groups: dict, tags: dict[str, int]):
    """The Chakra node of an op of rank id `me`."""
    node = Node(id=op.id, name=op.name, type=TYPE_OF_KIND[op.kind], data_deps=op.deps,
                attr=[_attr("is_cpu_op", False, "bool")])
    if op.kind == "comp":
        micros, rest = divmod(op.duration_ns, 1000)
        node.duration_micros = micros + (rest >= 500)
        if rest:
            node.attr.append(_attr("duration_ns", op.duration_ns))
    elif op.kind == "coll":
        node.attr.extend([_attr("comm_type", TYPE_OF_COLL[op.coll]),
                          _attr("comm_size", op.size_bytes),
                          _attr("pg_name", groups[op.group], "string")])
    else:
        src, dst = (me, ids[op.peer]) if op.kind == "send" else (ids[op.peer], me)
        node.attr.extend([_attr("comm_src", src, "int32"), _attr("comm_dst", dst, "int32"),
                          _attr("comm_tag", tags[op.tag], "int32"),
                          _attr("comm_size", op.size_bytes), _attr("tag_name", op.tag, "string")])
    return node


def _trace_files(source: Path | str | Iterable[Path | str]) -> tuple[str, list[Path]]:
    """The traces' prefix and files, in rank id order (ids 0 to n-1)."""
    if isinstance(source, (str, Path)) and Path(source).is_dir():
        paths = [p for p in Path(source).glob("*.et") if _NAME.fullmatch(p.name)]
    else:
        paths = [Path(source)] if isinstance(source, (str, Path)) else [Path(p) for p in source]
    if not paths:
        raise ChakraError(f"{source}: no <prefix>.<rank id>.et traces")
    found = [(p, _NAME.fullmatch(p.name)) for p in paths]
    if not all(m for _, m in found):
        raise ChakraError(f"{next(p for p, m in found if not m)}: not named <prefix>.<id>.et")
    prefixes = sorted({m[1] for _, m in found})
    if len(prefixes) != 1:
        raise ChakraError(f"{paths[0].parent}: traces of prefixes {', '.join(prefixes)}: "
                          "give one prefix's files")
    files = {int(m[2]): p for p, m in found}
    if sorted(int(m[2]) for _, m in found) != list(range(len(found))):
        raise ChakraError(f"{paths[0].parent}: rank ids {sorted(files)} are not 0 to "
                          f"{len(found) - 1}, a file each")
    return prefixes[0], [files[i] for i in range(len(files))]


def trace_files(source: Path | str | Iterable[Path | str]) -> list[Path]:
    """The trace files of `source` (a folder, a file or files), in rank id order."""
    return _trace_files(source)[1]


def check_traces(source: Path | str | Iterable[Path | str]) -> list[Path]:
    """The trace files of `source`, each read within the bounds (module docstring) and its
    messages counted, not parsed: ChakraError for what read_traces would refuse for its
    size or framing, at a fraction of its cost."""
    files, left = trace_files(source), MAX_TRACES_BYTES
    for path in files:
        data = _trace_bytes(path, left)
        left -= len(data)
        for count, _ in enumerate(_read_messages(data, path)):
            if count > MAX_NODES_PER_RANK:
                raise ChakraError(f"{path}: more than {MAX_NODES_PER_RANK} nodes, the most "
                                  "a rank's trace may have")
    return files


def _trace_bytes(path: Path, budget: int = MAX_TRACE_BYTES) -> bytes:
    """A trace's bytes, gunzipped if gzipped, read CHUNK_BYTES at a time and refused
    (ChakraError) past min(budget, MAX_TRACE_BYTES) bytes: never more is held."""
    limit = min(budget, MAX_TRACE_BYTES)
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise ChakraError(f"{path}: not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise ChakraError(f"{path}: cannot be read ({e.strerror or e})") from None
    data = bytearray()
    with os.fdopen(fd, "rb") as raw:
        if not stat.S_ISREG(os.fstat(raw.fileno()).st_mode):    # replaced since the stat
            raise ChakraError(f"{path}: not a regular file")
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
        try:
            while chunk := stream.read(min(CHUNK_BYTES, limit + 1 - len(data))):
                data += chunk
                if len(data) > limit:
                    raise ChakraError(
                        f"{path}: more than {limit} bytes{' gunzipped' if gzipped else ''}"
                        f", the most a trace may have (at most {MAX_TRACE_BYTES} a rank, "
                        f"{MAX_TRACES_BYTES} in all)")
        except (OSError, EOFError, zlib.error) as e:     # gzip.BadGzipFile is an OSError
            if isinstance(e, OSError) and e.errno is not None:
                raise ChakraError(f"{path}: cannot be read ({e.strerror or e})") from None
            raise ChakraError(f"{path}: a broken gzip stream ({e})") from None
    return bytes(data)


def _read_file(path: Path, data: bytes) -> tuple[dict, list[tuple[object, tuple[int, ...]]]]:
    """A trace's metadata attributes, and its nodes with their deps in order (module doc)."""
    messages = _read_messages(data, path)
    first = next(messages, None)
    if first is None:
        raise ChakraError(f"{path}: empty, without its GlobalMetadata")
    try:
        meta = GlobalMetadata.FromString(first)
        nodes = []
        for m in messages:
            if len(nodes) == MAX_NODES_PER_RANK:
                raise ChakraError(f"{path}: more than {MAX_NODES_PER_RANK} nodes, the most "
                                  "a rank's trace may have")
            nodes.append(Node.FromString(m))
    except DecodeError as e:
        raise ChakraError(f"{path}: not a Chakra trace ({e})") from e
    at = {n.id: i for i, n in enumerate(nodes)}
    if len(at) < len(nodes):
        dup = next(n for n in nodes if nodes[at[n.id]] is not n)
        raise ChakraError(f"{path}: node id {dup.id} is used twice")
    waiting, children, ready = [0] * len(nodes), [[] for _ in nodes], []
    for i, n in enumerate(nodes):
        deps = set(n.data_deps)
        if deps - at.keys():
            raise ChakraError(f"{path}: node {n.id} ({n.name!r}) depends on node "
                              f"{min(deps - at.keys())}, which the trace lacks")
        for d in deps:
            children[at[d]].append(i)
        waiting[i] = len(deps)
        if not deps:
            heapq.heappush(ready, i)
    placed: dict[int, tuple[int, ...]] = {}     # node id -> its deps, in the order placed
    while ready:
        n = nodes[i := heapq.heappop(ready)]
        placed[n.id] = tuple(dict.fromkeys([*n.data_deps, *(d for d in n.ctrl_deps
                                                              if d in placed)]))
        for c in children[i]:
            waiting[c] -= 1
            if not waiting[c]:
                heapq.heappush(ready, c)
    if len(placed) < len(nodes):
        stuck = next(n for n in nodes if n.id not in placed)
        raise ChakraError(f"{path}: node {stuck.id} ({stuck.name!r}) is on a data_deps cycle")
    return _attrs(meta), [(nodes[at[i]], deps) for i, deps in placed.items()]


def read_traces(source: Path | str | Iterable[Path | str],
                ranks: list[str] | None = None) -> Job:
    """The Job of a folder's `<prefix>.<id>.et` traces (or of the given trace files) and of
    the comm_group.json beside them; ranks named as the module docstring says."""
    prefix, files = _trace_files(source)
    traces, left = [], MAX_TRACES_BYTES
    for p in files:
        data = _trace_bytes(p, left)
        left -= len(data)
        traces.append(_read_file(p, data))
        del data
    if ranks is not None and len(ranks) != len(files):
        raise ChakraError(f"{len(ranks)} rank names for {len(files)} traces of {prefix}")
    names = list(ranks) if ranks is not None else [
        meta.get("rank_name") or f"rank{i}" for i, (meta, _) in enumerate(traces)]
    if len(set(names)) < len(names):
        raise ChakraError(f"traces of {prefix}: rank names {names} repeat")
    group_file = files[0].parent / COMM_GROUP_FILE
    try:
        comm_groups = json.loads(_trace_bytes(group_file)) if group_file.exists() else None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ChakraError(f"{group_file}: not JSON ({e})") from e
    if not isinstance(comm_groups, dict | None):
        raise ChakraError(f"{group_file}: not an object of groups, {{\"1\": [0, 1]}}")

    def group_of(pg: str, where: str) -> tuple[str, ...]:
        if pg == "0":
            return tuple(names)
        if comm_groups is None:
            raise ChakraError(f"{where}: names process group {pg!r}, and there is no {group_file}")
        ids = comm_groups.get(pg)
        if not isinstance(ids, list) or not all(
                isinstance(i, int) and 0 <= i < len(names) for i in ids):
            raise ChakraError(f"{group_file}: group {pg!r} is {ids!r}, not a list of rank ids "
                              f"0 to {len(names) - 1}")
        return tuple(names[i] for i in ids)

    job = Job(name=traces[0][0].get("job_name") or prefix)
    seen: Counter = Counter()
    colls: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for me, (path, (_, nodes)) in enumerate(zip(files, traces, strict=True)):
        ops = job.ranks.setdefault(names[me], [])
        for node, deps in nodes:
            where = f"{path}: node {node.id} ({node.name!r})"
            op, key = _op(node, deps, me, names, where, group_of)
            count = (op.kind, me if op.kind == "coll" else -1, key)
            k, seen[count] = seen[count], seen[count] + 1
            if op.kind == "coll":
                colls.setdefault((key, k), []).append((names[me], len(ops)))
            elif key:
                op = replace(op, tag=f"{key}#{k}" if k else key)
            ops.append(op)
    common = {key: {job.ranks[r][i].name for r, i in m} for key, m in colls.items()}
    taken = Counter(next(iter(n)) for n in common.values() if len(n) == 1)
    for (pg, k), members in colls.items():
        name = next(iter(common[pg, k])) if len(common[pg, k]) == 1 else ""
        for r, i in members:
            job.ranks[r][i] = replace(job.ranks[r][i], name=name if name and taken[name] == 1
                                      else f"pg{pg}#{k}")
    try:
        check(job)
    except JobError as e:
        where = next((str(files[i]) for i, r in enumerate(names) if str(e).startswith(
            f"rank {r},")), f"traces {files[0].parent / prefix}.*.et")
        raise ChakraError(f"{where}: {e}") from e
    return job


def _op(node, deps: tuple[int, ...], me: int, names: list[str], where: str,
        group_of) -> tuple[Op, str]:
    """A node's op, and its key among the ranks: a collective's pg_name, or a transfer's tag
    before its `#<k>` (empty when the node carries tag_name)."""
    if node.type not in KIND_OF_TYPE:
        kind = NODE_TYPES[node.type] if node.type < len(NODE_TYPES) else str(node.type)
        raise ChakraError(f"{where}: type {kind} is not supported; supported: "
                          f"{', '.join(NODE_TYPES[t] for t in KIND_OF_TYPE)}")
    a = _attrs(node)

    def number(key: str, default: int | None = None) -> int:
        value = a.get(key, default)
        if value is None:
            raise ChakraError(f"{where}: has no attr {key}")
        if not isinstance(value, int):
            raise ChakraError(f"{where}: attr {key} is {value!r}, not an integer")
        return value

    op = Op(node.id, KIND_OF_TYPE[node.type], node.name, deps)
    if node.type == COMP:
        return replace(op, duration_ns=number("duration_ns", node.duration_micros * 1000)), ""
    size = number("comm_size")
    if node.type == COLL:
        comm = number("comm_type")
        if comm not in COLL_OF_TYPE:
            kind = COMM_TYPES[comm] if 0 <= comm < len(COMM_TYPES) else str(comm)
            raise ChakraError(f"{where}: comm_type {kind} is not supported; supported: "
                              f"{', '.join(COMM_TYPES[t] for t in COLL_OF_TYPE)}")
        pg = str(a.get("pg_name", "")) or "0"
        return replace(op, coll=COLL_OF_TYPE[comm], size_bytes=size,
                       group=group_of(pg, where)), pg
    src = number("comm_src", me if node.type == SEND else None)
    dst = number("comm_dst", me if node.type == RECV else None)
    if (src if node.type == SEND else dst) != me or not 0 <= min(src, dst) <= max(
            src, dst) < len(names):
        raise ChakraError(f"{where}: comm_src {src}, comm_dst {dst} do not fit rank {me} of "
                          f"0 to {len(names) - 1}")
    op = replace(op, size_bytes=size, peer=names[dst if node.type == SEND else src])
    if isinstance(a.get("tag_name"), str):
        return replace(op, tag=a["tag_name"]), ""
    return op, f"{names[src]}>{names[dst]}:{number('comm_tag', 0)}"
