# C declarations for traffic/patch.py, read only when Cython compiles it: the data
# patcher becomes an extension type with C fields, its `write` cpdef (the agent calls it
# per data packet, a C call) and the ICRC's table look-ups C array reads. The ACK
# patcher stays a closure (one per ACK, fewer than data packets).

cimport cython


cdef class DataPatch:
    cdef public bytearray buf
    cdef public object head, pack, pack_icrc, pack_ck, crc32
    cdef public long long udp, ck_at, icrc_at
    cdef public object mid
    cdef public tuple ext
    cdef public long long seed
    cdef public const unsigned int[:] lo, hi
    cdef public long long k, udp_base, ack
    cdef public bint stamped, checksum, common

    @cython.locals(buf=bytearray, word=cython.longlong, c=cython.longlong)
    cpdef write(self, long long psn, object sport, object ts_ns=*, object msg_id=*,
                object offset=*)
