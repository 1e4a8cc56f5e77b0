"""The ``sabre`` command line: serve, migrate, manage API keys."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from app.config import Settings, is_loopback

cli = typer.Typer(help="SABRE: run LLM agents that act by writing Python, over HTTP.", no_args_is_help=True)
keys = typer.Typer(help="Manage API keys (stored hashed).", no_args_is_help=True)
cli.add_typer(keys, name="keys")


@cli.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to bind (default SABRE_HOST or 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (default SABRE_PORT or 8011).")] = None,
) -> None:
    """Run the HTTP service (the embedded SQLite store upgrades itself)."""
    import uvicorn

    from app.kit.logging import configure_logging
    from app.main import create_app

    overrides: dict[str, object] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    settings = Settings(**overrides)  # type: ignore[arg-type]
    if not settings.api_keys and not is_loopback(settings.host):
        typer.echo(
            f"note: binding {settings.host} requires API keys (SABRE_API_KEYS or `sabre keys create`)",
            err=True,
        )
    configure_logging()
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")


@cli.command()
def migrate() -> None:
    """Upgrade the configured store (SABRE_DATABASE_URL) to the latest schema."""
    from app.kit.migrate import upgrade_sync

    settings = Settings()
    upgrade_sync(settings.effective_database_url)
    typer.echo(f"upgraded {settings.effective_database_url.split('@')[-1]}")


@keys.command("create")
def keys_create(tenant: Annotated[str, typer.Option(help="The tenant the key acts for.")]) -> None:
    """Create an API key; it is printed once and only its hash is stored."""
    from app.auth.service import create_key
    from app.kit.db import create_engine, create_sessionmaker
    from app.kit.migrate import upgrade

    async def _create() -> str:
        settings = Settings()
        if settings.is_sqlite:
            await upgrade(settings.effective_database_url)
        engine = create_engine(settings.effective_database_url)
        try:
            async with create_sessionmaker(engine)() as session, session.begin():
                created = await create_key(session, tenant=tenant)
        finally:
            await engine.dispose()
        return created.secret

    try:
        secret = asyncio.run(_create())
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tenant") from exc
    typer.echo(secret)


def main() -> None:
    """Console-script entry point."""
    cli()
