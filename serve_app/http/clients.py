"""Who a request's client is, for its fair shares (admission's ledger and
slots, the job queue, the result store): the TCP peer, or what a configured
trusted proxy says, or a named token; never an unchecked header. No Ray
import: unit-tested on its own.

The peer. Serve's HTTP proxy runs uvicorn with its defaults: proxy_headers
on and forwarded_allow_ips "127.0.0.1,::1" (or $FORWARDED_ALLOW_IPS), so a
request from loopback carrying `X-Forwarded-For` reaches the replica with
its ASGI `client` taken from that header (uvicorn's ProxyHeadersMiddleware,
outside any app middleware), and the real peer is not kept. What the
replica can tell: with no `X-Forwarded-For`, `client` is the peer; with one,
`client` was rewritten exactly when it equals the address uvicorn picks
from the header (the rightmost entry not in its trusted set), and then the
peer was loopback. So such a request is the loopback client, whatever the
header says: a header can name no new client. (A remote peer that sends
its own address as the header's last entry is taken for loopback too: it
joins that one client, it mints none.)

Trusted proxies (ingress.trusted_proxies, off by default): when the peer is
one of them (an address or a network), the client is the rightmost
`X-Forwarded-For` entry that is not a trusted proxy.

An IPv6 address is grouped by its /64 (`addr:2001:db8:1:2::/64`): a host
is commonly given a whole /64, so each /128 would be a new client with
shares of its own.

Tokens: with named tokens (ingress.client_tokens_env: an environment
variable holding `name:token` pairs, separated by commas or whitespace), a
request bearing one is the client `token:NAME`. The single shared token
(ingress.auth_token_env) names no client (every holder has it), and on a
token-less service an `Authorization` header is ignored: the address is the
client."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from typing import Iterable, Mapping, Optional

from serve_app.core.errors import ConfigError

LOOPBACK = "127.0.0.1"
UVICORN_TRUSTED = ("127.0.0.1", "::1")


def parse_named_tokens(raw: str, where: str = "ingress.client_tokens_env") -> dict[str, bytes]:
    """`name:token` pairs (commas or whitespace between) -> {name: token}."""
    out: dict[str, bytes] = {}
    for pair in raw.replace(",", " ").split():
        name, sep, token = pair.partition(":")
        if not sep or not name or not token:
            raise ConfigError(f"{where}: each entry is NAME:TOKEN, got {pair.split(':')[0]!r}...")
        if name in out:
            raise ConfigError(f"{where}: the name {name!r} is given twice")
        out[name] = token.encode()
    if not out:
        raise ConfigError(f"{where}: no NAME:TOKEN entries")
    return out


def _networks(entries: Iterable[str]) -> list:
    nets = []
    for e in entries:
        try:
            nets.append(ipaddress.ip_network(e.strip(), strict=False))
        except ValueError:
            raise ConfigError(f"ingress.trusted_proxies: {e!r} is not an address or a network "
                              f"(e.g. 10.0.0.5 or 10.0.0.0/8)") from None
    return nets


def _in(host: str, nets: list) -> bool:
    try:
        addr = ipaddress.ip_address(host.strip().strip("[]"))
    except ValueError:
        return False
    return any(addr in n for n in nets)


def _forwarded_hosts(headers: Mapping[str, str]) -> list[str]:
    raw = ", ".join(v for k, v in _items(headers) if k.lower() == "x-forwarded-for")
    return [h.strip() for h in raw.split(",") if h.strip()]


def _items(headers):
    getlist = getattr(headers, "items", None)
    return getlist() if getlist is not None else headers


def _host_only(entry: str) -> str:
    """An X-Forwarded-For entry's host (uvicorn's parse: [v6]:port, v4:port)."""
    if entry.startswith("["):
        return entry[1:].split("]", 1)[0]
    if entry.count(":") == 1:
        return entry.split(":", 1)[0]
    return entry


class ClientIdentity:
    """`of(asgi_client_host, headers)` -> "addr:HOST" or "token:NAME"."""

    def __init__(self, named_tokens: Optional[dict[str, bytes]] = None, trusted_proxies: Iterable[str] = ()):
        self.named_tokens = named_tokens or {}
        self._by_digest = {hashlib.sha256(t).digest(): name for name, t in self.named_tokens.items()}
        self.trusted = _networks(trusted_proxies)
        uv = os.environ.get("FORWARDED_ALLOW_IPS")
        self.uvicorn_trusted = [h.strip() for h in uv.split(",")] if uv else list(UVICORN_TRUSTED)

    @classmethod
    def from_args(cls, args) -> "ClientIdentity":
        """From IngressArgs (client_tokens_env, trusted_proxies)."""
        tokens = None
        env = getattr(args, "client_tokens_env", None)
        if env:
            raw = os.environ.get(env, "")
            if not raw:
                raise ConfigError(f"ingress.client_tokens_env names {env!r}, but that environment variable is "
                                  f"empty or unset in the ingress replica (set it to NAME:TOKEN pairs, or remove "
                                  f"client_tokens_env)")
            tokens = parse_named_tokens(raw)
        return cls(tokens, getattr(args, "trusted_proxies", ()) or ())

    def token_name(self, authorization: Optional[str]) -> Optional[str]:
        """The name of the named token this `Authorization` bears, else None:
        one lookup by the token's sha256 (the time it takes says nothing of
        the token), then a constant-time compare, whatever the number of
        tokens (each request asks this twice: it compared every token)."""
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not self.named_tokens:
            return None
        given_b = given.strip().encode()
        name = self._by_digest.get(hashlib.sha256(given_b).digest())
        if name is None or not hmac.compare_digest(given_b, self.named_tokens[name]):
            return None
        return name

    def requires_token(self, shared: Optional[bytes]) -> bool:
        """The service requires a token: the shared one (`shared`), or named ones."""
        return shared is not None or bool(self.named_tokens)

    def authorized(self, authorization: Optional[str], shared: Optional[bytes]) -> bool:
        """No token required, or `authorization` bears the shared token or a named one."""
        if not self.requires_token(shared):
            return True
        scheme, _, given = (authorization or "").partition(" ")
        if shared is not None and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), shared):
            return True
        return self.token_name(authorization) is not None

    def peer(self, client_host: Optional[str], headers: Mapping[str, str]) -> Optional[str]:
        """The TCP peer's address, as far as the replica can tell (see the module's doc)."""
        if client_host is None:
            return None
        forwarded = _forwarded_hosts(headers)
        if forwarded and client_host == self._uvicorn_pick(forwarded):
            return LOOPBACK  # uvicorn rewrote `client` from the header: the peer was loopback
        return client_host

    def _uvicorn_pick(self, forwarded: list[str]) -> str:
        """The address uvicorn's ProxyHeadersMiddleware takes from X-Forwarded-For."""
        hosts = [_host_only(h) for h in forwarded]
        if "*" in self.uvicorn_trusted:
            return hosts[0]
        for h in reversed(hosts):
            if h not in self.uvicorn_trusted:
                return h
        return hosts[0]

    def of(self, client_host: Optional[str], headers: Mapping[str, str]) -> Optional[str]:
        name = self.token_name(headers.get("authorization"))
        if name is not None:
            return f"token:{name}"
        peer = self.peer(client_host, headers)
        if peer is None:
            return None
        if self.trusted and _in(peer, self.trusted):
            for entry in reversed(_forwarded_hosts(headers)):
                host = _host_only(entry)
                if not _in(host, self.trusted):
                    return f"addr:{address_group(host)}"
        return f"addr:{address_group(peer)}"


def address_group(host: str) -> str:
    """The client an address is: itself for IPv4, its /64 for IPv6 (one
    host is given a whole /64: by /128 it could be any number of clients),
    an IPv4-mapped one as its IPv4 address."""
    try:
        ip = ipaddress.ip_address(host.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return host
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)
