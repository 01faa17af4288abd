/* SPDX-License-Identifier: GPL-2.0 */
/* Written by scripts/build_bpf.py from fabric/wire.py: edit that, not this.
 * Offsets are from the start of the Ethernet frame (IPv4 without options). */
#ifndef AFT_WIRE_H
#define AFT_WIRE_H

#define ETH_BYTES 14
#define ETH_TYPE_AT 12            /* the ethertype, from the frame's start */
#define ETHERTYPE_IPV4 0x0800
#define IPV4_BYTES 20             /* no options */
#define IP_AT 14
#define IP_TOS_AT 15              /* DSCP << 2 | ECN */
#define IP_LEN_AT 16
#define IP_PROTO_AT 23
#define IP_CSUM_AT 24
#define IP_DST_AT 30
#define IP_VERSION_IHL 0x45
#define IP_PROTO_UDP 17
#define DSCP_SHIFT 2
#define ECN_MASK 0x03
#define UDP_BYTES 8
#define UDP_AT 34
#define UDP_DPORT_AT 36
#define UDP_LEN_AT 38
#define ROCE_UDP_PORT 4791        /* RoCEv2 and the UET-style flows */
#define BTH_BYTES 12
#define BTH_AT 42
#define BTH_OPCODE_AT 42
#define BTH_DQPN_AT 47
#define DATA_OPCODE_MAX 0x0a      /* RC data opcodes: SEND, RDMA WRITE */
#define UET_QPN_FLAG_BYTE 0x80    /* dQPN bit 23, in the dQPN's first byte */
#define TRIM_DSCP 46
#define TRIMMED_UDP_PAYLOAD 28    /* BTH + the stamp */
#define TRIMMED_FRAME_BYTES 70

/* one entry of the counters' map (fabric.wire.Count) */
struct count {
	__u64 bytes;
	__u64 frames;
};

#endif
