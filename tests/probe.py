#!/usr/bin/env python3
"""Traffic probe for the end-to-end tests, run inside a testbed namespace.

  probe.py udp-send ADDR PORT HEX [HEX...]   send each HEX string as one datagram
  probe.py udp-recv ADDR PORT COUNT SECS     print each received datagram as hex
  probe.py tcp-recv ADDR PORT SECS           accept one connection, print the
                                             SHA-256 and length of what arrived
  probe.py tcp-send ADDR PORT FILE           send FILE over one connection

Only the addresses given are used; the tests pass testbed addresses.
"""
import hashlib
import socket
import sys


def main(argv):
    cmd = argv[1]
    if cmd == "udp-send":
        addr, port = argv[2], int(argv[3])
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for h in argv[4:]:
            s.sendto(bytes.fromhex(h), (addr, port))
    elif cmd == "udp-recv":
        addr, port, count, secs = argv[2], int(argv[3]), int(argv[4]), float(argv[5])
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((addr, port))
        s.settimeout(secs)
        print("ready", flush=True)
        for _ in range(count):
            try:
                data, _ = s.recvfrom(65535)
            except socket.timeout:
                break
            print(data.hex(), flush=True)
    elif cmd == "tcp-recv":
        addr, port, secs = argv[2], int(argv[3]), float(argv[4])
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        s.listen(1)
        s.settimeout(secs)
        print("ready", flush=True)
        c, _ = s.accept()
        c.settimeout(secs)
        h = hashlib.sha256()
        n = 0
        while True:
            b = c.recv(1 << 16)
            if not b:
                break
            h.update(b)
            n += len(b)
        print(h.hexdigest(), n, flush=True)
    elif cmd == "tcp-send":
        addr, port, path = argv[2], int(argv[3]), argv[4]
        s = socket.create_connection((addr, port), timeout=30)
        with open(path, "rb") as f:
            s.sendfile(f)
        s.shutdown(socket.SHUT_WR)
        s.close()
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv)
