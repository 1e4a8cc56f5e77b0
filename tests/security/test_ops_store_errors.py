"""What store errors show (helper report, operator surfaces): a statement's error names no value
of it, and a Redis URL that does not parse is refused without quoting it.

- SQLAlchemy puts a failed statement's parameters in the error's text unless the engine hides
  them; such errors are logged (``unhandled_error``, ``turn_crashed``) and put on spans, with
  what the statement carried: messages, snapshots, a webhook signing root.
- ``redis://:S3/cr3t@host:6379/0`` (an unencoded ``/`` in the password, common in base64 secrets)
  failed to parse its port, and the start-up error quoted the parser: ``'S3'``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.kit.db import create_engine
from tests.test_startup import _refusal, _settings

SECRET = "whsec-do-not-log-me"


async def test_a_failed_statement_names_none_of_its_values(store: dict[str, str | None]) -> None:
    assert store["database_url"] is not None
    engine = create_engine(store["database_url"])
    try:
        async with engine.connect() as connection:
            with pytest.raises(DBAPIError) as raised:
                # Its primary key is missing: the insert fails, whatever the store.
                await connection.execute(
                    text("INSERT INTO server_secrets (name, value) VALUES (NULL, :value)"),
                    {"value": SECRET.encode()},
                )
    finally:
        await engine.dispose()
    assert SECRET not in str(raised.value)
    assert "hidden" in str(raised.value)  # SQLAlchemy says the values were left out


async def test_a_redis_url_that_does_not_parse_is_refused_without_quoting_it(tmp_path: Path) -> None:
    message = await _refusal(_settings(tmp_path, redis_url="redis://:S3/cr3t@127.0.0.1:6379/0"))
    assert message.startswith("SABRE_REDIS_URL is not a Redis URL"), message
    assert "S3" not in message
    assert "cr3t" not in message
