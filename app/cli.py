"""The ``sabre`` command line: serve, migrate, manage API keys."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from app.auth.cli import keys
from app.config import Settings

cli = typer.Typer(help="SABRE: run LLM agents that act by writing Python, over HTTP.", no_args_is_help=True)
cli.add_typer(keys, name="keys")
personas = typer.Typer(help="Check and inspect persona files.", no_args_is_help=True)
cli.add_typer(personas, name="personas")
webhooks = typer.Typer(help="Webhooks: the secrets receivers verify signatures with.", no_args_is_help=True)
cli.add_typer(webhooks, name="webhooks")


@cli.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to bind (default SABRE_HOST or 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (default SABRE_PORT or 8011).")] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, max=64, help="Server processes (default SABRE_WEB_WORKERS or 1; use the cores)."),
    ] = None,
) -> None:
    """Run the HTTP service (the embedded SQLite store upgrades itself).

    The service is stateless, so several processes serve one store; each has its own sandbox pool.
    """
    import os

    import uvicorn

    from app.kit.logging import configure_logging

    # Overrides go through the environment so that every worker process reads the same settings.
    if host is not None:
        os.environ["SABRE_HOST"] = host
    if port is not None:
        os.environ["SABRE_PORT"] = str(port)
    if workers is not None:
        os.environ["SABRE_WEB_WORKERS"] = str(workers)
    settings = Settings()
    configure_logging(level=settings.log_level, fmt=settings.log_format)
    from app.kit.metrics import share_across_processes

    if settings.web_workers > 1:
        share_across_processes()
    if settings.metrics_port is not None:
        _serve_metrics(settings)
    if settings.is_sqlite and settings.web_workers > 1:
        # Upgrade once here, not concurrently in every worker's lifespan.
        from app.kit.migrate import upgrade_sync

        upgrade_sync(settings.effective_database_url)
    uvicorn.run(
        "app.main:create_served_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.web_workers,
        log_level="warning",
        # uvicorn kills (and restarts) a worker that misses one 5 s healthcheck: a worker whose
        # turns keep its CPU busy on a loaded machine would lose every request it holds.
        timeout_worker_healthcheck=_WORKER_HEALTHCHECK_SECONDS,
    )


_WORKER_HEALTHCHECK_SECONDS = 30


def _serve_metrics(settings: Settings) -> None:
    """Start the metrics port, or say in one line why it cannot be and exit 2."""
    from app.kit.metrics import start_metrics_server

    try:
        start_metrics_server(settings)
    except OSError as exc:
        where = f"{settings.metrics_host}:{settings.metrics_port}"
        typer.echo(f"cannot serve metrics on {where} (SABRE_METRICS_PORT): {exc.strerror or exc}", err=True)
        raise typer.Exit(code=2) from None


@cli.command()
def worker(
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=1000,
            help="Turns run at once (default SABRE_WORKER_CONCURRENCY or 8; webhooks apart).",
        ),
    ] = None,
) -> None:
    """Run background jobs (turns, webhooks) from the PostgreSQL store until SIGTERM or SIGINT.

    Run as many as the load needs, on any machine that reaches the store; set
    SABRE_WORKER_IN_SERVE=false so that `sabre serve` leaves the jobs to them.
    """
    from app.kit.logging import configure_logging
    from app.wiring import StartupError
    from app.worker import SQLITE_REFUSAL, run_worker_process

    settings = Settings()
    if settings.is_sqlite:
        typer.echo(SQLITE_REFUSAL, err=True)
        raise typer.Exit(code=2)
    configure_logging(level=settings.log_level, fmt=settings.log_format)
    if settings.metrics_port is not None:
        _serve_metrics(settings)
    try:
        code = asyncio.run(
            run_worker_process(settings, concurrency=concurrency or settings.worker_concurrency)
        )
    except StartupError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=2) from None
    raise typer.Exit(code=code)


@cli.command()
def chat(
    url: Annotated[
        str, typer.Option(envvar="SABRE_URL", help="The server (default: a local sabre serve).")
    ] = "http://127.0.0.1:8011",
    api_key: Annotated[
        str | None, typer.Option(envvar="SABRE_API_KEY", help="API key (none for a local open server).")
    ] = None,
    persona: Annotated[str, typer.Option(help="The persona to talk to.")] = "default",
    tools: Annotated[
        Path | None, typer.Option(help="A JSON file of external tools (OpenAI function format) you answer.")
    ] = None,
    figures: Annotated[Path, typer.Option(help="Where figures are saved.")] = Path("sabre-figures"),
) -> None:
    """Chat with an agent in the terminal, over the HTTP API (the model's code and results as they come)."""
    from app.chat_cli import ChatOptions, run_chat
    from app.chat_cli.tools import load_tools

    options = ChatOptions(url=url, api_key=api_key, persona=persona, figures=figures, tools=load_tools(tools))
    raise typer.Exit(run_chat(options))


@webhooks.command("secret")
def webhooks_secret(tenant: Annotated[str, typer.Argument(help="The tenant whose secret to print.")]) -> None:
    """Print the secret a tenant's webhook receivers verify signatures with (whsec_…, Standard
    Webhooks). It is derived from SABRE_WEBHOOK_SECRET, or from a secret the store keeps, so it
    changes only when that does."""
    from app.events.webhooks import tenant_secret
    from app.kit.db import create_engine, create_sessionmaker
    from app.kit.migrate import upgrade

    async def _secret() -> str:
        settings = Settings()
        if settings.is_sqlite:
            await upgrade(settings.effective_database_url)
        engine = create_engine(settings.effective_database_url)
        try:
            return await tenant_secret(settings, sessionmaker=create_sessionmaker(engine), tenant=tenant)
        finally:
            await engine.dispose()

    typer.echo(asyncio.run(_secret()))


@cli.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
)
def swe(ctx: typer.Context) -> None:
    """Run SWE-bench instances through a SABRE server (`sabre swe --help`; integrations/swebench)."""
    try:
        from sabre_swebench.cli import main as swe_main
    except ImportError:
        typer.echo("sabre swe needs integrations/swebench: uv sync (dev) or pip install it", err=True)
        raise typer.Exit(code=2) from None
    raise typer.Exit(code=swe_main(ctx.args))


@cli.command()
def migrate() -> None:
    """Upgrade the configured store (SABRE_DATABASE_URL) to the latest schema. A store that cannot
    be used is one line and status 2, whatever the driver raised (a port out of range, a bad
    ``sslmode``: not only connection errors), as ``sabre serve`` says it."""
    from app.kit.db import store_problem
    from app.kit.migrate import upgrade_sync

    settings = Settings()
    url = settings.effective_database_url
    try:
        upgrade_sync(url)
    except Exception as exc:
        typer.echo(store_problem(url, exc), err=True)
        raise typer.Exit(code=2) from None
    typer.echo(f"upgraded {url.split('@')[-1]}")


@cli.command()
def openapi(
    output: Annotated[str, typer.Option(help="Where to write the spec.")] = "openapi/openapi.json",
) -> None:
    """Write the OpenAPI spec the app serves (commit it; a test fails when it drifts)."""
    from pathlib import Path

    from app.main import openapi_json

    Path(output).write_text(openapi_json(), encoding="utf-8")
    typer.echo(f"wrote {output}")


@personas.command("check")
def personas_check(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Persona directories or files to check (default: what the service loads: the shipped "
            "personas and SABRE_PERSONAS_DIR).",
            show_default=False,
        ),
    ] = None,
    mcp_servers: Annotated[
        Path | None,
        typer.Option(
            help="The mcp_servers.yaml that mcp:// tools must name a server of (default: what the "
            "service loads, SABRE_MCP_SERVERS).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the start-up checks on persona files; print OK or every problem (exit code 1)."""
    from app.personas.loader import check_personas
    from app.personas.service import persona_directories
    from app.tools.mcp import McpConfigError, load_mcp_servers, unconfigured_references

    settings = Settings()
    targets = tuple(paths) if paths else persona_directories(settings)
    check = check_personas(*targets, require_default=not paths)
    for problem in check.problems:
        typer.echo(str(problem), err=problem.severity == "error")
    # As at start-up: every mcp://server/tool must name a server of mcp_servers.yaml.
    config = mcp_servers or settings.mcp_servers
    try:
        servers = load_mcp_servers(
            config, required=mcp_servers is not None or "mcp_servers" in settings.model_fields_set
        )
    except McpConfigError as exc:
        mcp_problems = [f"{config}: {exc}"]
    else:
        mcp_problems = unconfigured_references(check.personas.values(), servers)
    for message in mcp_problems:
        typer.echo(message, err=True)
    if check.errors or mcp_problems:
        typer.echo(f"{len(check.errors) + len(mcp_problems)} problem(s) in persona files", err=True)
        raise typer.Exit(code=1)
    names = ", ".join(sorted(check.personas)) or "none"
    typer.echo(f"OK: {len(check.personas)} persona(s): {names}")


@personas.command("prompt")
def personas_prompt(name: Annotated[str, typer.Argument(help="The persona whose prompt to print.")]) -> None:
    """Print the system prompt a persona's conversations start with (no request tools)."""
    from app.personas.loader import PersonaError
    from app.personas.prompt import build_prompt
    from app.personas.service import load_configured_personas

    try:
        loaded = load_configured_personas(Settings())
    except PersonaError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(code=1) from None
    if name not in loaded:
        typer.echo(f"no persona {name!r}; available: {', '.join(sorted(loaded))}", err=True)
        raise typer.Exit(code=1)
    typer.echo(build_prompt(loaded[name]), nl=False)


def main() -> None:
    """Console-script entry point. A setting the environment got wrong (``Settings()`` refused it)
    is one line per problem, naming the variable, not a traceback."""
    from pydantic import ValidationError

    try:
        cli()
    except ValidationError as exc:
        if exc.title != "Settings":
            raise
        for error in exc.errors():
            name = f"SABRE_{error['loc'][0]}".upper() if error["loc"] else "settings"
            message = str(error["msg"]).removeprefix("Value error, ")
            line = message if message.startswith("SABRE_") else f"{name}: {message}"
            typer.echo(f"sabre: {line}", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
