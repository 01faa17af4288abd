# C declarations for traffic/rx.py, read only when Cython compiles it: RxSocket becomes an
# extension type, and where it reads in batches (`batched`: compiled, no delay line) one
# recvmmsg(2) fills up to RX_SLOTS of its buffers at once, each datagram's kernel receive
# stamp (SO_TIMESTAMPNS) and IP TOS byte (IP_RECVTOS) taken from its ancillary data, so
# neither a Python call per datagram nor an ioctl(SIOCGSTAMPNS) per stamp is made.
# The arrays below hold RX_SLOTS (traffic/rx.py) entries; a test checks the two agree.

cimport cython
from libc.errno cimport EAGAIN, EINTR
from libc.errno cimport errno as c_errno
from libc.string cimport memcpy
from posix.time cimport timespec
from posix.uio cimport iovec


cdef extern from "<sys/socket.h>" nogil:
    cdef struct msghdr:
        void *msg_name
        unsigned int msg_namelen
        iovec *msg_iov
        size_t msg_iovlen
        void *msg_control
        size_t msg_controllen
        int msg_flags
    cdef struct mmsghdr:
        msghdr msg_hdr
        unsigned int msg_len
    cdef struct cmsghdr:
        size_t cmsg_len
        int cmsg_level
        int cmsg_type
    cmsghdr *CMSG_FIRSTHDR(msghdr *)
    cmsghdr *CMSG_NXTHDR(msghdr *, cmsghdr *)
    unsigned char *CMSG_DATA(cmsghdr *)
    int recvmmsg(int, mmsghdr *, unsigned int, int, timespec *)
    int MSG_DONTWAIT, MSG_TRUNC, SOL_SOCKET, SCM_TIMESTAMPNS


cdef extern from "<netinet/in.h>" nogil:
    int IPPROTO_IP, IP_TOS


cdef class RxSocket:
    cdef public long long port
    cdef public object sock
    cdef public int fd
    cdef public object recv_into
    cdef public bint kernel_stamps, batched, tos
    cdef public long long realtime_offset_ns
    cdef public list bufs
    cdef public long long cur, length
    cdef public bint ce_mark, truncated
    cdef mmsghdr c_msgs[32]
    cdef iovec c_iovs[32]
    cdef unsigned char c_ctrl[32][64]
    cdef long long c_stamps[32]
    cdef unsigned int c_lens[32]
    cdef unsigned char c_tos[32]
    cdef bint c_trunc[32]

    cpdef long long read(self, long long limit) except -1
    cpdef bytearray datagram(self, long long i)
    cpdef long long arrival_ns(self) except? -1


@cython.boundscheck(False)
cdef inline void batch_setup(RxSocket s):
    """Point each slot's message at its buffer (the bytearrays never resize) and its
    control space, once."""
    cdef long long i
    cdef char *p
    cdef msghdr *h
    for i in range(32):
        p = s.bufs[i]
        s.c_iovs[i].iov_base = p
        s.c_iovs[i].iov_len = len(s.bufs[i])
        h = &s.c_msgs[i].msg_hdr
        h.msg_name = NULL
        h.msg_namelen = 0
        h.msg_iov = &s.c_iovs[i]
        h.msg_iovlen = 1
        h.msg_control = &s.c_ctrl[i][0]


@cython.boundscheck(False)
cdef inline long long batch_read(RxSocket s, unsigned int limit) except -1:
    """recvmmsg up to `limit` (<= 32) waiting datagrams; their count (0: none waiting)."""
    cdef unsigned int i
    cdef int got
    cdef msghdr *h
    cdef cmsghdr *c
    cdef timespec ts
    for i in range(limit):      # what the kernel wrote back last time
        h = &s.c_msgs[i].msg_hdr
        h.msg_controllen = 64
        h.msg_flags = 0
    while True:
        got = recvmmsg(s.fd, s.c_msgs, limit, MSG_DONTWAIT, NULL)
        if got >= 0:
            break
        if c_errno == EAGAIN:
            return 0
        if c_errno != EINTR:
            raise OSError(c_errno, "recvmmsg")
    for i in range(<unsigned int>got):
        h = &s.c_msgs[i].msg_hdr
        s.c_lens[i] = s.c_msgs[i].msg_len
        s.c_trunc[i] = (h.msg_flags & MSG_TRUNC) != 0
        s.c_stamps[i] = 0
        s.c_tos[i] = 0
        c = CMSG_FIRSTHDR(h)
        while c != NULL:
            if c.cmsg_level == SOL_SOCKET and c.cmsg_type == SCM_TIMESTAMPNS:
                memcpy(&ts, CMSG_DATA(c), sizeof(timespec))
                s.c_stamps[i] = (<long long>ts.tv_sec * 1000000000 + ts.tv_nsec
                                 - s.realtime_offset_ns)
            elif c.cmsg_level == IPPROTO_IP and c.cmsg_type == IP_TOS:
                s.c_tos[i] = CMSG_DATA(c)[0]
            c = CMSG_NXTHDR(h, c)
    return got
