#!/usr/bin/env python3
"""A member of a job that misbehaves, for the end-to-end tests
(tests/tests/forged_results.rs): it holds the job's secret, joins as a
worker written from docs/PROTOCOL.md would, and then abuses what a member
may send. Run inside a testbed namespace; only testbed addresses are used.

  attack_member.py resend SWITCH_IP PORT JOB RANK WORKERS SECRET_HEX RATE SECS
      join job JOB as RANK of WORKERS (a one-rank job completes each DATA
      at once), send chunk 0 once, print "ready" when its RESULT came, then
      send the same DATA again (RETX) RATE times a second for SECS seconds:
      every copy is answered from the switch's shadow and takes no work.
      Prints one JSON line: {"resent": N, "answered": M} (M: RETX RESULTs).
"""
import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import time

from rawframe import HEADER

VERSION = 4
HELLO, CHALLENGE, JOIN, JOIN_ACK, DATA, RESULT = 8, 9, 3, 4, 1, 2
RETX, LAST = 0x02, 0x04


def header(msg_type, job, rank, gen=0, count=0, seq=0, collective=0, flags=0):
    return HEADER.pack((VERSION << 4) | msg_type, flags, job, rank, count, seq, collective, 0, gen)


def recv_type(sock, want, deadline):
    """The next datagram of type WANT, or exits naming what was missing."""
    while time.monotonic() < deadline:
        try:
            d = sock.recv(65535)
        except socket.timeout:
            continue
        if len(d) >= 22 and d[0] & 0x0F == want:
            return d
    sys.exit("no reply of type %d from the switch" % want)


def join(sock, job, rank, workers, secret):
    """HELLO, CHALLENGE, JOIN, JOIN_ACK (docs/PROTOCOL.md, "Joining");
    returns the switch's generation."""
    deadline = time.monotonic() + 10
    sock.send(header(HELLO, job, rank) + os.urandom(16) + bytes(24))
    ch = recv_type(sock, CHALLENGE, deadline)
    gen = struct.unpack(">I", ch[18:22])[0]
    nonce = ch[22 + 16 : 22 + 32]
    ip, port = sock.getsockname()
    mac = hmac.new(
        secret,
        b"aggswitch v2 join"
        + struct.pack(">HHIIIHBB", job, rank, gen, 0, 0, workers, 0, 0)
        + nonce
        + socket.inet_aton(ip)
        + struct.pack(">H", port),
        hashlib.sha256,
    ).digest()
    sock.send(header(JOIN, job, rank, gen) + struct.pack(">HBB", workers, 0, 0) + nonce + mac)
    recv_type(sock, JOIN_ACK, deadline)
    return gen


def resend(switch_ip, port, job, rank, workers, secret, rate, secs):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect((switch_ip, port))
    sock.settimeout(0.2)
    gen = join(sock, job, rank, workers, secret)
    values = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    data = header(DATA, job, rank, gen, count=4, flags=LAST) + values
    sock.send(data)
    recv_type(sock, RESULT, time.monotonic() + 5)
    print("ready", flush=True)
    again = header(DATA, job, rank, gen, count=4, flags=LAST | RETX) + values
    sock.setblocking(False)
    resent = answered = 0
    gap = 1.0 / rate
    start = time.monotonic()
    while time.monotonic() < start + secs:
        sock.send(again)
        resent += 1
        next_at = start + resent * gap
        while True:
            try:
                d = sock.recv(65535)
                if len(d) >= 22 and d[0] & 0x0F == RESULT and d[1] & RETX:
                    answered += 1
            except BlockingIOError:
                pass
            if time.monotonic() >= next_at:
                break
            time.sleep(min(0.0005, max(0.0, next_at - time.monotonic())))
    print(json.dumps({"resent": resent, "answered": answered}), flush=True)


def main(argv):
    if len(argv) == 10 and argv[1] == "resend":
        resend(
            argv[2],
            int(argv[3]),
            int(argv[4]),
            int(argv[5]),
            int(argv[6]),
            bytes.fromhex(argv[7]),
            float(argv[8]),
            float(argv[9]),
        )
    else:
        sys.exit("usage: see the docstring of %s" % argv[0])


if __name__ == "__main__":
    main(sys.argv)
