# C declarations for traffic/port.py, read only when Cython compiles it: Port becomes an
# extension type with C fields (its wire clocks, counters, state) and its per-frame
# methods cpdef, so the agent's push and the clocks run without Python dispatch.
# `__slots__` in the .py names the same attributes for the interpreted engine.

cimport cython


cdef class Port:
    cdef public object ifname
    cdef public bint blocking
    cdef public object sock, send_frame
    cdef public object pending, pending_ns
    cdef public bint blocked
    cdef public long long retry_ns
    cdef public long long frames, eagain, enobufs, down_drops
    cdef public double ns_per_byte
    cdef public long long free_at, drain_at
    cdef public double busy_ns, starved_ns
    cdef public long long demand_since
    cdef public object outq

    cpdef push(self, bytearray frame, long long now, double path_ns_per_byte=*)
    @cython.locals(wire=double, drain=double)
    cpdef _clock(self, long long nbytes, long long now, double path_ns_per_byte)
    cpdef bint flush(self, long long now)
    cpdef long long wire_until(self, long long nbytes)
    cpdef waiting(self, long long now, bint ready=*)
    @cython.locals(drained=cython.longlong, idle=cython.longlong, queued=cython.longlong)
    cpdef _idle_since_demand(self, long long now)


@cython.locals(p=Port)
cpdef bint any_blocked(list ports)

@cython.locals(p=Port)
cpdef bint any_pending(list ports)
