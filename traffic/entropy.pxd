# C declarations for traffic/entropy.py, read only when Cython compiles it: the agent
# asks a flow's Entropy for a source port per packet (spray, flowlet) and per ACK.
# `fixed` and `_last_ns` may be None: objects.

cdef class Entropy:
    cdef public object mode
    cdef public long long gap_ns, current
    cdef public object fixed
    cdef public bint flowlet
    cdef public list _table
    cdef public long long _i
    cdef public object _last_ns
    cdef public long long changes

    cpdef long long port(self, long long now_ns=*)
    cpdef on_wire_until(self, long long end_ns)
