"""Which callback targets a job may name (issue 48, item 3): an http(s) URL
with a host, no credentials, whose every address is global (ipaddress's
is_global, site-local refused too), unless the operator allows it
(jobs.callbacks.allow: addresses or networks, each with a port or every
port, or host names, resolved when the store starts).

The check runs twice: at submit (a refused target is a 400 before the job
is accepted) and at each connection, in the resolver the delivery's HTTP
client connects through (serve_app.jobs.callbacks), so that the address
connected to is the address checked: a name that resolved to a public
address at submit and to 127.0.0.1 later (DNS rebinding) is refused then.
An address embedded in IPv6 (IPv4-mapped, 6to4, NAT64) is judged as the
IPv4 address it reaches. No Ray import."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union
from urllib.parse import urlsplit

from serve_app.core.errors import BadRequest, ConfigError, Overloaded

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
    key: str = ""  # check_target's: the per-target bound's key (target_key of its first address)


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
    """Why an address is not a global one (None: it is). The gate is
    ipaddress's is_global; the kinds only name the reason. Site-local
    (fec0::/10, deprecated but still routed inside some networks) is
    refused too: Python counts it global."""
    a = reached(ip)  # (an IPv6 form that carries an IPv4 address is judged by that one alone)
    for kind, test in (("loopback", a.is_loopback), ("unspecified", a.is_unspecified),
                       ("link-local", a.is_link_local), ("multicast", a.is_multicast),
                       ("site-local", getattr(a, "is_site_local", False)), ("reserved", a.is_reserved),
                       ("private", a.is_private)):
        if test:
            return kind
    return None if a.is_global else "non-global"


def target_key(address: str) -> str:
    """What one target is for the per-target bound: its address as
    resolved (wildcard DNS names all count as one), an IPv6 one by its /64
    (one host holds a whole /64)."""
    ip = reached(ipaddress.ip_address(address.split("%", 1)[0]))
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass(frozen=True)
class Allowed:
    """One jobs.callbacks.allow entry: a network (an address is a /32 or
    /128), and the port it allows (None: every port)."""

    network: Any
    port: Optional[int]
    entry: str

    def admits(self, ip: IP, port: int) -> bool:
        return (self.port is None or self.port == port) and any(
            a in self.network for a in {ip, reached(ip)} if a.version == self.network.version)


def _split_port(entry: str) -> tuple[str, Optional[int]]:
    """`10.0.0.5:8443`, `[fd00::5]:8443`, `name:8443` -> (host or network, port); no port: None."""
    def port_of(text: str) -> int:
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise ConfigError(f"jobs.callbacks.allow has {entry!r}: its port {text!r} is not 1-65535")
        return int(text)

    if entry.startswith("["):
        host, sep, rest = entry[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ConfigError(f"jobs.callbacks.allow has {entry!r}: write an IPv6 address with a port as "
                              f"[fd00::5]:8443")
        return host, port_of(rest[1:]) if rest else None
    if entry.count(":") == 1:  # (an IPv6 address without brackets has several)
        host, _, port = entry.partition(":")
        return host, port_of(port)
    return entry, None


def _network(host: str, entry: str) -> Any:
    """`host` as a network (an address: /32 or /128), None when it is a name;
    a network with host bits set (10.1.2.3/8) is an error, never widened."""
    try:
        return ipaddress.ip_network(host, strict=True)
    except ValueError as e:
        if "/" not in host:
            return None
        try:
            wide = ipaddress.ip_network(host, strict=False)
        except ValueError:
            raise ConfigError(f"jobs.callbacks.allow has {entry!r}: not a network ({e})") from None
        raise ConfigError(f"jobs.callbacks.allow has {entry!r}: it has host bits set; write the network "
                          f"({wide}) or the one address ({host.split('/')[0]})") from None


class TargetPolicy:
    """jobs.callbacks.allow, parsed: networks and addresses (each with its
    port, or every port), and host names, resolved when the store starts
    (`resolve_names`) into the addresses they allow. A name's own addresses
    are checked like any other at every attempt: a name allowed does not
    allow what it resolves to later. Lookups run on a pool of their own
    (LOOKUP_THREADS, at most LOOKUPS_WAITING waiting: then 503), never the
    loop's default executor."""

    LOOKUP_THREADS = 4
    LOOKUPS_WAITING = 64

    def __init__(self, allow: Iterable[str] = ()):
        self.allowed: list[Allowed] = []
        self.names: list[tuple[str, Optional[int], str]] = []  # (name, port, entry) to resolve at start
        for raw in allow:
            entry = raw.strip()
            host, port = _split_port(entry)
            net = _network(host, entry)
            if net is not None:
                self.allowed.append(Allowed(net, port, entry))
                continue
            name = host.rstrip(".").lower()
            if not name or any(not (c.isalnum() or c in "-.") for c in name):
                raise ConfigError(f"jobs.callbacks.allow has {entry!r}: neither an address or network (10.0.0.5, "
                                  f"10.0.0.0/8, ::1/128), with an optional port (10.0.0.5:8443, [fd00::5]:8443), "
                                  f"nor a host name (localhost, localhost:8443)")
            self.names.append((name, port, entry))
        self._pool: Optional[ThreadPoolExecutor] = None
        self._lookups = 0

    def every_port(self) -> list[str]:
        """The entries that open every port of what they name (logged at start)."""
        return [a.entry for a in self.allowed if a.port is None] + [e for _, p, e in self.names if p is None]

    async def resolve_names(self, timeout_s: float = 5.0) -> None:
        """The allowed host names' addresses, once, when the store starts
        (ConfigError naming the entry if one does not resolve)."""
        for name, port, entry in self.names:
            try:
                infos = await self._lookup(name, port or 80, timeout_s)
            except TargetRefused:
                raise ConfigError(f"jobs.callbacks.allow has {entry!r}, which does not resolve where the JobStore "
                                  f"runs; fix the name or allow its address") from None
            for _, address in infos:
                ip = ipaddress.ip_address(address.split("%", 1)[0])
                self.allowed.append(Allowed(ipaddress.ip_network(ip), port, entry))
        self.names = []

    def refusal(self, address: str, port: int) -> Optional[str]:
        """Why a connection to `address`:`port` is refused (None: it may be made)."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0) is no part of it
        kind = address_kind(ip)
        if kind is None or any(a.admits(ip, port) for a in self.allowed):
            return None
        return kind

    async def _lookup(self, host: str, port: int, timeout_s: float) -> list[tuple[int, str]]:
        if self._lookups >= self.LOOKUPS_WAITING:
            raise Overloaded(f"{self._lookups} callback host name lookups are in progress here; retry shortly",
                             retry_after_s=2)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.LOOKUP_THREADS, thread_name_prefix="callback-dns")
        self._lookups += 1
        try:
            found = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(
                self._pool, functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM,
                                              proto=socket.IPPROTO_TCP)), timeout_s)
        except (OSError, asyncio.TimeoutError, UnicodeError):
            raise TargetRefused(f"callback_url's host {host!r} does not resolve; {FIX}") from None
        finally:
            self._lookups -= 1
        infos = list(dict.fromkeys((fam, sockaddr[0]) for fam, _, _, _, sockaddr in found))
        if not infos:
            raise TargetRefused(f"callback_url's host {host!r} has no address")
        return infos

    async def addresses(self, host: str, port: int, timeout_s: float = 5.0) -> list[tuple[int, str]]:
        """(family, address) of every address `host` resolves to, each one
        allowed (else TargetRefused). A literal address is named in the
        refusal with its kind (the client wrote it); a name's resolved
        addresses are not: the answer tells a prober nothing of what is
        inside."""
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            infos = [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
        else:
            infos = await self._lookup(host, port, timeout_s)
        for _, address in infos:
            why = self.refusal(address, port)
            if why is not None:
                if literal is not None:
                    raise TargetRefused(f"callback_url is refused: {address} is a {why} address (port {port}); {FIX}")
                raise TargetRefused(f"callback_url is refused: its host {host!r} resolves to an address that is "
                                    f"not public; {FIX}")
        return infos

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


async def check_target(url: str, policy: TargetPolicy, timeout_s: float = 5.0) -> Target:
    """At submit: the URL parsed and its host resolved and checked
    (TargetRefused: 400); `key`: the first address's target_key."""
    target = parse_target(url)
    infos = await policy.addresses(target.host, target.port, timeout_s)
    return Target(target.url, target.host, target.port, min(target_key(a) for _, a in infos))
