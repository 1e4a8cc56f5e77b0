"""Files the helpers write into the conversation's working directory (downloads, screenshots).

Names come from URLs, which the model controls, so they are reduced to a safe stem, and a file is
only ever created, never overwritten: ``open(..., "xb")`` fails on an existing path, a symlink the
sandboxed code planted included, so a download cannot clobber the user's files or write elsewhere.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

from app.helpers.base import HelperContext, HelperError
from app.helpers.threads import run_blocking

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_STEM = 60
MAX_TRIES = 1000


def workdir_of(ctx: HelperContext, *, helper: str) -> Path:
    """The working directory the helper writes into, or a HelperError when there is none."""
    if ctx.workdir is None:
        raise HelperError(f"{helper}: this conversation has no working directory to write into")
    return ctx.workdir


def clean_stem(text: str, *, default: str) -> str:
    """``text`` reduced to a file stem: ASCII letters, digits and ``._-``, not starting with a dot."""
    stem = _UNSAFE.sub("-", text).strip(".-_")[:MAX_STEM].strip(".-_")
    return stem or default


def safe_stem(url_path: str, *, default: str) -> str:
    """A file stem from the last segment of a URL path, without its extension."""
    name = PurePosixPath(unquote(url_path)).name
    return clean_stem(name.rsplit(".", 1)[0] if "." in name else name, default=default)


async def write_new_file(workdir: Path, *, stem: str, suffix: str, data: bytes) -> str:
    """Create ``stem + suffix`` (or ``stem-2 + suffix``, ...) in ``workdir``; returns its name."""
    return await run_blocking(_write_new_file, workdir, stem, suffix, data)


def _write_new_file(workdir: Path, stem: str, suffix: str, data: bytes) -> str:
    workdir.mkdir(parents=True, exist_ok=True)
    for n in range(1, MAX_TRIES + 1):
        name = f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}"
        try:
            with open(workdir / name, "xb") as out:
                out.write(data)
        except FileExistsError:
            continue
        return name
    raise HelperError(f"cannot find a free file name for {stem}{suffix} in the working directory")
