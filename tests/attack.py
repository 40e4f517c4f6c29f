#!/usr/bin/env python3
"""What an attacker on the testbed does, for the end-to-end security tests.
Run inside a testbed namespace; only testbed addresses are used.

  attack.py capture IFACE SECS OUT      save every aggregation JOIN (v4) the
                                        interface sends or sees, as hex lines
  attack.py replay IFACE FILE COUNT SECS
                                        send each saved frame COUNT times,
                                        byte for byte (source addresses
                                        included), spread over SECS
  attack.py flip-data IFACE SECS COUNT
                                        take up to COUNT aggregation DATA
                                        frames the interface sends within SECS,
                                        flip one payload bit in each, fix the
                                        UDP checksum, and send them again with
                                        their own (the member's) addresses
  attack.py bad-joins ADDR PORT JOB RANK WORKERS N
                                        ask for a CHALLENGE, then send N JOINs
                                        (for a job of WORKERS ranks) whose MAC
                                        is made with a wrong secret
  attack.py spoof-control IFACE SRC_MAC SRC_IP SRC_PORT DST_MAC DST_IP
                          DST_PORT JOB RANK GEN SECS
                                        for SECS seconds, send DST (a
                                        member) what would end or reset its
                                        collective, claiming to be SRC (the
                                        switch): NACK 1, 6 and 7 with a zero
                                        and a made-up tag, and a RESULT of
                                        generation GEN ^ 1. IFACE "-": as
                                        IPv4 packets through a raw IP
                                        socket, which the kernel routes (to
                                        an address of this namespace: the
                                        member's own, as from a host that
                                        reaches it without the switch)

It builds frames from docs/PROTOCOL.md (version 4) directly: it plays a
peer that does not know the secret, which the package never does.
"""
import hashlib
import hmac
import os
import socket
import struct
import sys
import time

from rawframe import AGG_PORT, HEADER, checksum, mac_bytes, sender, sniffer, udp_frame


def agg_payload(frame):
    """The UDP payload of an Ethernet/IPv4/UDP frame to AGG_PORT, or None."""
    if len(frame) < 14 + 20 + 8 or frame[12:14] != b"\x08\x00":
        return None
    ihl = (frame[14] & 0x0F) * 4
    if frame[14 + 9] != 17:
        return None
    udp = 14 + ihl
    if struct.unpack(">H", frame[udp + 2 : udp + 4])[0] != AGG_PORT:
        return None
    return frame[udp + 8 :]


def capture(iface, secs, out):
    s = sniffer(iface)
    frames = []
    end = time.monotonic() + secs
    print("ready", flush=True)
    while time.monotonic() < end:
        try:
            frame = s.recv(65535)
        except socket.timeout:
            continue
        p = agg_payload(frame)
        if p is not None and len(p) >= HEADER.size and p[0] == 0x43:
            frames.append(frame.hex())
    with open(out, "w") as f:
        f.write("\n".join(frames) + "\n")
    print(len(frames), flush=True)


def udp_checksum(frame):
    """The UDP checksum of an Ethernet/IPv4/UDP frame (RFC 768), over the
    pseudo header and the datagram with its checksum field zeroed."""
    ihl = (frame[14] & 0x0F) * 4
    udp = 14 + ihl
    dgram = bytearray(frame[udp:])
    dgram[6:8] = b"\x00\x00"
    pseudo = frame[14 + 12 : 14 + 20] + struct.pack(">BBH", 0, 17, len(dgram))
    return checksum(pseudo + bytes(dgram)) or 0xFFFF


def flip_data(iface, secs, count):
    s = sniffer(iface)
    frames = []
    end = time.monotonic() + secs
    while time.monotonic() < end and len(frames) < count:
        try:
            frame, addr = s.recvfrom(65535)
        except socket.timeout:
            continue
        p = agg_payload(frame)
        # Outgoing (PACKET_OUTGOING = 4) DATA (version 4, type 1) of one
        # datagram: count elements plus a 16-byte tag.
        if addr[2] != 4 or p is None or len(p) < HEADER.size + 1 or p[0] != 0x41:
            continue
        f = bytearray(frame)
        ihl = (f[14] & 0x0F) * 4
        udp = 14 + ihl
        if struct.unpack(">H", f[udp + 4 : udp + 6])[0] != len(f) - udp:
            continue  # a GSO super-frame, not one datagram
        f[udp + 8 + HEADER.size] ^= 0x01  # the first payload byte
        f[udp + 6 : udp + 8] = struct.pack(">H", udp_checksum(f))
        frames.append(bytes(f))
    out = sender(iface)
    for f in frames:
        out.send(f)
    print(len(frames), flush=True)


def replay(iface, path, count, secs):
    frames = [bytes.fromhex(l) for l in open(path).read().split()]
    s = sender(iface)
    sent = 0
    gap = secs / max(count, 1)
    for _ in range(count):
        for f in frames:
            s.send(f)
            sent += 1
        time.sleep(gap)
    print(sent, flush=True)


def bad_joins(addr, port, job, rank, workers, n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((addr, port))
    s.settimeout(2)
    hello_nonce = os.urandom(16)
    s.send(HEADER.pack(0x48, 0, job, rank, 0, 0, 0, 0, 0) + hello_nonce + bytes(24))
    reply = s.recv(2048)
    ver_type, _, _, _, _, _, _, _, gen = HEADER.unpack(reply[: HEADER.size])
    assert ver_type == 0x49, "expected a CHALLENGE, got %#x" % ver_type
    body = reply[HEADER.size :]
    assert body[:16] == hello_nonce
    nonce, ip, lport = body[16:32], body[32:36], body[36:38]
    wrong_secret = os.urandom(32)
    msg = (
        b"aggswitch v2 join"
        + struct.pack(">HHIIIHBB", job, rank, gen, 0, 0, workers, 0, 0)
        + nonce
        + ip
        + lport
    )
    mac = hmac.new(wrong_secret, msg, hashlib.sha256).digest()
    join = HEADER.pack(0x43, 0, job, rank, 0, 0, 0, 0, gen) + struct.pack(">HBB", workers, 0, 0)
    join += nonce + mac
    s.setblocking(False)
    sent = 0
    for i in range(n):
        # Bursts of 100 at about 50 000 a second: a flood the switch's
        # receive ring holds, so every JOIN reaches the switch's counters.
        if i % 100 == 99:
            time.sleep(0.002)
        try:
            s.send(join)
            sent += 1
        except BlockingIOError:
            time.sleep(0.001)
        try:
            while s.recv(2048):
                pass
        except (BlockingIOError, ConnectionRefusedError):
            pass
    print(sent, flush=True)


def spoof_control(iface, src_mac, src_ip, sport, dst_mac, dst_ip, dport, job, rank, gen, secs):
    payloads = []
    for reason in (1, 6, 7):
        for tag in (bytes(16), os.urandom(16)):
            nack = struct.pack(">HH", reason, 0) + bytes(16) + tag
            payloads.append(HEADER.pack(0x46, 0, job, rank, 0, 0, 0, 0, gen) + nack)
    # A RESULT of another generation: one element, 1e30.
    payloads.append(
        HEADER.pack(0x42, 0, job, rank, 1, 0, 0, 0, gen ^ 1) + struct.pack("<f", 1e30)
    )
    src = mac_bytes(src_mac), socket.inet_aton(src_ip)
    dst = mac_bytes(dst_mac), socket.inet_aton(dst_ip)
    frames = [udp_frame(src[0], src[1], sport, dst[0], dst[1], dport, p) for p in payloads]
    if iface == "-":
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        packets = [f[14:] for f in frames]  # without the Ethernet header

        def send(i):
            raw.sendto(packets[i], (dst_ip, 0))
    else:
        s = sender(iface)

        def send(i):
            s.send(frames[i])
    sent = 0
    end = time.monotonic() + secs
    while time.monotonic() < end:
        for i in range(len(frames)):
            send(i)
            sent += 1
        time.sleep(0.005)
    print(sent, flush=True)


def main(argv):
    cmd = argv[1]
    if cmd == "capture":
        capture(argv[2], float(argv[3]), argv[4])
    elif cmd == "replay":
        replay(argv[2], argv[3], int(argv[4]), float(argv[5]))
    elif cmd == "flip-data":
        flip_data(argv[2], float(argv[3]), int(argv[4]))
    elif cmd == "bad-joins":
        bad_joins(*[argv[2]] + [int(a) for a in argv[3:8]])
    elif cmd == "spoof-control":
        a = argv[2:]
        spoof_control(
            a[0], a[1], a[2], int(a[3]), a[4], a[5], int(a[6]),
            int(a[7]), int(a[8]), int(a[9]), float(a[10]),
        )
    else:
        sys.exit("unknown command %r (see the docstring)" % cmd)


if __name__ == "__main__":
    main(sys.argv)
