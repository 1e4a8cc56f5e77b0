"""The ``tracing_started`` log line names where spans go, but not the credentials an endpoint URL
may carry (``https://user:token@collector/v1/traces``, a collector behind basic auth): the log is
read by more people than the configuration."""

from __future__ import annotations

from structlog.testing import capture_logs

from app.config import Settings
from app.kit import tracing


def test_the_tracing_log_line_hides_the_endpoints_credentials() -> None:
    """Read from structlog's own capture: where a process's log stream goes depends on which test
    configured logging first (a capture of stderr saw nothing under xdist)."""
    endpoint = "http://sabre:tok3n-s3cret@127.0.0.1:9/v1/traces?api_key=qu3ry-s3cret"
    with capture_logs() as logs:
        try:
            assert tracing.start_tracing(Settings(tracing_endpoint=endpoint))
        finally:
            tracing.stop_tracing()
    started = [entry for entry in logs if entry["event"] == "tracing_started"]
    assert started, logs
    assert "tok3n-s3cret" not in repr(logs)
    assert "qu3ry-s3cret" not in repr(logs)
    assert started[0]["endpoint"].startswith("http://127.0.0.1:9/v1/traces")
