"""Fixtures of the runtime tests: one real pool of sandbox workers for the whole package."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.runtime import RuntimePool

# Set in the server's environment while the pool runs: the sandbox must never see them.
SECRETS = {"OPENAI_API_KEY": "sk-test-secret", "SABRE_DATABASE_URL": "postgresql://secret"}


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def pool() -> AsyncIterator[RuntimePool]:
    """A two-worker pool (numpy, pandas, matplotlib preloaded), started with secrets in env."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in SECRETS.items():
            patch.setenv(name, value)
        async with RuntimePool(size=2) as started:
            yield started
