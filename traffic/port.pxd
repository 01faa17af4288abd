# C declarations for traffic/port.py, read only when Cython compiles it: Port becomes an
# extension type with C fields (its wire clocks, counters, state) and its per-frame
# methods cpdef, so the agent's push and the clocks run without Python dispatch.
# `__slots__` in the .py names the same attributes for the interpreted engine.

cimport cython
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.errno cimport EINTR
from libc.errno cimport errno as c_errno


cdef extern from "<sys/socket.h>" nogil:
    ssize_t c_send "send"(int, const void *, size_t, int)


cdef class Port:
    cdef public object ifname
    cdef public bint blocking
    cdef public object sock, send_frame
    cdef public int fd
    cdef public bint direct
    cdef public object pending, pending_ns
    cdef public bint blocked
    cdef public long long retry_ns
    cdef public long long frames, eagain, enobufs, down_drops
    cdef public double ns_per_byte
    cdef public long long free_at, drain_at
    cdef public double busy_ns, starved_ns
    cdef public long long demand_since
    cdef public object outq
    cdef public Port wire
    cdef public list members
    cdef public object name

    cpdef int _send(self, object frame) except -1
    cpdef push(self, bytearray frame, long long now, double path_ns_per_byte=*)
    @cython.locals(w=Port, wire=double, drain=double)
    cpdef _clock(self, long long nbytes, long long now, double path_ns_per_byte)
    @cython.locals(w=Port)
    cpdef bint flush(self, long long now)
    @cython.locals(w=Port)
    cpdef long long wire_until(self, long long nbytes)
    @cython.locals(w=Port)
    cpdef waiting(self, long long now, bint ready=*)
    @cython.locals(w=Port, drained=cython.longlong, idle=cython.longlong,
                   queued=cython.longlong)
    cpdef _idle_since_demand(self, long long now)
    @cython.locals(p=Port, total=cython.longlong)
    cpdef long long queued(self)


@cython.locals(p=Port)
cpdef bint any_blocked(list ports)

@cython.locals(p=Port)
cpdef bint any_pending(list ports)


cdef inline int send_now(int fd, object frame) except -1:
    """send(2) of a bytearray or bytes frame: 0, or the errno refusing it."""
    cdef const char *p
    cdef Py_ssize_t n
    if type(frame) is bytearray:
        p = PyByteArray_AS_STRING(frame)
        n = PyByteArray_GET_SIZE(frame)
    else:
        p = PyBytes_AS_STRING(frame)
        n = PyBytes_GET_SIZE(frame)
    while c_send(fd, p, n, 0) < 0:
        if c_errno != EINTR:
            return c_errno
    return 0
