"""Raw Ethernet/IPv4/UDP frames for the end-to-end attack scripts
(attack.py, attack_port.py, integrity.py), which import it from their own
directory. Only builds and opens what those scripts send and watch; the
checksums are RFC 768/791's, so a frame built here is one a host would
accept.
"""
import socket
import struct

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
AGG_PORT = 48879
HEADER = struct.Struct(">BBHHHIIHI")  # ver_type flags job rank count seq coll window gen


def checksum(b):
    """The RFC 1071 Internet checksum of B: the ones' complement of its
    ones'-complement sum of big-endian 16-bit words (odd length padded)."""
    if len(b) % 2:
        b += b"\x00"
    s = sum(struct.unpack(">%dH" % (len(b) // 2), b))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return 0xFFFF ^ s


def mac_bytes(text):
    """aa:bb:cc:dd:ee:ff as 6 bytes."""
    return bytes.fromhex(text.replace(":", ""))


def udp_frame(src_mac, src_ip, sport, dst_mac, dst_ip, dport, payload):
    """An Ethernet/IPv4/UDP frame with correct checksums; MACs and IPs as
    bytes (6 and 4)."""
    ulen = 8 + len(payload)
    pseudo = src_ip + dst_ip + struct.pack(">BBH", 0, 17, ulen)
    udp = struct.pack(">HHHH", sport, dport, ulen, 0) + payload
    csum = checksum(pseudo + udp) or 0xFFFF
    udp = udp[:6] + struct.pack(">H", csum) + udp[8:]
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + ulen, 0, 0x4000, 64, 17, 0, src_ip, dst_ip)
    ip = ip[:10] + struct.pack(">H", checksum(ip)) + ip[12:]
    return dst_mac + src_mac + b"\x08\x00" + ip + udp


def sniffer(iface, timeout=0.2):
    """A raw socket on IFACE that sees every frame it sends and receives."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((iface, 0))
    s.settimeout(timeout)
    return s


def sender(iface):
    """A raw socket that sends whole frames out of IFACE."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    return s
