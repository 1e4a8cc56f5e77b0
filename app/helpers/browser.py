"""``Browser.screenshot(url)``: a PNG of a rendered page, through Playwright when it is installed.

Playwright is optional (a browser is a large install); without it the helper says so. With it, the
browser never reaches the network by itself: every request it makes (the page, its scripts and
images) is intercepted and fetched by ``app.helpers.net`` under the persona's policy, redirects
followed there hop by hop, and the response handed back to the browser. Anything not intercepted
(such as the target of a redirect the browser follows itself) goes to a proxy that does not exist,
service workers are blocked, and WebRTC may not use UDP. So a page cannot use the browser to reach
the service's own network, even through scripts or DNS rebinding.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
from typing import TYPE_CHECKING, Any, Final

import structlog

from app.helpers.base import HelperContext, HelperError, HelperSpec, bind_arguments
from app.helpers.files import clean_stem, workdir_of, write_new_file
from app.helpers.net import FetchError, FetchLimits, NetworkPolicy, default_limits, fetch, host_of, parse_url

log = structlog.get_logger(__name__)

if TYPE_CHECKING:
    from playwright.async_api import Route

USAGE: Final = "Browser.screenshot(url, *, full_page=True, width=1280, height=800, timeout=30)"
NOT_INSTALLED: Final = (
    "Browser.screenshot: Playwright is not installed on this server (the operator can add it with "
    "`pip install playwright` and `playwright install chromium`). Use Web.get(url) to read the page's "
    "text instead."
)
PAGE_BUDGET_FACTOR: Final = 5
"""A page and all its resources may load at most this many times the per-response size cap."""
_DEAD_PROXY: Final = "http://127.0.0.1:9"
_HOP_HEADERS: Final = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding"}
)
_BROWSER_ARGS: Final = (
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--dns-prefetch-disable",
    "--disable-background-networking",
    "--no-pings",
)


def playwright_installed() -> bool:
    """Whether the ``playwright`` package can be imported (its browsers may still be missing)."""
    return importlib.util.find_spec("playwright") is not None


class _Router:
    """Fetches every request the browser makes, under the policy; refuses what it refuses."""

    def __init__(self, *, policy: NetworkPolicy, limits: FetchLimits) -> None:
        self.policy = policy
        self.limits = limits
        self.budget = limits.max_bytes * PAGE_BUDGET_FACTOR
        self.refused: list[str] = []

    async def handle(self, route: Route) -> None:
        request = route.request
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _HOP_HEADERS and not k.startswith(":")
        }
        try:
            if self.budget <= 0:
                raise FetchError("the page loaded more than its byte budget")
            fetched = await fetch(
                request.url,
                policy=self.policy,
                limits=self.limits,
                method=request.method,
                headers=headers,
                content=request.post_data_buffer,
                # Chromium does not route the request a fulfilled redirect leads to (it would go
                # to the dead proxy), so redirects are followed here, each hop checked.
                follow_redirects=True,
                raise_for_status=False,
            )
        except FetchError as exc:
            self.refused.append(str(exc))
            await route.abort("blockedbyclient")
            return
        self.budget -= len(fetched.body)
        response_headers = {k: v for k, v in fetched.headers.items() if k.lower() not in _HOP_HEADERS}
        response_headers.pop("content-encoding", None)  # the body was decoded by the fetch
        await route.fulfill(status=fetched.status, headers=response_headers, body=fetched.body)


@functools.cache
def browser_executable() -> str | None:
    """``SABRE_BROWSER_EXECUTABLE``, read once (None: Playwright's own Chromium)."""
    from app.config import Settings

    path = Settings().browser_executable
    return str(path) if path else None


async def _capture(
    url: str, *, router: _Router, full_page: bool, width: int, height: int, seconds: float
) -> bytes:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=browser_executable(),
            args=list(_BROWSER_ARGS),
            proxy={"server": _DEAD_PROXY},
            timeout=seconds * 1000,
        )
        try:
            context = await browser.new_context(
                viewport={"width": width, "height": height}, service_workers="block", accept_downloads=False
            )
            await context.route("**/*", router.handle)
            if hasattr(context, "route_web_socket"):
                await context.route_web_socket("**/*", lambda ws: ws.close())
            page = await context.new_page()
            await page.goto(url, wait_until="load", timeout=seconds * 1000)
            png: bytes = await page.screenshot(full_page=full_page, type="png", timeout=seconds * 1000)
            return png
        finally:
            await browser.close()


def _dimension(value: Any, name: str, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise HelperError(f"Browser.screenshot: {name} must be an integer from {low} to {high}")
    return value


async def screenshot(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> str:
    """Render ``url`` and save a PNG in the working directory; returns its relative path."""
    params = bind_arguments(
        USAGE,
        args,
        kwargs,
        positional=("url",),
        keyword_only={"full_page": True, "width": 1280, "height": 800, "timeout": 30},
    )
    width = _dimension(params["width"], "width", low=200, high=4096)
    height = _dimension(params["height"], "height", low=200, high=4096)
    timeout = params["timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 1 <= timeout <= 120:
        raise HelperError("Browser.screenshot: timeout must be a number of seconds from 1 to 120")
    workdir = workdir_of(ctx, helper="Browser.screenshot")
    policy = NetworkPolicy.from_network(ctx.network)
    limits = ctx.fetch_limits or default_limits()
    try:
        parsed = parse_url(params["url"])
        async with asyncio.timeout(limits.timeout_seconds):
            await policy.resolve(parsed)  # the page itself: a clear error before a browser starts
    except HelperError as exc:
        raise HelperError(f"Browser.screenshot: {exc}") from None
    except TimeoutError:
        raise HelperError(f"Browser.screenshot: cannot resolve {host_of(parsed)} in time") from None
    if not playwright_installed():
        raise HelperError(NOT_INSTALLED)
    from playwright.async_api import Error as PlaywrightError

    router = _Router(policy=policy, limits=limits)
    try:
        async with asyncio.timeout(timeout + 10):
            png = await _capture(
                str(parsed),
                router=router,
                full_page=bool(params["full_page"]),
                width=width,
                height=height,
                seconds=float(timeout),
            )
    except TimeoutError:
        raise HelperError(f"Browser.screenshot: {parsed} did not render within {timeout} s") from None
    except PlaywrightError as exc:
        message = exc.message.splitlines()[0] if exc.message else type(exc).__name__
        if router.refused:
            message += f" (refused: {router.refused[0]})"
        raise HelperError(f"Browser.screenshot: {message}") from None
    except Exception as exc:  # the driver or the browser did not start (a missing library, say)
        log.warning("browser_failed", error=repr(exc))
        raise HelperError(
            f"Browser.screenshot: the browser could not run here ({type(exc).__name__})"
        ) from None
    stem = clean_stem(f"screenshot-{host_of(parsed)}", default="screenshot")
    return await write_new_file(workdir, stem=stem, suffix=".png", data=png)


SPEC = HelperSpec(
    name="Browser.screenshot",
    signature=(
        "Browser.screenshot(url: str, *, full_page: bool = True, width: int = 1280, height: int = 800, "
        "timeout: float = 30) -> str"
    ),
    doc="""
Render a web page in a headless browser (JavaScript runs) and save a PNG screenshot in the
working directory; returns its path (relative, e.g. `screenshot-example.com.png`). `full_page`
captures the whole scrolling page, else just the `width` x `height` viewport. Every request the
page makes obeys the same network policy as `Web.get`. Needs Playwright on the server: without it
this raises an error saying so (use `Web.get(url)` for the text instead).
Example:
    path = Browser.screenshot("https://example.com", full_page=False)
    print(path)
""",
    runs="service",
    handler=screenshot,
)
