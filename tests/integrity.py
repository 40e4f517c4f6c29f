#!/usr/bin/env python3
"""Raw frames for the end-to-end integrity tests (tests/tests/integrity.rs).
Run inside a testbed namespace; only testbed addresses are used.

  integrity.py corrupt IFACE SECS MAX
      watch the DATA this namespace's worker sends on IFACE; after each one,
      send up to 16 copies for later seqs of the same collective, each with
      one payload byte changed and the UDP checksum left as it was (so
      wrong): frames the switch would sum if it did not check. Stops after
      MAX frames or SECS seconds; prints the number sent.
  integrity.py results IFACE SECS
      check the UDP checksum of every RESULT that arrives on IFACE for SECS
      seconds; prints "good zero bad", the counts of RESULTs whose checksum
      verified, was 0 (none) or was wrong.
  integrity.py own-source IFACE DST_MAC SRC_IP SRC_MAC DST_IP COUNT
      send COUNT HEARTBEATs to DST_IP's aggregation port from SRC_IP and
      SRC_MAC (addresses the switch owns), with correct checksums; prints
      the number sent.

The wire layout is docs/PROTOCOL.md's: a 22-byte header (version in the
high nibble of the first byte, message type in the low), then the payload.
"""
import socket
import struct
import sys
import time

from rawframe import (
    AGG_PORT,
    HEADER,
    PACKET_OUTGOING,
    checksum,
    mac_bytes,
    sender,
    sniffer,
    udp_frame,
)

DATA, RESULT, HEARTBEAT = 1, 2, 7


def udp_checksum(src_ip, dst_ip, udp):
    """The checksum a UDP datagram (checksum field zeroed) calls for."""
    pseudo = src_ip + dst_ip + struct.pack(">BBH", 0, 17, len(udp))
    return checksum(pseudo + udp[:6] + b"\x00\x00" + udp[8:]) or 0xFFFF


def ip_checksum(header):
    return checksum(header[:10] + b"\x00\x00" + header[12:])


def parse(frame):
    """(ip header, udp datagram) of an Ethernet/IPv4/UDP frame whose IP
    and UDP lengths fit the frame, or None."""
    if len(frame) < 14 + 20 + 8 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
        return None
    ihl = (frame[14] & 0x0F) * 4
    total = struct.unpack(">H", frame[16:18])[0]
    if ihl < 20 or total > len(frame) - 14:
        return None
    ip = frame[14 : 14 + ihl]
    udp_len = struct.unpack(">H", frame[14 + ihl + 4 : 14 + ihl + 6])[0]
    if udp_len < 8 or ihl + udp_len > total:
        return None
    return ip, frame[14 + ihl : 14 + ihl + udp_len]


def agg_type(udp):
    if len(udp) < 8 + HEADER.size:
        return None
    return udp[8] & 0x0F


def corrupt(iface, secs, limit):
    s = sniffer(iface)
    sent = 0
    end = time.monotonic() + secs
    print("ready", flush=True)
    while sent < limit and time.monotonic() < end:
        try:
            frame, addr = s.recvfrom(65535)
        except socket.timeout:
            continue
        if addr[2] != PACKET_OUTGOING:
            continue
        p = parse(frame)
        if p is None:
            continue
        ip, udp = p
        if struct.unpack(">H", udp[2:4])[0] != AGG_PORT or agg_type(udp) != DATA:
            continue
        stored = struct.unpack(">H", udp[6:8])[0]
        # Only a complete frame as it left (checksum right) is a template.
        if stored == 0 or stored != udp_checksum(ip[12:16], ip[16:20], udp):
            continue
        vt, fl, job, rank, count, seq, coll, win, gen = HEADER.unpack(udp[8 : 8 + HEADER.size])
        if count == 0:
            continue
        ihl = len(ip)
        for ahead in range(1, 17):
            if sent >= limit:
                break
            hdr = HEADER.pack(vt, fl, job, rank, count, (seq + ahead) & 0xFFFFFFFF, coll, win, gen)
            payload = bytearray(udp[8 + HEADER.size :])
            payload[ahead % len(payload)] ^= 0x5A
            bad = udp[:8] + hdr + bytes(payload)
            if udp_checksum(ip[12:16], ip[16:20], bad) == stored:
                continue  # the changes happen to cancel: not a wrong checksum
            s.send(frame[: 14 + ihl] + bad + frame[14 + ihl + len(udp) :])
            sent += 1
        # Skip what queued meanwhile: the next template is a fresh frame.
        s.setblocking(False)
        try:
            while s.recv(65535):
                pass
        except BlockingIOError:
            pass
        s.settimeout(0.2)
        time.sleep(0.02)
    print(sent, flush=True)


def results(iface, secs):
    s = sniffer(iface)
    good = zero = bad = 0
    end = time.monotonic() + secs
    print("ready", flush=True)
    while time.monotonic() < end:
        try:
            frame, addr = s.recvfrom(65535)
        except socket.timeout:
            continue
        if addr[2] == PACKET_OUTGOING:
            continue
        p = parse(frame)
        if p is None:
            continue
        ip, udp = p
        if struct.unpack(">H", udp[0:2])[0] != AGG_PORT or agg_type(udp) != RESULT:
            continue
        stored = struct.unpack(">H", udp[6:8])[0]
        if stored == 0:
            zero += 1
        elif stored == udp_checksum(ip[12:16], ip[16:20], udp) and ip_checksum(ip) == struct.unpack(">H", ip[10:12])[0]:
            good += 1
        else:
            bad += 1
    print(good, zero, bad, flush=True)


def own_source(iface, dst_mac, src_ip, src_mac, dst_ip, count):
    s = sender(iface)
    src, dst = socket.inet_aton(src_ip), socket.inet_aton(dst_ip)
    # A HEARTBEAT for job 1; the switch would answer it if it took it.
    agg = HEADER.pack(0x20 | HEARTBEAT, 0, 1, 0, 0, 0, 0, 0, 1)
    frame = udp_frame(mac_bytes(src_mac), src, AGG_PORT, mac_bytes(dst_mac), dst, AGG_PORT, agg)
    for _ in range(count):
        s.send(frame)
        time.sleep(0.001)
    print(count, flush=True)


def main(argv):
    cmd = argv[1]
    if cmd == "corrupt":
        corrupt(argv[2], float(argv[3]), int(argv[4]))
    elif cmd == "results":
        results(argv[2], float(argv[3]))
    elif cmd == "own-source":
        own_source(argv[2], argv[3], argv[4], argv[5], argv[6], int(argv[7]))
    else:
        sys.exit("unknown command %r (see the docstring)" % cmd)


if __name__ == "__main__":
    main(sys.argv)
