"""A fresh checkout per instance at its base commit, and the final patch.

The checkout is ``git clone --shared`` of a local repository or mirror (objects borrowed through
alternates, so it costs seconds and little disk; the source is never written to), detached at the
base commit. The patch is every change against the base commit, new files included: what SWE-bench's
harness applies with ``git apply``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Final

GIT_SAFE: Final = (
    # The agent had a shell in the checkout: never let its .git/config run anything in our git.
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.quotePath=false",
    "-c",
    "protocol.file.allow=always",
)


class CheckoutError(RuntimeError):
    """The repository or the commit cannot be found, or git failed."""


async def git(*args: str, cwd: Path | None = None, limit: float = 300.0) -> str:
    """Run git with our safe settings; its stdout, or ``CheckoutError`` with its stderr."""
    process = await asyncio.create_subprocess_exec(
        "git",
        *GIT_SAFE,
        *args,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"},
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=limit)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise CheckoutError(f"git {args[0]} took longer than {limit:g} s") from None
    if process.returncode != 0:
        message = err.decode("utf-8", errors="replace").strip().splitlines()
        raise CheckoutError(f"git {args[0]}: {message[-1] if message else f'exit {process.returncode}'}")
    return out.decode("utf-8", errors="replace")


def find_source(repo: str, *, repos_dir: Path | None, repo_path: Path | None) -> Path:
    """Where the instance's repository is: ``repo_path`` for every instance, or in ``repos_dir`` as
    ``owner__name``, ``owner/name`` or ``name`` (each also with ``.git``, as a mirror is named)."""
    if repo_path is not None:
        return repo_path
    if repos_dir is None:
        raise CheckoutError("no repository given: pass --repo PATH or --repos DIR")
    owner, _, name = repo.rpartition("/")
    stems = [f"{owner}__{name}", f"{owner}/{name}", name] if owner else [name]
    for stem in stems:
        for candidate in (repos_dir / stem, repos_dir / f"{stem}.git"):
            if candidate.is_dir():
                return candidate
    raise CheckoutError(f"{repo}: not found in {repos_dir} (as {', '.join(stems)}, or with .git)")


async def prepare(source: Path, commit: str, *, target: Path) -> None:
    """A clean checkout of ``source`` at ``commit`` in ``target`` (whatever was there is removed)."""
    origin = await asyncio.to_thread(_clear, source, target)
    await git("clone", "--quiet", "--shared", "--no-checkout", origin, str(target))
    try:
        await git("checkout", "--quiet", "--detach", commit, cwd=target)
    except CheckoutError as exc:
        raise CheckoutError(f"commit {commit} of {source}: {exc}") from None


def _clear(source: Path, target: Path) -> str:
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    return str(source.resolve())


async def final_patch(target: Path, commit: str) -> str:
    """Everything that changed since ``commit`` (staged, unstaged, new files, commits the agent made)."""
    await git("add", "--all", cwd=target)
    return await git("diff", "--cached", "--binary", "--no-color", "--no-ext-diff", commit, cwd=target)


async def remove(target: Path) -> None:
    """Delete a checkout (its objects live in the source, so nothing else is lost)."""
    await asyncio.to_thread(shutil.rmtree, target, ignore_errors=True)
