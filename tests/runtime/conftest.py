"""Fixtures of the runtime tests: one real pool of sandbox workers per backend for the package.

Every test that takes ``pool`` runs twice, under ``bwrap`` and under ``process``; the bwrap run
is skipped (saying why) only when bubblewrap cannot run on this machine. ``tmp_path`` is
overridden: a test's working directory is a fresh conversation directory inside the pool's
workspaces, as in the service (the bwrap sandbox only sees that directory).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import pytest
import pytest_asyncio

from app.runtime import RuntimePool
from app.runtime.isolation import Backend
from tests.runtime.support import BACKENDS, bwrap_unavailable, started_pool

# Set in the server's environment while the pool runs: the sandbox must never see them.
SECRETS = {"OPENAI_API_KEY": "sk-test-secret", "SABRE_DATABASE_URL": "postgresql://secret"}


@pytest.fixture(scope="package")
def workspaces() -> Iterator[Path]:
    """The workspaces directory of the package's pools (one directory per conversation in it).

    In /var/tmp, like a service's data directory outside /tmp (under bwrap a block gets a /tmp of
    its own, which would hide it), and not below pytest's private temporary directories.
    """
    parent = "/var/tmp" if os.path.isdir("/var/tmp") else None
    root = Path(tempfile.mkdtemp(prefix="sabre-workspaces-", dir=parent))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tmp_path(workspaces: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh conversation directory inside ``workspaces`` (replaces pytest's ``tmp_path``)."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workspaces))


@pytest.fixture(scope="package", params=BACKENDS)
def pool(request: pytest.FixtureRequest) -> RuntimePool:
    """The package's pool of the test's backend (``bwrap_pool``, ``process_pool``).

    A fixture of its own per backend, not one parametrized fixture: pytest keeps one value of a
    fixture at a time, so a parametrized pool was closed and started again at every change of
    backend, twice per test file (the preloads cost a second of CPU per start). Each backend's pool
    now serves every test file of the package that a test process runs in a row."""
    return cast(RuntimePool, request.getfixturevalue(f"{request.param}_pool"))


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def bwrap_pool(workspaces: Path) -> AsyncIterator[RuntimePool]:
    """``pool`` under bwrap."""
    async with _preloaded_pool("bwrap", workspaces) as started:
        yield started


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def process_pool(workspaces: Path) -> AsyncIterator[RuntimePool]:
    """``pool`` under the process backend."""
    async with _preloaded_pool("process", workspaces) as started:
        yield started


@asynccontextmanager
async def _preloaded_pool(backend: Backend, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """A two-worker pool (numpy, pandas, matplotlib preloaded), started with secrets in env; its
    processes stay live for their conversation's next block, as in the service."""
    if backend == "bwrap" and (why := await bwrap_unavailable(workspaces)) is not None:
        pytest.skip(f"bubblewrap cannot run here: {why}")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in SECRETS.items():
            patch.setenv(name, value)
        async with RuntimePool(size=2, sandbox=backend, workspaces=workspaces, live_seconds=10.0) as started:
            assert started.sandbox == backend
            yield started


@pytest.fixture(scope="package", params=BACKENDS)
def replaying_pool(request: pytest.FixtureRequest) -> RuntimePool:
    """A two-worker pool without live processes (no preloads): every block starts in a fresh
    fork from its snapshot, and a resume replays the block from its journal. One per backend, as
    ``pool``."""
    return cast(RuntimePool, request.getfixturevalue(f"replaying_{request.param}_pool"))


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def replaying_bwrap_pool(workspaces: Path) -> AsyncIterator[RuntimePool]:
    """``replaying_pool`` under bwrap."""
    async with started_pool("bwrap", workspaces, size=2) as started:
        yield started


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def replaying_process_pool(workspaces: Path) -> AsyncIterator[RuntimePool]:
    """``replaying_pool`` under the process backend."""
    async with started_pool("process", workspaces, size=2) as started:
        yield started
