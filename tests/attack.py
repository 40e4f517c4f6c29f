#!/usr/bin/env python3
"""What an attacker on the testbed does, for the end-to-end security tests.
Run inside a testbed namespace; only testbed addresses are used.

  attack.py capture IFACE SECS OUT [VER_TYPE [COUNT]]
                                        save every aggregation JOIN (v4) the
                                        interface sends or sees, as hex lines
                                        (or every message of VER_TYPE, e.g.
                                        0x4a: PROVISION, whose header's count
                                        is COUNT when given: 1 for claims)
  attack.py watch IFACE SECS            for SECS seconds, count what the
                                        switch sends that IFACE receives (UDP
                                        from the aggregation port), by type
                                        and NACK reason; prints "ready", then
                                        one JSON line
  attack.py provision-flood ADDR PORT TENANT NAME N PER_ASK GARBAGE_EVERY
                                        N PROVISION claims of TENANT's job
                                        NAME, each MAC made with a fresh random
                                        key (nobody's): one ask per PER_ASK
                                        claims for a switch nonce, and every
                                        GARBAGE_EVERY-th claim a random nonce;
                                        prints one JSON line of what went and
                                        came back (messages and bytes)
  attack.py guess-names ADDR PORT TENANT N KNOWN SECS
                                        asks for N random job names of TENANT
                                        (every 50th the name KNOWN) over SECS
                                        seconds, then a claim with a wrong key
                                        for every 4th name answered; prints one
                                        JSON line of the answers by kind
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
import json
import os
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


def capture(iface, secs, out, ver_type=0x43, count=None):
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
        if p is None or len(p) < HEADER.size or p[0] != ver_type:
            continue
        if count is None or HEADER.unpack(p[: HEADER.size])[4] == count:
            frames.append(frame.hex())
    with open(out, "w") as f:
        f.write("\n".join(frames) + "\n")
    print(len(frames), flush=True)


def from_switch(frame):
    """The UDP payload of an Ethernet/IPv4/UDP frame from AGG_PORT (what a
    switch sends), or None."""
    if len(frame) < 14 + 20 + 8 or frame[12:14] != b"\x08\x00" or frame[14 + 9] != 17:
        return None
    udp = 14 + (frame[14] & 0x0F) * 4
    if struct.unpack(">H", frame[udp : udp + 2])[0] != AGG_PORT:
        return None
    return frame[udp + 8 :]


TYPE_NAMES = {
    1: "data", 2: "result", 3: "join", 4: "join_ack", 5: "leave", 6: "nack",
    7: "heartbeat", 8: "hello", 9: "challenge", 10: "provision", 11: "provisioned",
}


def kind_of(p):
    """"challenge", "nack_9", "provisioned", …: what an answer is."""
    if len(p) < HEADER.size:
        return "short"
    t = TYPE_NAMES.get(p[0] & 0x0F, "type_%d" % (p[0] & 0x0F))
    if t == "nack" and len(p) >= HEADER.size + 2:
        t += "_%d" % struct.unpack(">H", p[HEADER.size : HEADER.size + 2])[0]
    return t


def watch(iface, secs):
    s = sniffer(iface)
    kinds = {}
    frames = 0
    end = time.monotonic() + secs
    print("ready", flush=True)
    while time.monotonic() < end:
        try:
            frame, addr = s.recvfrom(65535)
        except socket.timeout:
            continue
        p = from_switch(frame)
        if addr[2] == PACKET_OUTGOING or p is None:
            continue
        frames += 1
        k = kind_of(p)
        kinds[k] = kinds.get(k, 0) + 1
    print(json.dumps({"frames": frames, "kinds": kinds}), flush=True)


PROVISION = struct.Struct(">32s64sHBBBBBB16s32s")  # 152 bytes (PROTOCOL.md)


def provision(tenant, name, gen, count, nonce, mac=bytes(32), job=0, workers=2):
    """A PROVISION: an ask (count 0) or a claim (count 1); f32, sum, auth
    port, no stats, normal priority."""
    body = PROVISION.pack(tenant.encode(), name.encode(), workers, 0, 0, 2, 0, 1, 0, nonce, mac)
    return HEADER.pack(0x4A, 0, job, 0, count, 0, 0, 0, gen) + body


def wrong_claim(tenant, name, gen, nonce, ip, port, job=0):
    """A claim whose MAC is made with a random key (nobody's), over what
    the spec says it covers."""
    unsigned = provision(tenant, name, gen, 1, nonce, job=job)
    covered = unsigned[HEADER.size : HEADER.size + 120]
    msg = b"aggswitch v4 provision" + struct.pack(">HI", job, gen) + covered + ip + port
    mac = hmac.new(os.urandom(32), msg, hashlib.sha256).digest()
    return unsigned[: HEADER.size + 120] + mac


class Peer:
    """A UDP socket to the switch that counts what it sends and receives."""

    def __init__(self, addr, port):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.s.connect((addr, port))
        self.sent = self.sent_bytes = self.recv = self.recv_bytes = 0
        self.kinds = {}

    def send(self, b):
        try:
            self.s.send(b)
        except (BlockingIOError, ConnectionRefusedError):
            return False
        self.sent += 1
        self.sent_bytes += len(b)
        return True

    def take(self, b):
        self.recv += 1
        self.recv_bytes += len(b)
        k = kind_of(b)
        self.kinds[k] = self.kinds.get(k, 0) + 1

    def drain(self, wait=0.0):
        """Every answer waiting, counted; with WAIT, also those that come
        until WAIT seconds pass without one."""
        got = []
        self.s.settimeout(wait if wait > 0 else None)
        if wait <= 0:
            self.s.setblocking(False)
        try:
            while True:
                b = self.s.recv(2048)
                self.take(b)
                got.append(b)
        except (BlockingIOError, socket.timeout, ConnectionRefusedError):
            pass
        return got

    def ask(self, tenant, name, wait=0.2):
        """An ask; the CHALLENGE answering it (gen, nonce, ip, port), or None.
        Other answers are counted."""
        ask_nonce = os.urandom(16)
        self.send(provision(tenant, name, 0, 0, ask_nonce))
        end = time.monotonic() + wait
        while time.monotonic() < end:
            for b in self.drain(max(0.001, end - time.monotonic())):
                if kind_of(b) == "challenge" and b[HEADER.size : HEADER.size + 16] == ask_nonce:
                    body = b[HEADER.size :]
                    gen = HEADER.unpack(b[: HEADER.size])[8]
                    return gen, body[16:32], body[32:36], body[36:38]
        return None

    def report(self, **extra):
        r = {
            "sent": self.sent,
            "sent_bytes": self.sent_bytes,
            "recv": self.recv,
            "recv_bytes": self.recv_bytes,
            "kinds": self.kinds,
        }
        r.update(extra)
        return r


def provision_flood(addr, port, tenant, name, n, per_ask, garbage_every):
    peer = Peer(addr, port)
    challenge = None
    asked = answered_asks = 0
    for i in range(n):
        if i % per_ask == 0:
            asked += 1
            c = peer.ask(tenant, name, wait=0.005)
            if c is not None:
                answered_asks += 1
                challenge = c
            if challenge is None:
                # No switch nonce yet (the budget is spent): garbage ones.
                challenge = (0, os.urandom(16), bytes(4), bytes(2))
        gen, nonce, ip, lport = challenge
        if garbage_every and i % garbage_every == garbage_every - 1:
            nonce = os.urandom(16)
        # Bursts of 100 at about 50 000 a second (as bad_joins).
        if i % 100 == 99:
            time.sleep(0.002)
            peer.drain()
        while not peer.send(wrong_claim(tenant, name, gen, nonce, ip, lport)):
            time.sleep(0.001)
    peer.drain(1.0)
    print(json.dumps(peer.report(asks=asked, asks_answered=answered_asks)), flush=True)


def guess_names(addr, port, tenant, n, known, secs):
    peer = Peer(addr, port)
    names = [known if i % 50 == 0 else os.urandom(12).hex() for i in range(n)]
    pending = {}  # ask nonce -> name
    answered = {}  # ask nonce -> the answer

    def collect(wait=0.0):
        for b in peer.drain(wait):
            echo = b[HEADER.size : HEADER.size + 16]
            if echo in pending:
                answered[echo] = b

    gap = secs / max(n, 1)
    for name in names:
        ask_nonce = os.urandom(16)
        pending[ask_nonce] = name
        peer.send(provision(tenant, name, 0, 0, ask_nonce))
        time.sleep(gap)
        collect()
    collect(1.0)
    answers = {"known": {}, "unknown": {}}
    challenge_sizes = set()
    challenged = []
    for ask_nonce, name in pending.items():
        b = answered.get(ask_nonce)
        kind = "none" if b is None else kind_of(b)
        side = answers["known" if name == known else "unknown"]
        side[kind] = side.get(kind, 0) + 1
        if kind == "challenge":
            challenge_sizes.add(len(b))
            body = b[HEADER.size :]
            gen = HEADER.unpack(b[: HEADER.size])[8]
            challenged.append((name, gen, body[16:32], body[32:36], body[36:38]))
    ask_kinds = dict(peer.kinds)
    peer.kinds = {}
    # Claims without the key, paced within the budget: every 4th name
    # answered (the known one among them).
    for name, gen, nonce, ip, lport in challenged[::4]:
        peer.send(wrong_claim(tenant, name, gen, nonce, ip, lport))
        time.sleep(gap)
        peer.drain()
    peer.drain(1.0)
    print(
        json.dumps(
            peer.report(
                asks=len(names),
                answers=answers,
                ask_kinds=ask_kinds,
                challenge_sizes=sorted(challenge_sizes),
                claims=len(challenged[::4]),
            )
        ),
        flush=True,
    )


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
        extra = [int(a, 0) for a in argv[5:7]]
        capture(argv[2], float(argv[3]), argv[4], *extra)
    elif cmd == "watch":
        watch(argv[2], float(argv[3]))
    elif cmd == "provision-flood":
        a = argv[2:]
        provision_flood(a[0], int(a[1]), a[2], a[3], int(a[4]), int(a[5]), int(a[6]))
    elif cmd == "guess-names":
        a = argv[2:]
        guess_names(a[0], int(a[1]), a[2], int(a[3]), a[4], float(a[5]))
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
