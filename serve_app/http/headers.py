"""The request headers the ingress reads: deadline, idempotency key, priority
lane, bearer token. No Ray import: unit-tested on their own."""

from __future__ import annotations

import hmac
from typing import Mapping, Optional

from serve_app.core.errors import BadRequest, ConfigError
from serve_app.core.app_args import IngressArgs

MAX_IDEMPOTENCY_KEY = 200


def deadline_s(headers: Mapping[str, str], args: IngressArgs) -> float:
    """The request's deadline: X-Request-Timeout (seconds), else the default."""
    raw = headers.get("x-request-timeout")
    if raw is None:
        return args.default_timeout_s
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"X-Request-Timeout must be a number of seconds, got {raw!r}") from None
    if not 0 < value <= args.max_timeout_s:  # also refuses nan
        raise BadRequest(f"X-Request-Timeout must be in (0, {args.max_timeout_s}] seconds, got {value}")
    return value


def idempotency_key(headers: Mapping[str, str]) -> Optional[str]:
    key = headers.get("idempotency-key")
    if key is not None and not (0 < len(key) <= MAX_IDEMPOTENCY_KEY):
        raise BadRequest(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters")
    return key


def priority(headers: Mapping[str, str]) -> Optional[str]:
    """X-Priority: interactive|bulk (the request's lane, serve_app.core.lanes;
    it wins over the options' `priority`); None when absent."""
    raw = headers.get("x-priority")
    if raw is None:
        return None
    value = raw.strip().lower()
    if value not in ("interactive", "bulk"):
        raise BadRequest(f"X-Priority must be interactive or bulk, got {raw!r}")
    return value


def bearer_matches(authorization: Optional[str], token: bytes) -> bool:
    """Whether `Authorization: Bearer TOKEN` names `token` (constant-time compare)."""
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_exposure(host: Optional[str], has_token: bool, allow_anonymous: bool) -> None:
    """A service listening beyond loopback without a token starts only when
    its config says so (ingress.allow_anonymous: true); else a ConfigError
    saying how to fix it. host None (it could not be read) fails closed: it
    may be any address, so it needs a token or allow_anonymous too."""
    if has_token or allow_anonymous or (host is not None and host.strip("[]") in LOOPBACK_HOSTS):
        return
    where = (f"Serve listens on {host!r} (http_options.host), beyond this machine" if host is not None else
             "the host Serve listens on (http_options.host) could not be read, so it may be beyond this machine")
    raise ConfigError(f"{where}, and the ingress has no token: set ingress.auth_token_env to an environment "
                      f"variable holding one, or set ingress.allow_anonymous: true to serve without "
                      f"authentication on purpose")
