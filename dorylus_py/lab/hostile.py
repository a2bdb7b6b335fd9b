"""A hostile host: what a machine on the same network without the job's keys can throw at a job.

``python -m dorylus_py.lab.hostile --hosts IP,IP,... [--ports 1-1024,7000-7300,9000] [--idle 1000]``
runs, round after round until SIGTERM:

- a port scan of every host (a TCP connect to each port),
- junk: random bytes into every open port,
- a flood of unfinished multipart frames: a ZeroMQ greeting (NULL mechanism) and READY, then frames
  announcing 64 MB with the MORE flag whose bodies never end, ``--flood-mb`` per round,
- CURVE clients with key pairs of their own (and the servers' public key, which a cluster file
  shows) that queue the first frames of multipart messages,
- ``--idle`` connections spread over the open ports, opened and held without a byte sent.

It prints ``attacking`` once the first round is done, and at the end one JSON line of what it did (ports found open, bytes sent, connections held,
refused). It is for the lab's tests (``tests/lab/test_faults.py``) and for trying a deployment's
defences; aim it only at hosts you run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import sys
import time

import zmq

GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
READY = b"\x04\x1a\x05READY\x0bSocket-Type\x00\x00\x00\x06DEALER"  # a short command frame


def parse_ports(text: str) -> list[int]:
    ports = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        ports += range(int(lo), int(hi or lo) + 1)
    return ports


def scan(hosts: list[str], ports: list[int], timeout_s: float = 0.5) -> list[tuple[str, int]]:
    """The (host, port) pairs that accept a TCP connection."""
    open_ = []
    for host in hosts:
        for port in ports:
            s = socket.socket()
            s.settimeout(timeout_s)
            if s.connect_ex((host, port)) == 0:
                open_.append((host, port))
            s.close()
    return open_


class Attack:
    def __init__(self, hosts: list[str], ports: list[int], idle: int, flood_mb: int, server_key: bytes = b"",
                 stopping=lambda: False):
        self.hosts, self.ports, self.idle_target, self.flood_mb = hosts, ports, idle, flood_mb
        self.server_key = server_key  # the servers' CURVE public key (the cluster file's): ZAP must refuse
        self.stopping = stopping  # checked between connections: a round ends soon after SIGTERM
        self.stats = {"rounds": 0, "open": [], "junk_bytes": 0, "flood_bytes": 0, "refused": 0, "idle_held": 0}
        self.idle: list[tuple[tuple, socket.socket]] = []  # (target, connection)
        self.ctx = zmq.Context()
        self.curve_clients: list[zmq.Socket] = []

    def send(self, target: tuple[str, int], *chunks: bytes) -> int:
        """Connect and send; the bytes the peer took before it hung up."""
        sent = 0
        try:
            with socket.create_connection(target, timeout=2) as s:
                for chunk in chunks:
                    s.sendall(chunk)
                    sent += len(chunk)
        except OSError:
            self.stats["refused"] += 1
        return sent

    def round(self) -> None:
        for sock in self.curve_clients:
            sock.close(0)
        self.curve_clients = []
        found = scan(self.hosts, self.ports)
        self.stats["open"] = sorted(set(map(tuple, self.stats["open"])) | set(found))
        header = b"\x03" + struct.pack(">Q", 64 * 2**20)  # MORE | LONG, 64 MB announced
        per_target = max(2**20, self.flood_mb * 2**20 // max(1, len(found)))
        for target in found:
            if self.stopping():
                return
            self.stats["junk_bytes"] += self.send(target, os.urandom(65536))
            self.stats["flood_bytes"] += self.send(target, GREETING, READY, header,
                                                   *[os.urandom(2**20)] * (per_target // 2**20))
            self.curve_client(target)
        self.hold_idle(found)
        self.stats["rounds"] += 1

    def curve_client(self, target: tuple[str, int]) -> None:
        """A CURVE client with a key pair of its own (and the servers' public key, if given) that queues
        the first frames of a message that never ends; it tries its handshake until the next round."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.curve_serverkey = self.server_key or zmq.curve_keypair()[0]
        sock.connect(f"tcp://{target[0]}:{target[1]}")
        for _ in range(4):
            try:
                sock.send(b"x" * 65536, zmq.NOBLOCK | zmq.SNDMORE)
            except zmq.Again:
                break
        self.curve_clients.append(sock)

    def hold_idle(self, found: list[tuple[str, int]]) -> None:
        """Keep ``--idle`` connections open, an even share on each open port, re-opening those the peers
        closed."""
        alive: dict[tuple, list[socket.socket]] = {}
        for target, s in self.idle:
            try:
                gone = s.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
            except BlockingIOError:
                gone = False
            except OSError:
                gone = True
            (s.close() if gone else alive.setdefault(target, []).append(s))
        share = -(-self.idle_target // max(1, len(found)))
        deadline = time.monotonic() + 10  # a peer accepting slowly holds a round up no longer
        for target in found:
            held = alive.setdefault(target, [])
            while (len(held) < share and sum(map(len, alive.values())) < self.idle_target and not self.stopping()
                   and time.monotonic() < deadline):
                s = socket.socket()
                s.settimeout(2)
                try:
                    s.connect(target)
                except OSError:
                    s.close()
                    self.stats["refused"] += 1
                    break
                s.setblocking(False)  # (a socket with a timeout would wait that long in each check above)
                held.append(s)
        self.idle = [(t, s) for t, held in alive.items() for s in held]
        self.stats["idle_held"] = max(self.stats["idle_held"], len(self.idle))

    def close(self) -> None:
        for _, s in self.idle:
            s.close()
        self.ctx.destroy(0)  # (the CURVE clients with it)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dorylus_py.lab.hostile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", required=True, help="comma-separated addresses to attack")
    ap.add_argument("--ports", default="1-1024,7000-7300,9000", help="ports to scan (ranges and single ports)")
    ap.add_argument("--idle", type=int, default=1000, help="idle connections to hold")
    ap.add_argument("--flood-mb", type=int, default=64, help="bytes of unfinished frames per round")
    ap.add_argument("--curve-server-key", default="", help="the servers' CURVE public key, if known (Z85)")
    ap.add_argument("--pause-s", type=float, default=1.0, help="wait between rounds")
    args = ap.parse_args(argv)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    attack = Attack(args.hosts.split(","), parse_ports(args.ports), args.idle, args.flood_mb,
                    args.curve_server_key.encode(), lambda: bool(stop))
    try:
        while not stop:
            attack.round()
            if attack.stats["rounds"] == 1:
                print("attacking", flush=True)  # a whole round is done: the idle connections are held
            deadline = time.monotonic() + args.pause_s
            while not stop and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        attack.close()
        print(json.dumps(attack.stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
