"""sabre_call's checks and hand-off, and Browser.screenshot's refusals."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from typing import Any

import pytest

from app.helpers import HelperContext, HelperError
from app.helpers.browser import NOT_INSTALLED, browser_executable, playwright_installed, screenshot
from app.helpers.subtask import sabre_call
from app.personas.models import Network
from tests.helpers.conftest import WebServer


def _recording(calls: list[tuple[str, list[Any]]]) -> Any:
    async def subtask(description: str, data: list[Any]) -> str:
        calls.append((description, data))
        return "sub-task answer"

    return subtask


async def test_sabre_call_hands_the_task_to_the_runner(ctx: HelperContext) -> None:
    calls: list[tuple[str, list[Any]]] = []
    ctx = replace(ctx, subtask=_recording(calls), depth=1)
    assert await sabre_call(ctx, ["  Summarise these ", ["a", {"b": 1}]], {}) == "sub-task answer"
    assert await sabre_call(ctx, ["Answer this"], {}) == "sub-task answer"
    assert await sabre_call(ctx, [], {"description": "One value", "expr_list": 42}) == "sub-task answer"
    assert calls == [("Summarise these", ["a", {"b": 1}]), ("Answer this", []), ("One value", [42])]


async def test_sabre_call_refusals(ctx: HelperContext) -> None:
    with pytest.raises(HelperError, match=r"^sabre_call is not available here$"):
        await sabre_call(ctx, ["task"], {})
    calls: list[tuple[str, list[Any]]] = []
    deep = replace(ctx, subtask=_recording(calls), depth=2)
    with pytest.raises(HelperError, match="nest at most 2 deep"):
        await sabre_call(deep, ["task"], {})
    ready = replace(ctx, subtask=_recording(calls))
    with pytest.raises(HelperError, match="description must be a non-empty string"):
        await sabre_call(ready, ["  "], {})
    with pytest.raises(HelperError, match=r"data is .* characters, the limit is"):
        await sabre_call(ready, ["task", ["x" * 500_000]], {})
    assert calls == []


async def test_screenshot_checks_the_policy_before_anything(ctx: HelperContext) -> None:
    with pytest.raises(HelperError, match=r"Browser.screenshot: .*private"):
        await screenshot(ctx, ["http://169.254.169.254/"], {})
    with pytest.raises(HelperError, match="only http and https"):
        await screenshot(ctx, ["file:///etc/passwd"], {})
    with pytest.raises(HelperError, match="width must be an integer"):
        await screenshot(ctx, ["http://127.0.0.1/"], {"width": 10})
    with pytest.raises(HelperError, match="no working directory"):
        await screenshot(replace(ctx, workdir=None), ["http://127.0.0.1/"], {})


@pytest.mark.skipif(playwright_installed(), reason="Playwright is installed here")
async def test_screenshot_without_playwright_says_so(ctx: HelperContext, web: WebServer) -> None:
    with pytest.raises(HelperError) as info:
        await screenshot(ctx, [web.url("/article.html")], {})
    assert str(info.value) == NOT_INSTALLED
    assert "Playwright is not installed" in NOT_INSTALLED


CHROMIUM = os.environ.get("SABRE_BROWSER_EXECUTABLE") or shutil.which("chromium")


@pytest.mark.skipif(not (playwright_installed() and CHROMIUM), reason="needs Playwright and a Chromium")
async def test_screenshot_renders_and_every_browser_request_obeys_the_policy(
    ctx: HelperContext, web: WebServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SABRE_BROWSER_EXECUTABLE", str(CHROMIUM))
    browser_executable.cache_clear()
    ctx = replace(ctx, network=Network(allow=("127.0.0.1",), deny=("localhost",)))
    try:
        name = await screenshot(
            ctx, [web.url("/spy.html")], {"full_page": False, "width": 640, "height": 480}
        )
        assert name == "screenshot-127.0.0.1.png"
        assert ctx.workdir is not None
        assert (ctx.workdir / name).read_bytes().startswith(b"\x89PNG")
        paths = [seen.path for seen in web.seen]
        assert "/pixel.png" in paths  # fetched for the browser, under the policy
        assert "/beacon" not in paths  # localhost is denied: the browser could not go around it
        with pytest.raises(HelperError, match=r"Browser.screenshot: .*private"):
            await screenshot(ctx, [web.url("/to-metadata")], {})
    finally:
        browser_executable.cache_clear()
