"""The sandbox backends: what ``SABRE_SANDBOX`` may ask for and what a pool runs."""

from __future__ import annotations

from typing import Literal

SandboxMode = Literal["auto", "bwrap", "process"]
Backend = Literal["bwrap", "process"]
