"""What crosses the lab's bridge: a packet capture, and the TCP byte streams inside it.

``python -m dorylus_py.lab.capture --iface br0 --out FILE.pcap``, run in the bridge's namespace
(:func:`capture_on`), records every frame the bridge forwards (a raw ``AF_PACKET`` socket with the
port in promiscuous mode: nothing to install, and the file opens in Wireshark) until SIGTERM, then
prints how many frames it kept and how many the kernel dropped. :func:`tcp_streams` puts each TCP
connection's payload back in sequence order, so a search for a string finds it even when TCP cut it
across segments; :func:`found` says which of some byte strings occur in any stream.
"""

from __future__ import annotations

import argparse
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from dorylus_py import children

ETH_P_ALL = 0x0003
SOL_PACKET, PACKET_ADD_MEMBERSHIP, PACKET_STATISTICS, PACKET_MR_PROMISC = 263, 1, 6, 1
SNAPLEN = 262_144  # a GSO frame on a veth bridge is up to 64 KB; more than enough
_PCAP_HEADER = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, SNAPLEN, 1)  # LINKTYPE_ETHERNET


def record(iface: str, out: Path, stop, ready=lambda: None) -> tuple[int, int]:
    """Write every frame seen on ``iface`` to ``out`` (pcap) until ``stop()``; return (kept, dropped).
    ``ready()`` is called once the socket sees every frame."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, 33, 64 * 2**20)  # SO_RCVBUFFORCE (root): room for bursts
    sock.bind((iface, 0))
    mreq = struct.pack("iHH8s", socket.if_nametoindex(iface), PACKET_MR_PROMISC, 0, b"")
    sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)  # frames between two ports, not only to the bridge
    sock.settimeout(0.2)
    ready()
    buf, kept = bytearray(SNAPLEN), 0
    with open(out, "wb") as f:
        f.write(_PCAP_HEADER)
        while not stop():
            try:
                n = sock.recv_into(buf)
            except socket.timeout:
                continue
            now = time.time()
            f.write(struct.pack("<IIII", int(now), int(now % 1 * 1e6), n, n))
            f.write(buf[:n])
            kept += 1
    _, dropped = struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    sock.close()
    return kept, dropped


def frames(path: Path):
    """The frames of a pcap file written by :func:`record`."""
    data = Path(path).read_bytes()
    at = len(_PCAP_HEADER)
    while at + 16 <= len(data):
        _, _, n, _ = struct.unpack_from("<IIII", data, at)
        yield data[at + 16: at + 16 + n]
        at += 16 + n


def tcp_streams(path: Path) -> dict[tuple, bytes]:
    """Each TCP connection direction ``(src, sport, dst, dport)``'s payload, in sequence order (a
    retransmitted segment counted once; a gap, where the capture missed one, closed up)."""
    segments: dict[tuple, dict[int, bytes]] = {}
    for frame in frames(path):
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:  # IPv4, TCP
            continue
        ihl = (frame[14] & 0x0F) * 4
        total = struct.unpack_from(">H", frame, 16)[0]
        tcp = 14 + ihl
        sport, dport, seq = struct.unpack_from(">HHI", frame, tcp)
        payload = frame[tcp + (frame[tcp + 12] >> 4) * 4: 14 + total]
        if payload:
            flow = (socket.inet_ntoa(frame[26:30]), sport, socket.inet_ntoa(frame[30:34]), dport)
            seen = segments.setdefault(flow, {})
            if len(payload) > len(seen.get(seq, b"")):
                seen[seq] = payload
    streams = {}
    for flow, seen in segments.items():
        base = min(seen, key=lambda s: (s - next(iter(seen))) % 2**32)  # the first, across a wrap of 2**32
        out, end = bytearray(), 0
        for rel, payload in sorted(((s - base) % 2**32, p) for s, p in seen.items()):
            if rel + len(payload) > end:
                out += payload[max(0, end - rel):]
                end = rel + len(payload)
        streams[flow] = bytes(out)
    return streams


def found(streams: dict[tuple, bytes], needles: dict[str, bytes]) -> set[str]:
    """The names of the ``needles`` that occur in any stream."""
    return {name for name, needle in needles.items() if any(needle in s for s in streams.values())}


@contextmanager
def capture_on(argv_in_namespace, iface: str, out: Path, log: Path):
    """Record on ``iface`` while the block runs. ``argv_in_namespace(argv)``: how to run a command in
    the namespace that has ``iface`` (``Network.argv``). The recorder has begun when the block starts."""
    cmd = argv_in_namespace(children.module("dorylus_py.lab.capture", "--iface", iface, "--out", out))
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=children.env())
    try:
        started = select.select([proc.stdout], [], [], 60)[0]
        if not started or proc.stdout.readline().strip() != b"recording":
            raise RuntimeError(f"the capture did not start (see {log})")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dorylus_py.lab.capture", description=__doc__.split("\n\n")[0])
    ap.add_argument("--iface", required=True, help="the interface to record (the lab's bridge: br0)")
    ap.add_argument("--out", required=True, help="the pcap file to write")
    args = ap.parse_args(argv)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    try:
        kept, dropped = record(args.iface, Path(args.out), lambda: bool(stopping), lambda: print("recording", flush=True))
    except OSError as e:
        print(f"error: cannot record on {args.iface!r} ({e.strerror})", file=sys.stderr)
        return 2
    print(f"{kept} frames kept, {dropped} dropped by the kernel", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
