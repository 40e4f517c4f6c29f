#!/usr/bin/env python3
"""Attacks on switchd's /metrics endpoint, for tests/tests/management.rs.

Run from a host namespace of a testbed against the switch's metrics address.
Each mode prints one JSON line with what it saw (the Rust test asserts on
switchd's side: memory, threads, fds, and that /metrics still answers).

  endless ADDR:PORT BYTES   a request whose header line never ends: sends
                            BYTES of header without a newline, or until the
                            server closes the connection.
  slow ADDR:PORT N HOLD     opens N connections (sending nothing), then
                            every second sends one byte on each still open,
                            for HOLD seconds; then closes them all.
  flood ADDR:PORT SECS      GET /metrics as fast as one keep-alive
                            connection allows, for SECS seconds.
  get URL                   GET URL; prints the status and the body.
"""

import http.client
import json
import resource
import socket
import sys
import time
import urllib.error
import urllib.request


def parse_addr(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


def closed_by_peer(sock):
    """True when the peer closed (or reset) the connection."""
    try:
        # Whatever the server sent (a 408, say) is read and dropped: the
        # question is only whether the stream has ended.
        return sock.recv(65536, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def endless(addr, total):
    s = socket.create_connection(addr, timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: switch\r\nX-Endless: ")
    chunk = b"a" * 65536
    sent = 0
    closed = False
    t0 = time.monotonic()
    while sent < total:
        try:
            s.sendall(chunk)
            sent += len(chunk)
        except OSError:
            closed = True
            break
    answer = b""
    if not closed:
        # Everything went out (the kernel buffers some): the server must
        # still close the connection rather than wait for the rest.
        s.settimeout(10)
    try:
        while True:
            b = s.recv(65536)
            if not b:
                closed = True
                break
            answer += b
    except socket.timeout:
        pass  # still open 10 s later: not closed by the server
    except OSError:
        closed = True
    s.close()
    print(json.dumps({
        "mode": "endless",
        "sent": sent,
        "closed_by_server": closed,
        "status": answer.split(b"\r\n", 1)[0].decode(errors="replace"),
        "secs": round(time.monotonic() - t0, 3),
    }), flush=True)


def slow(addr, n, hold):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    socks = []
    failed = 0
    t0 = time.monotonic()
    for _ in range(n):
        try:
            s = socket.create_connection(addr, timeout=5)
            # Non-blocking from here: a check for the server's close must
            # not wait (a socket with a timeout would, up to the timeout).
            s.setblocking(False)
            socks.append(s)
        except OSError:
            failed += 1
    connect_secs = time.monotonic() - t0
    print(json.dumps({"mode": "slow", "event": "connected",
                      "connected": len(socks), "failed": failed}), flush=True)
    open_socks = list(socks)
    closed_within_1s = sum(1 for s in open_socks if closed_by_peer(s))
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        still = []
        for s in open_socks:
            if closed_by_peer(s):
                continue
            try:
                s.send(b"G")
                still.append(s)
            except OSError:
                pass
        open_socks = still
        time.sleep(1)
    still_open = sum(1 for s in open_socks if not closed_by_peer(s))
    for s in socks:
        s.close()
    print(json.dumps({
        "mode": "slow",
        "event": "done",
        "connected": len(socks),
        "failed": failed,
        "connect_secs": round(connect_secs, 3),
        "closed_at_once": closed_within_1s,
        "still_open_after_hold": still_open,
    }), flush=True)


def flood(addr, secs):
    host, port = addr
    conn = http.client.HTTPConnection(host, port, timeout=10)
    ok = other = reconnects = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < secs:
        try:
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            r.read()
            if r.status == 200:
                ok += 1
            else:
                other += 1
        except (OSError, http.client.HTTPException):
            # The server ends a connection at its deadline: open another.
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=10)
            reconnects += 1
    elapsed = time.monotonic() - t0
    conn.close()
    print(json.dumps({"mode": "flood", "ok": ok, "other": other,
                      "reconnects": reconnects, "secs": round(elapsed, 3),
                      "per_sec": round(ok / elapsed, 1)}), flush=True)


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            status, body = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read().decode(errors="replace")
    print(json.dumps({"mode": "get", "status": status, "body": body}), flush=True)


def main(argv):
    if len(argv) >= 3 and argv[0] == "endless":
        endless(parse_addr(argv[1]), int(argv[2]))
    elif len(argv) >= 4 and argv[0] == "slow":
        slow(parse_addr(argv[1]), int(argv[2]), float(argv[3]))
    elif len(argv) >= 3 and argv[0] == "flood":
        flood(parse_addr(argv[1]), float(argv[2]))
    elif len(argv) >= 2 and argv[0] == "get":
        get(argv[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
