"""``sabre keys``: create, list, revoke and rotate the stored API keys (secrets are shown once)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from app.config import Settings
from app.kit.clock import utcnow

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

T = TypeVar("T")

keys = typer.Typer(help="Manage API keys (stored hashed; a secret is printed once).", no_args_is_help=True)

_DURATION = re.compile(r"(\d+)([smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str, *, option: str) -> timedelta:
    """``90``, ``90s``, ``15m``, ``12h``, ``30d`` or ``2w`` as a duration; a bad value is a usage error."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or int(match.group(1)) == 0 or len(match.group(1)) > 7:
        raise typer.BadParameter(
            "expected a positive duration such as 3600, 15m, 12h, 30d or 2w", param_hint=option
        )
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def _in_session(work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """Run ``work`` in one committed transaction on the configured store (the embedded one is
    upgraded first, as the server would)."""
    from app.kit.db import create_engine, create_sessionmaker
    from app.kit.migrate import upgrade

    async def _run() -> T:
        settings = Settings()
        if settings.is_sqlite:
            await upgrade(settings.effective_database_url)
        engine = create_engine(settings.effective_database_url)
        try:
            async with create_sessionmaker(engine)() as session, session.begin():
                return await work(session)
        finally:
            await engine.dispose()

    return asyncio.run(_run())


@keys.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts for.")],
    name: Annotated[str | None, typer.Option(help="A label to tell keys apart (e.g. the client).")] = None,
    expires_in: Annotated[
        str | None, typer.Option(help="Expire after this long (3600, 15m, 12h, 30d, 2w); default never.")
    ] = None,
) -> None:
    """Create an API key; its secret is printed once (the last line) and only its hash is stored."""
    from app.auth import service  # the store's modules load only for the command that needs them

    expires_at = utcnow() + parse_duration(expires_in, option="--expires-in") if expires_in else None
    try:
        created = _in_session(
            lambda session: service.create_key(session, tenant=tenant, name=name, expires_at=expires_at)
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tenant/--name") from exc
    typer.echo(f"created {created.id} for tenant {created.tenant}", err=True)
    typer.echo(created.secret)


@keys.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Include revoked keys.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """List keys: id, tenant, name, prefix, created, expires, status (never the secrets)."""
    from app.auth import service  # the store's modules load only for the command that needs them

    rows = _in_session(lambda session: service.list_keys(session, tenant=tenant, include_revoked=show_all))
    now = utcnow()
    records = [
        {
            "id": key.id,
            "tenant": key.tenant,
            "name": key.name,
            "prefix": key.prefix,
            "created_at": key.created_at.isoformat(timespec="seconds"),
            "expires_at": key.expires_at.isoformat(timespec="seconds") if key.expires_at else None,
            "status": service.key_status(key, now=now),
        }
        for key in rows
    ]
    if as_json:
        for record in records:
            typer.echo(json.dumps(record))
        return
    columns = ("id", "tenant", "name", "prefix", "created_at", "expires_at", "status")
    table = [[str(record[c] or "-") for c in columns] for record in records]
    widths = [max([len(c), *(len(row[i]) for row in table)]) for i, c in enumerate(columns)]
    for row in [list(columns), *table]:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


@keys.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (`key_…`, see `keys list`).")],
) -> None:
    """Revoke a key at once: the next request with it is refused (401)."""
    from app.auth import service  # the store's modules load only for the command that needs them

    if not _in_session(lambda session: service.revoke_key(session, key_id)):
        typer.echo(f"no live key {key_id!r}", err=True)
        raise typer.Exit(code=1)
    typer.echo(f"revoked {key_id}", err=True)


@keys.command("rotate")
def keys_rotate(
    key_id: Annotated[str, typer.Argument(help="The key to replace (`key_…`).")],
    grace: Annotated[
        str | None,
        typer.Option(
            help="Keep the old key working this long (15m, 1h, 1d) while clients switch; default: revoke now."
        ),
    ] = None,
) -> None:
    """Replace a key with a new one of the same tenant, name and expiry; the new secret is printed once."""
    from app.auth import service  # the store's modules load only for the command that needs them

    window = parse_duration(grace, option="--grace") if grace else None
    try:
        created = _in_session(lambda session: service.rotate_key(session, key_id, grace=window))
    except LookupError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=1) from None
    old = f"the old key expires in {grace}" if grace else "the old key is revoked"
    typer.echo(f"created {created.id} for tenant {created.tenant}; {old}", err=True)
    typer.echo(created.secret)
