# C declarations for traffic/flows.py, read only when Cython compiles it
# (scripts/build_compiled.py): the flows become extension types (still dataclasses: Cython
# compiles the stdlib decorator for them), so the agent's per-packet reads of a flow's
# fields are C struct reads. The fields are declared in the dataclass's order (its
# __init__'s). Those that may be None (start_ns, end_ns, tx, rx, cc, gate) stay objects.

cdef class Flow:
    cdef public object tag, src, dst
    cdef public long long size_bytes, iteration, msg
    cdef public object role
    cdef public object start_ns, end_ns
    cdef public double path_ns


cdef class SendFlow(Flow):
    cdef public object tx, entropy
    cdef public list ports, slots
    cdef public long long npackets
    cdef public object cc
    cdef public double starved_ns


cdef class RecvFlow(Flow):
    cdef public object rx, entropy
    cdef public list ports, acks
    cdef public long long npackets, last_wire, samples, last_ns
    cdef public object gate
    cdef public list cnps
