"""Links as data, and the ``tc`` commands that make them on each host's one interface.

A :class:`Link` between hosts ``a`` and ``b`` shapes both directions: on ``a``'s interface the packets
to ``b``, on ``b``'s the packets to ``a`` (egress, where a qdisc can hold packets back). The rate is an
HTB class per peer (unshaped traffic goes to a default class at 100 Gbit/s); loss is a classic-BPF
filter in direct-action mode that drops a packet to that peer with the link's probability (``ld
rand``, Linux's random ancillary load); the delay is a ``netem`` qdisc under the peer's class, on
kernels that have one. Not netem for everything because kernels are built without it: this project's
CI machines lack ``sch_netem`` (and ``prio``, ``fq``, ``etf``: nothing else can hold a packet for a
while), but have HTB and ``cls_bpf``, so rate and loss work everywhere and delay where it can.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from dataclasses import dataclass

from dorylus_py.errors import ConfigError

UNSHAPED = "100gbit"  # the default class: as fast as a veth goes
QUANTUM = "200000"  # bytes an HTB class sends per round (above the 64 KB of a GSO packet; quiets tc's warning)
_HOST = re.compile(r"^[a-z][a-z0-9]{0,7}$")


@dataclass(frozen=True)
class Link:
    """What the network between two hosts does to their packets, each way."""

    a: str
    b: str
    rate_mbit: float = 0.0  # 0: unshaped
    delay_ms: float = 0.0  # one way (the round trip is twice this)
    loss_pct: float = 0.0  # chance that a packet is dropped, each way

    @classmethod
    def parse(cls, text: str) -> "Link":
        """``A:B[:RATE_MBIT[:DELAY_MS[:LOSS_PCT]]]``, e.g. ``a:d:200:1`` (the CLI's ``--link``)."""
        parts = text.split(":")
        if not 2 <= len(parts) <= 5:
            raise ConfigError(f"--link {text!r}: expected A:B[:RATE_MBIT[:DELAY_MS[:LOSS_PCT]]]")
        try:
            numbers = [float(p) for p in parts[2:]]
        except ValueError:
            raise ConfigError(f"--link {text!r}: rate, delay and loss must be numbers") from None
        return cls(parts[0], parts[1], *numbers)

    def check(self, hosts) -> None:
        for h in (self.a, self.b):
            if h not in hosts:
                raise ConfigError(f"link {self.a}-{self.b}: no host {h!r} (hosts: {', '.join(hosts)})")
        if self.a == self.b:
            raise ConfigError(f"link {self.a}-{self.b}: a link joins two different hosts")
        if self.rate_mbit < 0 or self.delay_ms < 0 or not 0 <= self.loss_pct <= 100:
            raise ConfigError(f"link {self.a}-{self.b}: rate and delay must be >= 0 and loss within 0-100 %")

    def dilated(self, d: float) -> "Link":
        """This link in a scale model of dilation ``d`` (``timescale.py``): rate / D, delay x D."""
        return Link(self.a, self.b, self.rate_mbit / d, self.delay_ms * d, self.loss_pct)

    def peer(self, host: str) -> str | None:
        return self.b if host == self.a else self.a if host == self.b else None


def check_host_name(name: str) -> None:
    if not _HOST.match(name):
        raise ConfigError(f"host name {name!r}: 1 to 8 lower-case letters and digits, starting with a letter")


def _rate(mbit: float) -> str:
    return f"{int(mbit * 1000)}kbit" if mbit else UNSHAPED


def loss_filter(dst_ip: str, loss_pct: float) -> str:
    """Classic BPF (tc's ``bytecode`` form) that drops an IPv4 packet to ``dst_ip`` with probability
    ``loss_pct`` % and lets every other packet through (``TC_ACT_UNSPEC``: on to the next filter)."""
    dst = struct.unpack(">I", socket.inet_aton(dst_ip))[0]
    threshold = min(2**32 - 1, int(loss_pct / 100 * 2**32))
    prog = [
        (0x28, 0, 0, 12),  # ldh [12]: the ethertype (tc hands cls_bpf the frame from its MAC header)
        (0x15, 0, 5, 0x0800),  # not IPv4: pass
        (0x20, 0, 0, 30),  # ld [30]: the destination address
        (0x15, 0, 3, dst),  # not to this peer: pass
        (0x20, 0, 0, 0xFFFFF038),  # ld rand (SKF_AD_OFF + SKF_AD_RANDOM)
        (0x35, 1, 0, threshold),  # rand >= threshold: pass
        (0x06, 0, 0, 2),  # ret TC_ACT_SHOT: dropped
        (0x06, 0, 0, 0xFFFFFFFF),  # ret TC_ACT_UNSPEC
    ]
    return f"{len(prog)}," + ",".join(f"{op} {jt} {jf} {k}" for op, jt, jf, k in prog)


def tc_commands(host: str, dev: str, ips: dict[str, str], links, netem: bool) -> list[list[str]]:
    """The ``tc`` argument lists that shape ``host``'s ``dev`` for ``links`` (after any old root qdisc
    is deleted). ``netem``: the kernel has it, so delays are applied; else a delay is left out."""
    mine = [(link, link.peer(host)) for link in links if link.peer(host) is not None]
    if not mine:
        return []
    cmds = [["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"],
            ["class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", UNSHAPED, "quantum", QUANTUM]]
    for i, (link, peer) in enumerate(mine):
        ip = str(ipaddress.IPv4Address(ips[peer]))
        minor = f"{10 + i:x}"  # class ids are hexadecimal
        cmds.append(["class", "add", "dev", dev, "parent", "1:", "classid", f"1:{minor}", "htb", "rate",
                     _rate(link.rate_mbit), "quantum", QUANTUM])
        if link.delay_ms and netem:
            cmds.append(["qdisc", "add", "dev", dev, "parent", f"1:{minor}", "handle", f"{10 + i:x}:", "netem",
                         "delay", f"{link.delay_ms}ms", "limit", "100000"])
        cmds.append(["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "2", "u32", "match",
                     "ip", "dst", f"{ip}/32", "flowid", f"1:{minor}"])
        if link.loss_pct:
            cmds.append(["filter", "add", "dev", dev, "parent", "1:", "protocol", "all", "prio", "1", "bpf", "da",
                         "bytecode", loss_filter(ip, link.loss_pct)])
    return cmds
