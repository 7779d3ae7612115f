"""#24 item 4: the network profiles need a token. The GPU profile (also the
Docker image's command and the KubeRay manifest's serveConfigV2) names one in
an environment variable, and its app is not built without it; the CPU
profile on 127.0.0.1 stays anonymous."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from serve_app.app import check_token_present
from serve_app.core.errors import ConfigError
from serve_app.http.headers import check_exposure
from serve_app.core.app_args import AppArgs

REPO = Path(__file__).resolve().parents[2]


def _profile(name: str) -> tuple[dict, AppArgs]:
    cfg = yaml.safe_load((REPO / name).read_text())
    return cfg, AppArgs.model_validate(cfg["applications"][0]["args"])


def test_gpu_profile_refuses_to_build_without_its_token():
    cfg, args = _profile("deployments.gpu.yaml")
    assert cfg["http_options"]["host"] == "0.0.0.0"
    assert args.ingress.allow_anonymous is False
    assert args.ingress.auth_token_env == "OCR_AUTH_TOKEN"
    with pytest.raises(ConfigError, match="OCR_AUTH_TOKEN") as e:
        check_token_present(args.ingress, environ={})
    assert "allow_anonymous" in str(e.value)  # the explicit way out is named
    with pytest.raises(ConfigError, match="OCR_AUTH_TOKEN"):
        check_token_present(args.ingress, environ={"OCR_AUTH_TOKEN": ""})  # empty is no token
    check_token_present(args.ingress, environ={"OCR_AUTH_TOKEN": "s3cret"})
    # And the ingress's own check, beyond loopback, is satisfied by the token only.
    check_exposure("0.0.0.0", has_token=True, allow_anonymous=False)
    with pytest.raises(ConfigError):
        check_exposure("0.0.0.0", has_token=False, allow_anonymous=args.ingress.allow_anonymous)


def test_cpu_profile_on_loopback_stays_anonymous():
    cfg, args = _profile("deployments.yaml")
    assert cfg["http_options"]["host"] == "127.0.0.1"
    assert args.ingress.auth_token_env is None
    check_token_present(args.ingress, environ={})
    check_exposure(cfg["http_options"]["host"], has_token=False, allow_anonymous=args.ingress.allow_anonymous)
