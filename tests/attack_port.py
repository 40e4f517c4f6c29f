#!/usr/bin/env python3
"""A host on another switch port forging members' addresses, for the
end-to-end port-binding tests (tests/tests/portbind.rs). Run inside a
testbed namespace; only testbed addresses are used. The aggregation
messages themselves come from the test (built with the proto crate); this
only wraps them in Ethernet/IPv4/UDP frames with forged source addresses
and valid IPv4 and UDP checksums, so that only the switch port they come
in on gives them away.

  attack_port.py send IFACE SRC DST FILE SECS
      send each UDP payload of FILE (hex, one per line) once from SRC to
      DST, spread over SECS seconds. Prints the number sent.

  attack_port.py flood IFACE SRC DST FILE SECS
      send the UDP payloads of FILE from SRC to DST over and over, back to
      back, for SECS seconds. Prints the number sent.

  attack_port.py local SRC DST FILE SECS
      send the UDP payloads of FILE from SRC to DST over and over for SECS
      seconds as IPv4 packets through a raw IP socket, so that the kernel
      routes them: to an address of this namespace they are delivered
      here, as from a host that reaches the worker without crossing the
      switch. Prints the number sent.

  attack_port.py probe IFACE SRC DST PAYLOAD COUNT WAIT
      send the UDP payload PAYLOAD (hex) COUNT times from SRC to DST, then
      listen WAIT seconds more for what DST sends back to SRC. Prints one
      JSON line: {"sent": N, "replies": [UDP payload hex, ...]}

SRC and DST are MAC,IPv4,UDP-port triples ("02:00:00:00:00:01,198.18.0.11,40000").
"""
import json
import socket
import struct
import sys
import time

from rawframe import mac_bytes, sender, sniffer, udp_frame


def addr(text):
    mac, ip, port = text.split(",")
    return mac_bytes(mac), socket.inet_aton(ip), int(port)


def frame(src, dst, payload):
    """PAYLOAD from SRC to DST, each (MAC, IP, UDP port) as addr() gives."""
    return udp_frame(src[0], src[1], src[2], dst[0], dst[1], dst[2], payload)


def send(iface, src, dst, path, secs):
    payloads = [bytes.fromhex(l) for l in open(path).read().split()]
    s = sender(iface)
    gap = secs / max(len(payloads), 1)
    sent = 0
    for p in payloads:
        s.send(frame(src, dst, p))
        sent += 1
        time.sleep(gap)
    print(sent, flush=True)


def flood(iface, src, dst, path, secs):
    frames = [frame(src, dst, bytes.fromhex(l)) for l in open(path).read().split()]
    s = sender(iface)
    sent = 0
    end = time.monotonic() + secs
    while time.monotonic() < end:
        for f in frames:
            try:
                s.send(f)
                sent += 1
            except BlockingIOError:
                pass
    print(sent, flush=True)


def local(src, dst, path, secs):
    # udp_frame's IPv4 packet, without its Ethernet header.
    packets = [frame(src, dst, bytes.fromhex(l))[14:] for l in open(path).read().split()]
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    to = (socket.inet_ntoa(dst[1]), 0)
    sent = 0
    end = time.monotonic() + secs
    while time.monotonic() < end:
        for p in packets:
            try:
                s.sendto(p, to)
                sent += 1
            except (BlockingIOError, PermissionError):
                pass
        time.sleep(0.001)
    print(sent, flush=True)


def probe(iface, src, dst, payload, count, wait):
    rx = sniffer(iface, 0.05)
    tx = sender(iface)
    request = frame(src, dst, payload)
    replies = []

    def take():
        try:
            f = rx.recv(65535)
        except socket.timeout:
            return
        # To SRC (its MAC, IP and UDP port) from DST's IP and UDP port.
        if len(f) < 42 or f[0:6] != src[0] or f[12:14] != b"\x08\x00":
            return
        ihl = (f[14] & 0x0F) * 4
        if f[23] != 17 or f[26:30] != dst[1] or f[30:34] != src[1]:
            return
        udp = 14 + ihl
        if struct.unpack("!HH", f[udp : udp + 4]) != (dst[2], src[2]):
            return
        replies.append(f[udp + 8 :].hex())

    for _ in range(count):
        tx.send(request)
        take()
    end = time.monotonic() + wait
    while time.monotonic() < end:
        take()
    print(json.dumps({"sent": count, "replies": replies}), flush=True)


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "send" and len(argv) == 7:
        send(argv[2], addr(argv[3]), addr(argv[4]), argv[5], float(argv[6]))
    elif cmd == "flood" and len(argv) == 7:
        flood(argv[2], addr(argv[3]), addr(argv[4]), argv[5], float(argv[6]))
    elif cmd == "local" and len(argv) == 6:
        local(addr(argv[2]), addr(argv[3]), argv[4], float(argv[5]))
    elif cmd == "probe" and len(argv) == 8:
        payload = bytes.fromhex(argv[5])
        probe(argv[2], addr(argv[3]), addr(argv[4]), payload, int(argv[6]), float(argv[7]))
    else:
        sys.exit("usage: see the docstring of %s" % argv[0])


if __name__ == "__main__":
    main(sys.argv)
