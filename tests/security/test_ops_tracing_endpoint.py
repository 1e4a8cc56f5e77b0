"""The ``tracing_started`` log line names where spans go, but not the credentials an endpoint URL
may carry (``https://user:token@collector/v1/traces``, a collector behind basic auth): the log is
read by more people than the configuration."""

from __future__ import annotations

import json

import pytest

from app.config import Settings
from app.kit import tracing
from app.kit.logging import ensure_logging


def test_the_tracing_log_line_hides_the_endpoints_credentials(capfd: pytest.CaptureFixture[str]) -> None:
    ensure_logging(fmt="json")
    endpoint = "http://sabre:tok3n-s3cret@127.0.0.1:9/v1/traces?api_key=qu3ry-s3cret"
    try:
        assert tracing.start_tracing(Settings(tracing_endpoint=endpoint))
    finally:
        tracing.stop_tracing()
    err = capfd.readouterr().err
    started = [json.loads(line) for line in err.splitlines() if "tracing_started" in line]
    assert started, err
    assert "tok3n-s3cret" not in err
    assert "qu3ry-s3cret" not in err
    assert started[0]["endpoint"].startswith("http://127.0.0.1:9/v1/traces")
