"""Which callback targets a job may name (issue 48, item 3): an http(s) URL
with a host, no credentials, whose every address is public, unless the
operator allows it (jobs.callbacks.allow: CIDRs, or host names as written
in the URL).

The check runs twice: at submit (a refused target is a 400 before the job
is accepted) and at each connection, in the resolver the delivery's HTTP
client connects through (serve_app.jobs.callbacks), so that the address
connected to is the address checked: a name that resolved to a public
address at submit and to 127.0.0.1 later (DNS rebinding) is refused then.
An address embedded in IPv6 (IPv4-mapped, 6to4, NAT64) is judged as the
IPv4 address it reaches. No Ray import."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import Iterable, Optional, Union
from urllib.parse import urlsplit

from serve_app.core.errors import BadRequest, ConfigError

IP = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
MAX_URL_CHARS = 2048
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
FIX = "name a public http(s) address, or allow the target in jobs.callbacks.allow"


class TargetRefused(BadRequest):
    """A callback target this service does not call (400 at submit; an attempt's error later)."""


@dataclass(frozen=True)
class Target:
    url: str
    host: str  # lower case, IPv6 without brackets
    port: int


def parse_target(url: str) -> Target:
    """The URL's host and port, or TargetRefused naming what is wrong."""
    if not isinstance(url, str) or not url:
        raise TargetRefused("callback_url is empty; " + FIX)
    if len(url) > MAX_URL_CHARS:
        raise TargetRefused(f"callback_url is {len(url)} characters, over {MAX_URL_CHARS}")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise TargetRefused("callback_url holds white space or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise TargetRefused(f"callback_url is not a valid URL ({e})") from None
    if parts.scheme not in ("http", "https"):
        raise TargetRefused(f"callback_url's scheme is {parts.scheme or 'missing'!r}; it must be http or https")
    if not parts.hostname:
        raise TargetRefused("callback_url has no host; " + FIX)
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("callback_url holds credentials (user:password@); the event is signed instead: verify "
                            "its webhook-signature")
    return Target(url, parts.hostname.rstrip(".").lower(), port or (443 if parts.scheme == "https" else 80))


def reached(ip: IP) -> IP:
    """The address a packet to `ip` ends up at, for the IPv6 forms that carry an IPv4 address."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if any(ip in net for net in _NAT64):
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def address_kind(ip: IP) -> Optional[str]:
    """Why an address is not a public one (None: it is)."""
    ip = reached(ip)
    for kind, test in (("loopback", ip.is_loopback), ("unspecified", ip.is_unspecified),
                       ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                       ("reserved", ip.is_reserved), ("private", ip.is_private)):
        if test:
            return kind
    return None if ip.is_global else "non-public"


class TargetPolicy:
    """jobs.callbacks.allow, parsed: networks and host names."""

    def __init__(self, allow: Iterable[str] = ()):
        self.networks: list = []
        self.hosts: set[str] = set()
        for entry in allow:
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            name = entry.strip().rstrip(".").lower()
            if not name or any(not (c.isalnum() or c in "-.") for c in name):
                raise ConfigError(f"jobs.callbacks.allow has {entry!r}: neither a CIDR (10.0.0.0/8, ::1/128) nor a "
                                  f"host name")
            self.hosts.add(name)

    def host_allowed(self, host: str) -> bool:
        return host.rstrip(".").lower() in self.hosts

    def refusal(self, address: str) -> Optional[str]:
        """Why a connection to `address` is refused (None: it may be made)."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0) is no part of it
        kind = address_kind(ip)
        if kind is None or any(a in net for net in self.networks for a in {ip, reached(ip)} if a.version == net.version):
            return None
        return f"{address} is a {kind} address"

    async def addresses(self, host: str, port: int, timeout_s: float = 5.0) -> list[tuple[int, str]]:
        """(family, address) of every address `host` resolves to, each one
        allowed (else TargetRefused, naming it). A literal address is
        checked as it is; an allowed host name's addresses are not checked."""
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            infos = [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
        else:
            loop = asyncio.get_running_loop()
            try:
                found = await asyncio.wait_for(
                    loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP), timeout_s)
            except (OSError, asyncio.TimeoutError, UnicodeError) as e:
                raise TargetRefused(f"callback_url's host {host!r} does not resolve ({e or 'timed out'})") from None
            infos = list(dict.fromkeys((fam, sockaddr[0]) for fam, _, _, _, sockaddr in found))
            if not infos:
                raise TargetRefused(f"callback_url's host {host!r} has no address")
            if self.host_allowed(host):
                return infos
        for _, address in infos:
            why = self.refusal(address)
            if why is not None:
                via = "" if literal is not None else f" (resolved from {host!r})"
                raise TargetRefused(f"callback_url is refused: {why}{via}; {FIX}")
        return infos


async def check_target(url: str, policy: TargetPolicy, timeout_s: float = 5.0) -> Target:
    """At submit: the URL parsed and its host resolved and checked (TargetRefused: 400)."""
    target = parse_target(url)
    await policy.addresses(target.host, target.port, timeout_s)
    return target
