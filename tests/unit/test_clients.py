"""Who a request's client is (serve_app/http/clients.py): the TCP peer as the
replica can tell it behind uvicorn's X-Forwarded-For rewriting, a configured
trusted proxy, a named token; never an unchecked header (issue 38, item 3)."""

from __future__ import annotations

import pytest

from serve_app.core.errors import ConfigError
from serve_app.http.clients import ClientIdentity, parse_named_tokens


def rewritten(peer: str, headers: dict) -> str:
    """What Serve's proxy (uvicorn, proxy_headers on, forwarded_allow_ips
    127.0.0.1,::1) gives the replica as the ASGI client's host."""
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    seen = {}

    async def app(scope, receive, send):
        seen["client"] = scope["client"]

    scope = {"type": "http", "client": (peer, 5000), "scheme": "http",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    import asyncio
    asyncio.run(ProxyHeadersMiddleware(app, trusted_hosts="127.0.0.1,::1")(scope, None, None))
    return seen["client"][0]


@pytest.mark.parametrize("forged", ["10.9.9.9", "1.2.3.4, 5.6.7.8", "  ", "unknown", "::1, 8.8.8.8"])
def test_a_forwarded_for_header_from_loopback_names_no_new_client(forged):
    ids = ClientIdentity()
    headers = {"x-forwarded-for": forged}
    assert ids.of(rewritten("127.0.0.1", headers), headers) == "addr:127.0.0.1"


def test_a_remote_peer_is_its_address_whatever_it_sends():
    ids = ClientIdentity()
    for headers in ({}, {"x-forwarded-for": "10.9.9.9"}, {"authorization": "Bearer x"}):
        assert ids.of(rewritten("192.168.1.7", headers), headers) == "addr:192.168.1.7"
    # a remote peer naming itself last is taken for loopback: it joins that client, it mints none
    headers = {"x-forwarded-for": "192.168.1.7"}
    assert ids.of(rewritten("192.168.1.7", headers), headers) == "addr:127.0.0.1"
    assert ids.of("127.0.0.2", {}) == "addr:127.0.0.2"


def test_a_bearer_on_a_token_less_or_shared_token_service_is_not_a_client():
    ids = ClientIdentity()
    clients = {ids.of("127.0.0.1", {"authorization": f"Bearer {k}"}) for k in range(100)}
    assert clients == {"addr:127.0.0.1"}


def test_named_tokens_name_their_holders_and_nothing_else_does():
    ids = ClientIdentity(parse_named_tokens("alice:s3cret, bob:hunter2"))
    assert ids.of("127.0.0.1", {"authorization": "Bearer s3cret"}) == "token:alice"
    assert ids.of("10.0.0.1", {"authorization": "Bearer hunter2"}) == "token:bob"
    assert ids.of("10.0.0.1", {"authorization": "Bearer nope"}) == "addr:10.0.0.1"
    assert ids.token_name("Bearer s3cret") == "alice" and ids.token_name("Basic s3cret") is None


def test_a_trusted_proxy_says_who_the_client_is_and_only_it():
    ids = ClientIdentity(trusted_proxies=["127.0.0.1", "10.0.0.0/8"])
    headers = {"x-forwarded-for": "203.0.113.9, 10.1.2.3"}  # the client, then an inner proxy
    assert ids.of(rewritten("127.0.0.1", headers), headers) == "addr:203.0.113.9"
    assert ids.of("10.4.4.4", headers) == "addr:203.0.113.9"
    assert ids.of("198.51.100.1", headers) == "addr:198.51.100.1"  # not a trusted proxy: its own address
    headers = {"x-forwarded-for": "6.6.6.6, 203.0.113.9"}  # a forged first entry: the rightmost untrusted wins
    assert ids.of("10.4.4.4", headers) == "addr:203.0.113.9"


@pytest.mark.parametrize("raw", ["", "alice", "alice:", ":x", "a:1 a:2"])
def test_bad_named_tokens_are_a_config_error(raw):
    with pytest.raises(ConfigError):
        parse_named_tokens(raw)


def test_a_bad_trusted_proxy_is_a_config_error():
    with pytest.raises(ConfigError):
        ClientIdentity(trusted_proxies=["not-an-address"])


def test_the_shared_token_or_a_named_one_authorizes():
    shared = ClientIdentity()
    assert shared.authorized(None, None) and not shared.requires_token(None)
    assert shared.authorized("Bearer tok", b"tok") and not shared.authorized("Bearer x", b"tok")
    named = ClientIdentity(parse_named_tokens("alice:s3cret"))
    assert named.requires_token(None) and not named.authorized(None, None)
    assert named.authorized("Bearer s3cret", None) and named.authorized("Bearer tok", b"tok")
    assert not named.authorized("Bearer nope", b"tok")


def test_ipv6_peers_are_one_client_per_64():
    """Issue 59: a host holds a whole /64; by /128 each of its addresses
    would be a new client with shares of its own (unbounded shares)."""
    ids = ClientIdentity()
    a = ids.of("2001:db8:1:2::1", {})
    b = ids.of("2001:db8:1:2:ffff:eeee:dddd:cccc", {})
    assert a == b == "addr:2001:db8:1:2::/64"
    assert ids.of("2001:db8:1:3::1", {}) == "addr:2001:db8:1:3::/64"  # the next /64: another client
    assert ids.of("::ffff:10.0.0.7", {}) == "addr:10.0.0.7" and ids.of("10.0.0.7", {}) == "addr:10.0.0.7"
