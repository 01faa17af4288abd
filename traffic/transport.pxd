# C declarations for traffic/transport.py, read only when Cython compiles it
# (scripts/build_compiled.py): the state machines become extension types with C integer
# fields, and their per-packet methods cpdef. The .py stays the program of both engines.
# Values that can exceed 64 bits stay Python objects: the SACK bitmap, the UET
# receiver's base and bitmap of arrivals (`above`, shifted by up to the window), and the
# send stamps a receiver reads off the wire (an unsigned 64-bit field).

cdef class _Sender:
    cdef public long long n, window, ack_every, rto_ns, una
    cdef public long long packets, retransmits, naks, acks, timeouts, last_progress_ns
    cdef public long long rto_wait_ns, rtt_psn, rtt_sent_ns, rtt_sum_ns, rtt_samples
    cdef public bint done

    cpdef bint ackreq(self, long long psn)
    cpdef bint _outstanding(self)


cdef class RoceSender(_Sender):
    cdef public long long next, high

    cpdef bint _outstanding(self)
    cpdef bint ready(self)
    cpdef long long take(self, long long now_ns)
    cpdef on_ack(self, long long now_ns, long long syndrome, long long psn,
                 long long sack_base=*, object sack_bitmap=*, long long ce_count=*)
    cpdef bint on_timer(self, long long now_ns)


cdef class UetSender(_Sender):
    cdef public long long threshold, next_new, seq, newly_acked, newest_seq
    cdef public bytearray acked, queued
    cdef public list sent_seq
    cdef public object resend, flight

    cpdef bint _outstanding(self)
    cpdef bint ready(self)
    cpdef long long take(self, long long now_ns)
    cpdef on_ack(self, long long now_ns, long long syndrome, long long psn,
                 long long sack_base=*, object sack_bitmap=*, long long ce_count=*)
    cpdef _detect_losses(self)
    cpdef bint on_timer(self, long long now_ns)


cdef class _Receiver:
    cdef public long long n, size_bytes, payload_bytes, last_bytes, ack_every
    cdef public bytearray delivered
    cdef public long long delivered_packets, bytes_delivered, packets, ooo_packets
    cdef public long long dup_packets, bad_packets, double_deliveries, max_reorder
    cdef public long long acks, naks, highest, since_ack, dup_run
    cdef public object newest_ts
    cdef public long long ce_marks, trimmed
    cdef public bint complete

    cpdef int delayed_ack(self)
    cpdef int _duplicate(self, bint ackreq)
    cpdef _deliver(self, long long psn)
    cpdef _reorder(self, long long psn, object ts_ns)


cdef class RoceReceiver(_Receiver):
    cdef public long long epsn
    cdef public bint nak_armed

    cpdef int on_data(self, long long psn, bint ackreq, object ts_ns=*)
    cpdef tuple ack_fields(self, int action)


cdef class UetReceiver(_Receiver):
    cdef public object base, above
    cdef public long long ooo_ack_gap, nak_psn

    cpdef int on_trimmed(self, long long psn)
    cpdef int on_data(self, long long psn, bint ackreq, object ts_ns=*)
    cpdef tuple ack_fields(self, int action)
