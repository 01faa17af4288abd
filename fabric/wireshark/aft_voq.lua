-- Wireshark and tshark dissector for the AI-fabric testbed's VOQ control frame
-- (fabric/wire.py: voq_frame, parse_voq_frame; docs/voq.md, "On the wire").
--
--   tshark -r capture.pcap -X lua_script:aft_voq.lua -Y aft_voq
--   or copy this file into ~/.local/lib/wireshark/plugins/
--
-- Ethertype 0x88B6, after the 14-byte Ethernet header (network byte order):
--   0 version (1) | 1 opcode (1 pause, 2 credit) | 2 priority | 3 reserved
--   4 destination IPv4 | 8 pause quanta (0 = release) | 10 reserved
--  12 credit (bytes a second) | 16 sequence number; zero padding to the Ethernet minimum
--  follows.

local VOQ_ETHERTYPE = 0x88B6
local VOQ_VERSION = 1
local VOQ_BYTES = 20
local OP_PAUSE, OP_CREDIT = 1, 2

local voq = Proto("aft_voq", "AI-fabric testbed VOQ control")

local opcodes = { [OP_PAUSE] = "pause", [OP_CREDIT] = "credit" }

local f = voq.fields
f.version = ProtoField.uint8("aft_voq.version", "Version", base.DEC)
f.opcode = ProtoField.uint8("aft_voq.opcode", "Opcode", base.DEC, opcodes)
f.priority = ProtoField.uint8("aft_voq.priority", "Priority (802.1p)", base.DEC)
f.reserved = ProtoField.bytes("aft_voq.reserved", "Reserved")
f.dst = ProtoField.ipv4("aft_voq.dst", "Destination")
f.quanta = ProtoField.uint16("aft_voq.quanta", "Pause quanta (512 bit times; 0 = release)",
                             base.DEC)
f.credit = ProtoField.uint32("aft_voq.credit", "Credit (bytes a second)", base.DEC)
f.seq = ProtoField.uint32("aft_voq.seq", "Sequence number", base.DEC)

local e_short = ProtoExpert.new("aft_voq.short", "Frame shorter than the VOQ header",
                                expert.group.MALFORMED, expert.severity.ERROR)
local e_version = ProtoExpert.new("aft_voq.version.unknown", "Unknown VOQ version",
                                  expert.group.UNDECODED, expert.severity.WARN)
local e_opcode = ProtoExpert.new("aft_voq.opcode.unknown", "Unknown VOQ opcode",
                                 expert.group.UNDECODED, expert.severity.WARN)
voq.experts = { e_short, e_version, e_opcode }

function voq.dissector(tvb, pinfo, tree)
    pinfo.cols.protocol = "AFT-VOQ"
    local subtree = tree:add(voq, tvb(0, math.min(tvb:len(), VOQ_BYTES)))
    if tvb:len() < VOQ_BYTES then
        subtree:add_proto_expert_info(e_short)
        pinfo.cols.info = "VOQ (short frame)"
        return tvb:len()
    end
    local version = tvb(0, 1):uint()
    local version_item = subtree:add(f.version, tvb(0, 1))
    if version ~= VOQ_VERSION then
        version_item:add_proto_expert_info(e_version)
        pinfo.cols.info = "VOQ version " .. version .. " (unknown)"
        return tvb:len()
    end
    local opcode = tvb(1, 1):uint()
    local opcode_item = subtree:add(f.opcode, tvb(1, 1))
    subtree:add(f.priority, tvb(2, 1))
    subtree:add(f.reserved, tvb(3, 1))
    subtree:add(f.dst, tvb(4, 4))
    subtree:add(f.quanta, tvb(8, 2))
    subtree:add(f.reserved, tvb(10, 2))
    subtree:add(f.credit, tvb(12, 4))
    subtree:add(f.seq, tvb(16, 4))

    local prio = tvb(2, 1):uint()
    local dst = tostring(tvb(4, 4):ipv4())
    local quanta = tvb(8, 2):uint()
    if opcode == OP_PAUSE and quanta > 0 then
        pinfo.cols.info = string.format("VOQ pause dst=%s prio=%d quanta=%d", dst, prio, quanta)
    elseif opcode == OP_PAUSE then
        pinfo.cols.info = string.format("VOQ release dst=%s prio=%d", dst, prio)
    elseif opcode == OP_CREDIT then
        pinfo.cols.info = string.format("credit dst=%s %d B/s", dst, tvb(12, 4):uint())
    else
        opcode_item:add_proto_expert_info(e_opcode)
        pinfo.cols.info = string.format("VOQ opcode %d dst=%s prio=%d", opcode, dst, prio)
    end
    return VOQ_BYTES
end

DissectorTable.get("ethertype"):add(VOQ_ETHERTYPE, voq)
