#!/usr/bin/env python3
"""A UDP endpoint in a worker's namespace, driven line by line from stdin by
tests/tests/kinds.rs (which builds and checks every message with proto):

    send HEX        send the datagram to the switch
    recv MS         print "got HEX" for each datagram that arrives until MS
                    milliseconds pass without one, then "end"
    quit

Usage: kinds_agent.py BIND_IP BIND_PORT SWITCH_IP SWITCH_PORT
"""

import select
import socket
import sys


def main() -> int:
    ip, port, dst, dport = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, port))
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "send":
            s.sendto(bytes.fromhex(arg), (dst, dport))
        elif cmd == "recv":
            quiet = int(arg) / 1000.0
            while select.select([s], [], [], quiet)[0]:
                print("got", s.recv(65535).hex())
            print("end", flush=True)
        elif cmd == "quit":
            break
        else:
            print(f"kinds_agent.py: unknown command {cmd!r}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
