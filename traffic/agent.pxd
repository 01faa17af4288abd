# C declarations for traffic/agent.py, read only when Cython compiles it: the Agent
# becomes an extension type (its per-packet counters and flags C fields), its hot paths
# cpdef with typed locals, and what they touch per packet typed from the neighbours'
# .pxd (flows, ports, entropy, the data patcher, the transports' state machines), so
# reading a flow's field or calling take/on_data/push/write is a C access or call.
# Fields that may hold None or a float (wake_ns, timer_ns: a DCQCN pacing time is a
# float) stay objects.

cimport cython

from traffic.entropy cimport Entropy
from traffic.flows cimport RecvFlow, SendFlow
from traffic.patch cimport DataPatch
from traffic.port cimport Port, any_blocked, any_pending
from traffic.rx cimport RxSocket
from traffic.transport cimport _Receiver, _Sender


cdef class Agent:
    cdef public object cfg, params
    cdef public dict ports
    cdef public object rx, plan
    cdef public list latency
    cdef public long long unknown_packets, bad_packets
    cdef public dict udp_before
    cdef public object started_ns
    cdef public long long wakeups
    cdef public object wakeups_until_done, done_cpu_s, done_wall_ns
    cdef public long long turns
    cdef public object timer_lag_ns, host_lags
    cdef public long long host_lags_end
    cdef public object rx_allowance_ns
    cdef public list step_lag_ns, step_starved_ns
    cdef public object _step_mark
    cdef public bint rx_empty
    cdef public object line
    cdef public bint read_tos
    cdef public long long ce_packets, cnps_sent, cnps_received, cnps_unknown
    cdef public bint timer_due
    cdef public object pace_ns
    cdef public long long rx_batch, pump_batch
    cdef public list port_list
    cdef public object timer_ns, wake_ns, deadline_ns, linger_until
    cdef public list wait_socks

    @cython.locals(rxs=RxSocket, left=cython.longlong, got=cython.longlong, i=cython.longlong,
                   rbuf=bytearray, now=cython.longlong, payload=cython.longlong,
                   sample_every=cython.longlong, got_data=bint, fresh=bint,
                   ce=bint, first=bint, psn_mask=cython.longlong,
                   offset_mask=cython.longlong, msn_mask=cython.longlong,
                   no_action=cython.longlong, op_ack=cython.longlong,
                   op_cnp=cython.longlong, data_min=cython.longlong,
                   trimmed_bytes=cython.longlong, ack_bytes=cython.longlong,
                   sack_bytes=cython.longlong, framing=cython.longlong,
                   n=cython.longlong, op=cython.longlong, psnw=cython.longlong,
                   aeth=cython.longlong, basew=cython.longlong, flags=cython.longlong,
                   msg=cython.longlong, offset=cython.longlong, psn=cython.longlong,
                   wire=cython.longlong, action=cython.longlong, sf=SendFlow,
                   f=RecvFlow, tx=_Sender, rx=_Receiver)
    cpdef bint _drain_rx(self)

    @cython.locals(ent=Entropy, sport=cython.longlong, k=cython.longlong, port=Port)
    cpdef _send_ack(self, RecvFlow f, object rx, long long action, long long now)

    @cython.locals(f=SendFlow, ent=Entropy, last=Port, patch=DataPatch, buf=bytearray,
                   payload=cython.longlong, every=cython.longlong, budget=cython.longlong,
                   offset_mask=cython.longlong, sent=cython.longlong, psn=cython.longlong,
                   sport=cython.longlong, k=cython.longlong, ports=list, tx=_Sender)
    cpdef bint _pump(self, long long now)

    @cython.locals(now=cython.longlong)
    cpdef turn(self)

