# C declarations for traffic/patch.py, read only when Cython compiles it: the data
# patcher becomes an extension type with C fields, its `write` cpdef (the agent calls it
# per data packet, a C call) and the ICRC's table look-ups C array reads. The ACK
# patcher stays a closure (one per ACK, fewer than data packets).

cimport cython
from cpython.bytearray cimport PyByteArray_AS_STRING


cdef extern from "<zlib.h>" nogil:
    unsigned long crc32(unsigned long, const unsigned char *, unsigned int)


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
    cdef public long long head_at, head_len, psn_at

    @cython.locals(buf=bytearray, word=cython.longlong, c=cython.longlong)
    cpdef write(self, long long psn, object sport, object ts_ns=*, object msg_id=*,
                object offset=*)


cdef inline void put_be(unsigned char *p, unsigned long long v, int n):
    """`v`'s low `n` bytes at `p`, big-endian (struct's ">")."""
    cdef int i
    for i in range(n - 1, -1, -1):
        p[i] = v & 0xFF
        v >>= 8


cdef inline void write_common(DataPatch s, unsigned long long word, unsigned long long sport,
                              unsigned long long ts, unsigned long long msg,
                              unsigned long long offset):
    """DataPatch.write's common case: the region ">H{mid}sIQII" (mid already in place)
    and the ICRC, as its struct calls and zlib.crc32 would write them."""
    cdef unsigned char *b = <unsigned char *>PyByteArray_AS_STRING(s.buf)
    cdef unsigned long c
    put_be(b + s.udp, sport, 2)
    put_be(b + s.psn_at, word, 4)
    put_be(b + s.psn_at + 4, ts, 8)
    put_be(b + s.psn_at + 12, msg, 4)
    put_be(b + s.psn_at + 16, offset, 4)
    c = crc32(<unsigned long>s.seed, b + s.head_at, <unsigned int>s.head_len)
    c = s.lo[c & 0xFFFF] ^ s.hi[c >> 16] ^ <unsigned long>s.k
    b[s.icrc_at] = c & 0xFF             # ICRC: little-endian ("<I")
    b[s.icrc_at + 1] = (c >> 8) & 0xFF
    b[s.icrc_at + 2] = (c >> 16) & 0xFF
    b[s.icrc_at + 3] = (c >> 24) & 0xFF
