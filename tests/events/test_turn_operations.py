"""Issue 11's turn operations under an operator's and an adversary's hands, over real HTTP.

A worker SIGKILLed mid-turn, a worker frozen past its lease and woken, a server SIGKILLed under a
streamed turn; cancel across replicas (through Redis, and through the store without it), from both
replicas at once; clients that go away or stall; tenants probing each other's ids; ``stream`` with
``background``; hostile parameters; ``follow=true`` across turns.

Starting processes is what costs, so one deployment serves most tests: two ``sabre serve`` (A and B,
``SABRE_WORKER_IN_SERVE=false``) and two ``sabre worker`` on PostgreSQL + Redis, with two tenants (the
tests that kill a process come last). One scripted model serves the module; each test draws its
replies from a plan of its own, chosen by a token in the user's input, so a reply left over by one
test (a cancelled call, a killed worker's attempt) is never served to another.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.config import Settings
from app.llm.scripted import RecordedRequest, Reply, ScriptedLLM
from app.main import create_app
from tests.conversations.test_bad_input import assert_problem
from tests.events.test_turn_events import parse_sse
from tests.kit.test_jobs import process

TERMINAL = {"completed", "awaiting_tool_results", "failed", "cancelled"}
LEASE_SECONDS = 3  # turn locks, turn leases and idempotency claims of the deployment
STALLED_SECONDS = 4  # a worker silent this long has its jobs run again (longer than the lease)


# -- the scripted model, one plan per test -----------------------------------------------------------


class Plans:
    """Replies by plan: a request is answered from the plan whose token appears in its latest user
    message that has one (a block's result, a user message too, carries none), else ``ok``."""

    TOKEN = re.compile(r"plan-[0-9a-f]{10}")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plans: dict[str, deque[Reply]] = {}
        self.calls: Counter[str] = Counter()

    def add(self, *replies: str | Reply) -> str:
        token = f"plan-{secrets.token_hex(5)}"
        with self._lock:
            self._plans[token] = deque(r if isinstance(r, Reply) else Reply(text=r) for r in replies)
        return token

    def __call__(self, request: RecordedRequest) -> Reply:
        for message in reversed(request.messages):
            found = self.TOKEN.search(message.text) if message.role == "user" else None
            if found is None:
                continue
            with self._lock:
                self.calls[found.group()] += 1
                plan = self._plans.get(found.group())
                return plan.popleft() if plan else Reply(text="ok")
        return Reply(text="ok")


@pytest.fixture(scope="module")
def plans() -> Plans:
    return Plans()


@pytest.fixture(scope="module")
def model(plans: Plans) -> Iterator[ScriptedLLM]:
    with ScriptedLLM(responder=plans) as server:
        yield server


# -- deployments -----------------------------------------------------------------------------------


def _tenants() -> tuple[str, dict[str, str], dict[str, str]]:
    """``SABRE_API_KEYS`` for two fresh tenants, and each one's headers."""
    one, two = f"one{secrets.token_hex(3)}", f"two{secrets.token_hex(3)}"
    key_one, key_two = f"key-{secrets.token_hex(12)}", f"key-{secrets.token_hex(12)}"
    return (
        f"{one}:{key_one},{two}:{key_two}",
        {"Authorization": f"Bearer {key_one}"},
        {"Authorization": f"Bearer {key_two}"},
    )


@dataclass
class Target:
    """Where a test sends its requests: ``a`` and ``b`` are two replicas (the same app in process)."""

    a: httpx.AsyncClient
    b: httpx.AsyncClient
    auth: dict[str, str]  # tenant one
    other: dict[str, str]  # tenant two
    name: str


@dataclass
class Deployment:
    a: str
    b: str
    auth: dict[str, str]
    other: dict[str, str]
    data: Path
    logs: Path
    dsn: str
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)  # A, B

    async def turn_row(self, turn_id: str) -> asyncpg.Record | None:
        connection = await asyncpg.connect(self.dsn)
        try:
            return await connection.fetchrow(
                "SELECT status, lease_owner, cancel_requested_at FROM turns WHERE id = $1", turn_id
            )
        finally:
            await connection.close()

    def log_tail(self) -> str:
        return "".join(
            f"\n--- {path.name} ---\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.logs.glob("*.log"))
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _until_ready(url: str, *, within: float = 45.0) -> None:
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=2) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if (await http.get(f"{url}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise AssertionError(f"server at {url} did not become ready")


async def _workers_beating(dsn: str, count: int, *, within: float = 45.0) -> None:
    """Until ``count`` job workers sent a heartbeat in the last few seconds."""
    deadline = time.monotonic() + within
    connection = await asyncpg.connect(dsn)
    try:
        while time.monotonic() < deadline:
            live = await connection.fetchval(
                "SELECT count(*) FROM procrastinate_workers "
                "WHERE last_heartbeat > now() - interval '3 seconds'"
            )
            if live >= count:
                return
            await asyncio.sleep(0.1)
    finally:
        await connection.close()
    raise AssertionError(f"{count} job workers did not start")


@pytest.fixture(scope="module")
async def deployment(
    module_postgres_url: str, redis_url: str, model: ScriptedLLM, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Deployment]:
    """Servers A and B (no job worker inside) and two ``sabre worker`` on PostgreSQL + Redis."""
    root = tmp_path_factory.mktemp("deployment")
    keys, auth, other = _tenants()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(root),
        "SABRE_DATABASE_URL": module_postgres_url,
        "SABRE_REDIS_URL": redis_url,
        "SABRE_DATA_DIR": str(root / "data"),  # shared, like a volume (blocks' files are found here)
        "SABRE_API_KEYS": keys,
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "sk-test",
        "SABRE_LLM_API": "chat",
        "SABRE_LLM_MAX_RETRIES": "0",
        "SABRE_LLM_MAX_REPLY_CHARS": str(4 * len(BIG)),  # test 4 streams a 3,000,000-character answer
        "SABRE_MODEL": "scripted-model",
        "SABRE_RUNTIME_WORKERS": "1",
        "SABRE_RUNTIME_PRELOAD": "",
        "SABRE_BLOCK_WALL_CLOCK_SECONDS": "60",
        "SABRE_WORKER_IN_SERVE": "false",
        "SABRE_LOCK_LEASE_SECONDS": str(LEASE_SECONDS),
        "SABRE_JOBS_STALLED_SECONDS": str(STALLED_SECONDS),
        "SABRE_JOBS_STALLED_CHECK_SECONDS": "1",
    }
    logs = root / "logs"
    logs.mkdir()
    dsn = module_postgres_url.replace("postgresql+asyncpg://", "postgresql://")
    a, b = _free_port(), _free_port()
    with ExitStack() as stack:
        found = Deployment(
            a=f"http://127.0.0.1:{a}",
            b=f"http://127.0.0.1:{b}",
            auth=auth,
            other=other,
            data=root / "data",
            logs=logs,
            dsn=dsn,
        )
        for name, port in (("a", a), ("b", b)):
            serve = ["-m", "app.cli", "serve", "--port", str(port)]
            found.servers.append(stack.enter_context(process(serve, env=env, log=logs / f"serve-{name}.log")))
        for index in (1, 2):
            log = logs / f"worker-{index}.log"
            found.workers.append(stack.enter_context(process(["-m", "app.cli", "worker"], env=env, log=log)))
        try:
            await asyncio.gather(_until_ready(found.a), _until_ready(found.b), _workers_beating(dsn, 2))
        except AssertionError as exc:
            raise AssertionError(f"{exc}{found.log_tail()}") from None
        yield found


def _settings(**values: Any) -> Settings:
    return Settings(
        **{
            "openai_api_key": "sk-test",
            "llm_api": "chat",
            "llm_max_retries": 0,
            "model": "scripted-model",
            "runtime_workers": 1,
            "runtime_preload": "",
            "block_wall_clock_seconds": 60,
            **values,
        }
    )


@asynccontextmanager
async def in_process(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """An app in this process, over ASGI (a response is buffered whole: nothing live can be seen)."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://sabre.test", timeout=60) as http:
            yield http


@pytest.fixture(scope="module")
async def sqlite_app(
    sqlite_url: str, model: ScriptedLLM, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Target]:
    """The embedded deployment: one app on SQLite, its job worker inside, two tenants."""
    keys, auth, other = _tenants()
    settings = _settings(
        database_url=sqlite_url,
        data_dir=tmp_path_factory.mktemp("sqlite-app"),
        openai_base_url=model.base_url,
        api_keys=keys,
    )
    async with in_process(settings) as http:
        yield Target(a=http, b=http, auth=auth, other=other, name="sqlite")


@pytest.fixture(params=["sqlite", "postgres"])
def store_under_test(request: pytest.FixtureRequest) -> Target | Deployment:
    """Both stores: SQLite in process, or the PostgreSQL + Redis deployment over real HTTP."""
    return request.getfixturevalue("sqlite_app" if request.param == "sqlite" else "deployment")  # type: ignore[no-any-return]


@pytest.fixture
async def target(store_under_test: Target | Deployment) -> AsyncIterator[Target]:
    if isinstance(store_under_test, Target):
        yield store_under_test
        return
    found = store_under_test
    async with (
        httpx.AsyncClient(base_url=found.a, timeout=60) as a,
        httpx.AsyncClient(base_url=found.b, timeout=60) as b,
    ):
        yield Target(a=a, b=b, auth=found.auth, other=found.other, name="postgres")


@pytest.fixture
async def http(deployment: Deployment) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the deployment, authenticated as tenant one (absolute URLs: A or B)."""
    async with httpx.AsyncClient(headers=deployment.auth, timeout=60) as client:
        yield client


# -- helpers ---------------------------------------------------------------------------------------


def complete_events(buffer: str) -> list[dict[str, Any]]:
    """The events of an SSE body read so far, without a trailing event still arriving."""
    text = buffer.replace("\r\n", "\n")
    return parse_sse(text[: text.rfind("\n\n") + 2])


class SSEReader:
    """Reads one SSE response bit by bit (a task pumps its chunks, so waiting with a timeout never
    cuts the stream)."""

    def __init__(self, response: httpx.Response) -> None:
        self.buffer = ""
        self.ended = False
        self._chunks: asyncio.Queue[str | None] = asyncio.Queue()
        self._pump = asyncio.ensure_future(self._read(response))

    async def _read(self, response: httpx.Response) -> None:
        try:
            async for chunk in response.aiter_text():
                self._chunks.put_nowait(chunk)
        finally:
            self._chunks.put_nowait(None)

    async def _next(self, seconds: float) -> None:
        chunk = await asyncio.wait_for(self._chunks.get(), seconds)
        if chunk is None:
            self.ended = True
            raise AssertionError(f"the stream ended: {self.events}")
        self.buffer += chunk

    @property
    def events(self) -> list[dict[str, Any]]:
        return complete_events(self.buffer)

    async def until(
        self, done: Callable[[list[dict[str, Any]]], bool], *, within: float = 20.0
    ) -> list[dict[str, Any]]:
        """Read until ``done(events)``; the events read."""
        deadline = time.monotonic() + within
        while not done(self.events):
            await self._next(max(0.0, deadline - time.monotonic()))
        return self.events

    async def rest(self, *, within: float = 20.0) -> list[dict[str, Any]]:
        """Read to the end of the stream."""
        with contextlib.suppress(AssertionError):
            await self.until(lambda _: False, within=within)
        assert self.ended
        return self.events

    async def quiet_for(self, seconds: float) -> bool:
        """True when nothing arrives for ``seconds`` and the stream stays open."""
        try:
            await self._next(seconds)
        except TimeoutError:
            return True
        except AssertionError:
            pass
        return False

    async def aclose(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(BaseException):
            await self._pump


@asynccontextmanager
async def reading(response: httpx.Response) -> AsyncIterator[SSEReader]:
    reader = SSEReader(response)
    try:
        yield reader
    finally:
        await reader.aclose()


def count(events: list[dict[str, Any]], type_: str) -> int:
    return sum(e["event"] == type_ for e in events)


async def wait_turn(
    http: httpx.AsyncClient, base: str, conversation_id: str, turn_id: str, *, within: float = 20.0
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        turn: dict[str, Any] = (
            await http.get(f"{base}/v1/conversations/{conversation_id}/turns/{turn_id}")
        ).json()
        if turn["status"] in TERMINAL or time.monotonic() > deadline:
            return turn
        await asyncio.sleep(0.05)


async def stored_events(http: httpx.AsyncClient, base: str, conversation_id: str) -> list[dict[str, Any]]:
    page = await http.get(f"{base}/v1/conversations/{conversation_id}/events", params={"limit": 500})
    assert page.status_code == 200, page.text
    return list(page.json()["data"])


async def until(check: Callable[[], Any], *, within: float, what: str) -> None:
    """Wait until ``check()`` (a value or an awaitable) is true."""
    deadline = time.monotonic() + within
    while not await _value(check()):
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.05)


async def _value(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def holders(path: Path) -> list[int]:
    """The processes holding ``path`` open (the sandbox sees it through a bind mount: same inode)."""
    target = path.stat()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    st = os.stat(fd)
                    if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                        found.append(int(proc.name))
                        break
    return found


def block(code: str) -> str:
    return f"Working on it.\n<helpers>\n{code}\n</helpers>"


def held_block(name: str) -> str:
    """A block that holds a file of its workdir open, then sleeps for 30 s."""
    return block(f"held = open({name!r}, 'w')\nheld.write('x')\nheld.flush()\nimport time\ntime.sleep(30)")


def ids_of(location: str) -> tuple[str, str]:
    """``(conversation_id, turn_id)`` of a turn's Location."""
    parts = location.split("/")
    assert parts[:3] == ["", "v1", "conversations"], location
    assert parts[4] == "turns", location
    return parts[3], parts[5]


def assert_one_end(events: list[dict[str, Any]], end: str) -> None:
    """Stored events: numbered without gaps, one turn, exactly one end event, and it is last."""
    types = [e["type"] for e in events]
    assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[0]["seq"] + len(events)))
    assert types[0] == "turn.started", types
    assert types[-1] == end, types
    ends = [t for t in types if t in ("turn.completed", "turn.failed", "turn.cancelled")]
    assert ends == [end], types


# -- 3, 6: a client that goes away ------------------------------------------------------------------


async def test_a_client_leaving_a_streamed_post_does_not_stop_the_turn(
    deployment: Deployment, http: httpx.AsyncClient, plans: Plans
) -> None:
    """``stream: true`` runs the turn as a task of the serving process (A); the client drops the
    connection mid-answer; the turn completes anyway and every event is stored. The client's retry
    with the same Idempotency-Key, on B while the turn still runs, follows that same turn live."""
    text = " ".join(["word"] * 60)
    token = plans.add(Reply(text=text, chunk_size=8, chunk_delay=0.03))
    body = {"input": f"{token} talk", "stream": True}
    key = {"Idempotency-Key": f"leave-{token}"}
    async with http.stream("POST", f"{deployment.a}/v1/conversations", json=body, headers=key) as response:
        assert response.status_code == 201
        assert response.headers["content-type"].startswith("text/event-stream")
        conversation_id, turn_id = ids_of(response.headers["location"])
        async with reading(response) as reader:
            seen = await reader.until(lambda events: count(events, "llm.delta") >= 2)
    assert count(seen, "turn.completed") == 0, "the turn ended before the client could leave"
    async with http.stream("POST", f"{deployment.b}/v1/conversations", json=body, headers=key) as response:
        assert response.status_code == 201
        assert response.headers.get("idempotent-replayed") == "true"
        async with reading(response) as reader:
            retried = await reader.rest()
    turn = await wait_turn(http, deployment.b, conversation_id, turn_id)
    assert turn["status"] == "completed", turn
    assert turn["output"] == text
    stored = await stored_events(http, deployment.b, conversation_id)
    assert_one_end(stored, "turn.completed")
    assert [e["id"] for e in stored[: len(seen)]] == [e["data"]["id"] for e in seen]
    assert [e["data"]["id"] for e in retried] == [e["id"] for e in stored]
    assert "".join(e["data"]["text"] for e in stored if e["type"] == "llm.delta") == text
    assert plans.calls[token] == 1


async def test_stream_with_background_streams_and_outlives_the_client(
    deployment: Deployment, http: httpx.AsyncClient, plans: Plans
) -> None:
    """``stream`` + ``background``: the events stream (not a 202), the turn runs on a job worker,
    and it completes after the client went away. The same Idempotency-Key replays the stored
    events with the status of the first answer."""
    text = " ".join(["later"] * 40)
    token = plans.add(Reply(text=text, chunk_size=8, chunk_delay=0.04))
    body = {"input": f"{token} go", "stream": True, "background": True}
    key = {"Idempotency-Key": f"sb-{token}"}
    async with http.stream("POST", f"{deployment.a}/v1/conversations", json=body, headers=key) as response:
        assert response.status_code == 201
        assert response.headers["content-type"].startswith("text/event-stream")
        conversation_id, turn_id = ids_of(response.headers["location"])
        async with reading(response) as reader:
            seen = await reader.until(lambda events: count(events, "llm.delta") >= 1)
        row = await deployment.turn_row(turn_id)
    assert count(seen, "turn.completed") == 0, "the turn ended before the client could leave"
    assert row is not None
    assert row["lease_owner"] is not None
    assert int(row["lease_owner"].split(":")[1]) in [w.pid for w in deployment.workers]  # a sabre worker
    turn = await wait_turn(http, deployment.b, conversation_id, turn_id)
    assert turn["status"] == "completed", turn
    assert turn["output"] == text
    assert turn["background"] is True
    stored = await stored_events(http, deployment.b, conversation_id)
    assert_one_end(stored, "turn.completed")
    assert "".join(e["data"]["text"] for e in stored if e["type"] == "llm.delta") == text

    replay = await http.post(f"{deployment.b}/v1/conversations", json=body, headers=key)
    assert replay.headers.get("idempotent-replayed") == "true"
    assert replay.status_code == 201, replay.text
    assert replay.headers["content-type"].startswith("text/event-stream")
    assert [e["data"]["id"] for e in parse_sse(replay.text)] == [e["id"] for e in stored]
    assert plans.calls[token] == 1

    # On an existing conversation: 200, streamed, and the turn is a background one.
    token = plans.add("Again.")
    nxt = await http.post(
        f"{deployment.a}/v1/conversations/{conversation_id}/messages",
        json={"input": f"{token} more", "stream": True, "background": True},
    )
    assert nxt.status_code == 200, nxt.text
    events = parse_sse(nxt.text)
    assert events[-1]["event"] == "turn.completed"
    assert events[-1]["data"]["data"]["background"] is True
    assert events[-1]["data"]["data"]["output"] == "Again."


# -- 2: cancel across replicas ----------------------------------------------------------------------


async def cancel_within(
    http: httpx.AsyncClient, base: str, conversation_id: str, turn_id: str, *, seconds: float = 5.0
) -> dict[str, Any]:
    started = time.monotonic()
    response = await http.post(f"{base}/v1/conversations/{conversation_id}/turns/{turn_id}/cancel")
    took = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled", response.json()
    assert took < seconds, f"the cancel took {took:.1f} s"
    return dict(response.json())


async def held_file(data: Path, name: str, *, within: float = 20.0) -> tuple[Path, list[int]]:
    """The file a ``held_block`` opened, once it runs, and the processes holding it."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for path in _found(data, name):
            pids = holders(path)
            if pids:
                return path, pids
        await asyncio.sleep(0.05)
    raise AssertionError(f"the block never held {name}")


async def assert_block_gone(path: Path, pids: list[int]) -> None:
    """Nothing holds the block's file any more, and its processes are gone (not even zombies)."""
    deadline = time.monotonic() + 2
    while holders(path) or any(_state(pid) != "gone" for pid in pids):
        lingering = {pid: _state(pid) for pid in pids}
        assert time.monotonic() < deadline, f"the block's processes linger: {lingering}"
        await asyncio.sleep(0.05)


def _found(data: Path, name: str) -> list[Path]:
    return list(data.rglob(name))


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


async def test_cancel_through_b_reaches_a_model_call_on_a_and_a_block_on_a_worker(
    deployment: Deployment, http: httpx.AsyncClient, plans: Plans
) -> None:
    a, b = deployment.a, deployment.b
    # A streamed turn runs in A's process; it waits on a model that answers in 30 s.
    token = plans.add(Reply(text="too late", delay=30), "Next, please.")
    body = {"input": f"{token} think", "stream": True}
    async with http.stream("POST", f"{a}/v1/conversations", json=body) as response:
        conversation_id, turn_id = ids_of(response.headers["location"])
        async with reading(response) as reader:
            await reader.until(lambda events: count(events, "llm.started") == 1)
            await until(lambda: plans.calls[token] == 1, within=10, what="the model was called")
            cancelled = await cancel_within(http, b, conversation_id, turn_id)
            streamed = await reader.rest(within=5)  # A's stream ends with the end event
    assert streamed[-1]["event"] == "turn.cancelled"
    assert streamed[-1]["data"]["data"]["status"] == "cancelled"
    assert cancelled["turn_id"] == turn_id
    stored = await stored_events(http, a, conversation_id)
    assert_one_end(stored, "turn.cancelled")
    again = await http.post(f"{a}/v1/conversations/{conversation_id}/turns/{turn_id}/cancel")
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "cancelled"
    nxt = await http.post(
        f"{b}/v1/conversations/{conversation_id}/messages", json={"input": f"{token} go on"}
    )
    assert nxt.status_code == 200, nxt.text
    assert nxt.json()["output"] == "Next, please."

    # A background turn runs on a sabre worker, in a block that sleeps for 30 s.
    name = f"held-{secrets.token_hex(4)}.txt"
    token = plans.add(held_block(name), "Fresh start.")
    response = await http.post(f"{a}/v1/conversations", json={"input": f"{token} block", "background": True})
    assert response.status_code == 202, response.text
    conversation_id, turn_id = response.json()["conversation_id"], response.json()["turn_id"]
    path, pids = await held_file(deployment.data, name)
    row = await deployment.turn_row(turn_id)
    assert row is not None
    assert int(row["lease_owner"].split(":")[1]) in [w.pid for w in deployment.workers]
    # Cancelled on both replicas at once: both answer the one cancelled turn.
    both = await asyncio.gather(
        cancel_within(http, b, conversation_id, turn_id), cancel_within(http, a, conversation_id, turn_id)
    )
    assert both[0] == both[1]
    await assert_block_gone(path, pids)
    stored = await stored_events(http, b, conversation_id)
    assert_one_end(stored, "turn.cancelled")
    assert [e["type"] for e in stored][-2:] == ["block.completed", "turn.cancelled"]
    assert stored[-2]["data"]["status"] == "cancelled"
    nxt = await http.post(
        f"{b}/v1/conversations/{conversation_id}/messages", json={"input": f"{token} again"}
    )
    assert nxt.status_code == 200, nxt.text
    assert nxt.json()["output"] == "Fresh start."


async def test_cancel_without_redis_reaches_the_runner_through_the_store(
    postgres_url: str, model: ScriptedLLM, plans: Plans, tmp_path: Path
) -> None:
    """PostgreSQL without Redis: two apps that share nothing but the store. A turn streamed from A
    runs in A; B's cancel reaches it only through the turn's row, which A's runner polls."""
    settings = {"database_url": postgres_url, "openai_base_url": model.base_url, "data_dir": tmp_path}
    async with (
        in_process(_settings(**settings, worker_in_serve=False)) as a,
        in_process(_settings(**settings, worker_in_serve=False)) as b,
    ):
        for reply in (Reply(text="too late", delay=30), None):
            name = f"held-{secrets.token_hex(4)}.txt"
            token = plans.add(reply if reply is not None else held_block(name), "Next.")
            body = {"input": f"{token} go", "stream": True, "metadata": {"plan": token}}
            streamed = asyncio.ensure_future(a.post("/v1/conversations", json=body))

            async def listed(token: str = token) -> list[Any]:
                page = await b.get("/v1/conversations", params={"metadata[plan]": token})
                return list(page.json()["data"])

            await until(listed, within=10, what="the conversation was stored")
            conversation_id = (await listed())[0]["id"]
            turn_id = (await b.get(f"/v1/conversations/{conversation_id}/turns")).json()["data"][0]["turn_id"]
            if reply is not None:
                await until(lambda t=token: plans.calls[t] == 1, within=10, what="the model was called")
            else:
                path, pids = await held_file(tmp_path, name)
            await cancel_within(b, "", conversation_id, turn_id)
            if reply is None:
                await assert_block_gone(path, pids)
            events = parse_sse((await asyncio.wait_for(streamed, 10)).text)
            assert events[-1]["event"] == "turn.cancelled"
            assert_one_end(await stored_events(b, "", conversation_id), "turn.cancelled")
            nxt = await b.post(f"/v1/conversations/{conversation_id}/messages", json={"input": f"{token} on"})
            assert nxt.status_code == 200, nxt.text
            assert nxt.json()["output"] == "Next."


# -- 4: a stalled SSE consumer ----------------------------------------------------------------------

# An answer large enough that its events (each delta, then the whole output again in turn.completed)
# overflow the kernel's buffers of a connection whose reader takes nothing: then the server's writes
# to it really block.
BIG = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 60_000)[:3_000_000]


def stalled(base: str, request: str, body: bytes = b"") -> socket.socket:
    """A client that sends ``request`` and never reads (a tiny receive window, so it fills fast)."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(request.encode() + body)
    return sock


def unsent(server: str, client: socket.socket) -> int:
    """Bytes the server has written to ``client`` that it has not taken (/proc/net/tcp tx_queue)."""
    server_port = int(server.rsplit(":", 1)[1])
    client_port = client.getsockname()[1]
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)
        if (local, remote) == (server_port, client_port):
            return int(fields[4].split(":")[0], 16)
    return 0


def _seconds(turn: dict[str, Any]) -> float:
    created = datetime.fromisoformat(turn["created_at"])
    return (datetime.fromisoformat(turn["finished_at"]) - created).total_seconds()


async def test_a_stalled_sse_consumer_does_not_slow_the_turn(
    deployment: Deployment, http: httpx.AsyncClient, plans: Plans
) -> None:
    """A streamed POST whose client never reads, and a GET .../events?follow=true watcher that never
    reads, both on A, where the turn runs: the turn takes about as long as one read normally, and A
    answers /readyz at once meanwhile."""
    a = deployment.a
    reply = Reply(text=BIG, chunk_size=65_536, chunk_delay=0.02)

    token = plans.add(reply)
    started = time.monotonic()
    async with http.stream(
        "POST", f"{a}/v1/conversations", json={"input": f"{token} big", "stream": True}
    ) as r:
        normal = parse_sse((await r.aread()).decode())
    normal_wall = time.monotonic() - started
    assert normal[-1]["event"] == "turn.completed"
    baseline = _seconds(normal[-1]["data"]["data"])

    token = plans.add(reply)
    body = json.dumps({"input": f"{token} big", "stream": True, "metadata": {"plan": token}}).encode()
    auth = deployment.auth["Authorization"]
    post = stalled(
        a,
        f"POST /v1/conversations HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n",
        body,
    )
    watchers: list[socket.socket] = [post]
    try:

        async def listed() -> list[Any]:
            page = await http.get(f"{a}/v1/conversations", params={"metadata[plan]": token})
            return list(page.json()["data"])

        await until(listed, within=10, what="the conversation was stored")
        conversation_id = (await listed())[0]["id"]
        watchers.append(
            stalled(
                a,
                f"GET /v1/conversations/{conversation_id}/events?follow=true HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: {auth}\r\nAccept: text/event-stream\r\n\r\n",
            )
        )
        turn_id = (await http.get(f"{a}/v1/conversations/{conversation_id}/turns")).json()["data"][0][
            "turn_id"
        ]
        slowest_ready = 0.0
        while (turn := await wait_turn(http, a, conversation_id, turn_id, within=0))[
            "status"
        ] not in TERMINAL:
            ready_started = time.monotonic()
            assert (await http.get(f"{a}/readyz")).status_code == 200
            slowest_ready = max(slowest_ready, time.monotonic() - ready_started)
            assert time.monotonic() - started < normal_wall + 30, "the turn did not end"
            await asyncio.sleep(0.1)
        assert turn["status"] == "completed", turn
        with_stalled = _seconds(turn)
        # Both consumers really are stuck: the server holds bytes it cannot hand them.
        await until(lambda: all(unsent(a, w) > 0 for w in watchers), within=5, what="the consumers stalled")
        assert with_stalled < baseline * 2 + 2, (baseline, with_stalled)
        assert slowest_ready < 2, slowest_ready
        stored = await stored_events(http, a, conversation_id)
        assert_one_end(stored, "turn.completed")
        ready_started = time.monotonic()
        assert (await http.get(f"{a}/readyz")).status_code == 200
        assert time.monotonic() - ready_started < 2
    finally:
        for watcher in watchers:
            watcher.close()


# -- 5: tenants -------------------------------------------------------------------------------------


def assert_not_found(response: httpx.Response, *, like: httpx.Response) -> None:
    """A 404 that says no more than ``like``, the answer for ids that never existed."""
    body = assert_problem(response, 404, "not_found")
    reference = assert_problem(like, 404, "not_found")
    assert set(body) == set(reference)
    assert re.sub(r"(conv|turn)_\w+", "ID", str(body["detail"])) == re.sub(
        r"(conv|turn)_\w+", "ID", str(reference["detail"])
    )


async def test_another_tenants_ids_are_404_and_change_nothing(target: Target, plans: Plans) -> None:
    """Tenant two probes tenant one's running turn on every new endpoint (and the SSE form of the
    events): 404 as for ids that never existed, and the turn runs on. A turn id used under another
    conversation of the same tenant is 404 too, and unknown as a cursor."""
    a, b, one, two = target.a, target.b, target.auth, target.other
    token = plans.add(Reply(text="slow", delay=20))
    running = await a.post(
        "/v1/conversations", json={"input": f"{token} hi", "background": True}, headers=one
    )
    assert running.status_code == 202, running.text
    x, tx = running.json()["conversation_id"], running.json()["turn_id"]
    token = plans.add("mine", "theirs")
    y = (await a.post("/v1/conversations", json={"input": f"{token} y"}, headers=one)).json()
    z = (await a.post("/v1/conversations", json={"input": f"{token} z"}, headers=two)).json()
    assert y["status"] == z["status"] == "completed", (y, z)
    y_id, z_id = y["conversation_id"], z["conversation_id"]
    sse = {"Accept": "text/event-stream"}
    nope_conv, nope_turn = "conv_" + "0" * 27, "turn_" + "0" * 27

    async def probe(method: str, path: str, headers: dict[str, str], **params: Any) -> httpx.Response:
        return await b.request(method, path, headers=headers, params=params)

    # Another tenant's conversation: as if it did not exist.
    for suffix, method, extra in (
        ("/events", "GET", {}),
        ("/events", "GET", sse),
        ("/events", "GET", {**sse, "Last-Event-ID": "1"}),
        ("/turns", "GET", {}),
        (f"/turns/{tx}", "GET", {}),
        (f"/turns/{tx}/cancel", "POST", {}),
    ):
        theirs = await probe(method, f"/v1/conversations/{x}{suffix}", {**two, **extra})
        never = await probe(
            method, f"/v1/conversations/{nope_conv}{suffix.replace(tx, nope_turn)}", {**two, **extra}
        )
        assert_not_found(theirs, like=never)
    # Their own conversation with the other tenant's turn id; and the same tenant across conversations.
    for conversation, auth in ((z_id, two), (y_id, one)):
        for suffix, method in ((f"/turns/{tx}", "GET"), (f"/turns/{tx}/cancel", "POST")):
            crossed = await probe(method, f"/v1/conversations/{conversation}{suffix}", auth)
            never = await probe(
                method, f"/v1/conversations/{conversation}{suffix.replace(tx, nope_turn)}", auth
            )
            assert_not_found(crossed, like=never)
        cursor = await probe("GET", f"/v1/conversations/{conversation}/turns", auth, before=tx)
        unknown = await probe("GET", f"/v1/conversations/{conversation}/turns", auth, before=nope_turn)
        assert assert_problem(cursor, 422, unknown.json()["code"])["detail"] == unknown.json()[
            "detail"
        ].replace(nope_turn, tx)
    # Nothing of that touched the turn: it still runs, no cancel was recorded, and its owner stops it.
    turn = (await a.get(f"/v1/conversations/{x}/turns/{tx}", headers=one)).json()
    assert turn["status"] in ("queued", "running"), turn
    assert turn["cancel_requested"] is False
    cancelled = await b.post(f"/v1/conversations/{x}/turns/{tx}/cancel", headers=one)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"


# -- 7: hostile parameters --------------------------------------------------------------------------


async def test_hostile_parameters_are_clear_4xx(target: Target, plans: Plans) -> None:
    a, auth = target.a, target.auth
    token = plans.add("fine")
    turn = (await a.post("/v1/conversations", json={"input": f"{token} hi"}, headers=auth)).json()
    conversation, turn_id = turn["conversation_id"], turn["turn_id"]
    events = f"/v1/conversations/{conversation}/events"
    last = (await a.get(events, headers=auth)).json()["data"][-1]["seq"]
    sse = {**auth, "Accept": "text/event-stream"}

    async def expect(status: int, method: str, path: str, *, headers: Any = None, **params: Any) -> None:
        response = await a.request(method, path, headers=headers or auth, params=params)
        assert response.status_code == status, (path, params, headers, response.status_code, response.text)
        assert response.headers["content-type"].startswith("application/problem+json"), response.text
        problem = response.json()
        assert problem["status"] == status
        assert problem["code"]
        assert problem["detail"]
        assert "Traceback" not in response.text

    last_event_ids: list[tuple[int, bytes]] = [
        (400, b"abc"),
        (400, b"-1"),
        (400, b""),
        (400, b"1.5"),
        (400, b"0x10"),
        (400, b"1e3"),
        (400, b"+1"),
        (400, b"99999999999999999999"),  # 20 digits: past any seq
        (422, b"9" * 21),  # longer than an id can be
        (400, "²".encode("latin-1")),  # a digit to str.isdigit, not to int()
        (400, "¹²³".encode("latin-1")),
        (400, "١٢".encode()),  # Arabic-Indic digits, sent as UTF-8
        (400, "１".encode()),  # noqa: RUF001 - a fullwidth digit
        (400, b"1\t2"),
        (404, str(last + 1).encode()),  # a future event
    ]
    for status, value in last_event_ids:
        await expect(status, "GET", events, headers={**sse, "Last-Event-ID": value})
    if target.name == "sqlite":  # over ASGI the value arrives as sent (an HTTP parser strips it)
        await expect(400, "GET", events, headers={**sse, "Last-Event-ID": b"   "})
        # Whitespace around a good id is fine: the replay after it.
        padded = await a.get(events, headers={**sse, "Last-Event-ID": f" {last - 1} "})
        assert padded.status_code == 200, padded.text
        assert [int(e["id"]) for e in parse_sse(padded.text)] == [last]
    for params in (
        {"after": -1},
        {"after": 10**20},
        {"after": "abc"},
        {"after": "1.5"},
        {"after": " "},
        {"limit": 0},
        {"limit": 501},
        {"limit": -1},
        {"limit": 10**30},
        {"follow": "maybe"},
    ):
        await expect(422, "GET", events, **params)
    await expect(404, "GET", events, after=last + 1)
    turns = f"/v1/conversations/{conversation}/turns"
    await expect(422, "GET", turns, before="turn_" + "f" * 27)
    await expect(422, "GET", turns, before="x" * 65)
    await expect(422, "GET", turns, before="")
    await expect(422, "GET", turns, limit=0)
    await expect(422, "GET", turns, limit=101)
    for wait in ("-1", "31", "nan", "inf", "-inf", "abc", "1e400", ""):
        await expect(422, "POST", f"{turns}/{turn_id}/cancel", wait=wait)
    await expect(409, "POST", f"{turns}/{turn_id}/cancel", wait="0")  # a finished turn
    await expect(422, "GET", f"{turns}/{'t' * 65}")
    await expect(404, "GET", f"{turns}/..%2F..%2F{turn_id}")
    await expect(404, "POST", f"{turns}/turn_nope/cancel", wait="0")


# -- 8: follow=true across turns --------------------------------------------------------------------


async def test_follow_stays_open_across_turns(
    deployment: Deployment, http: httpx.AsyncClient, plans: Plans
) -> None:
    """A watcher on B with ``follow=true`` sees two later turns run on A and on B, each event once
    and in order, and its stream is still open after both."""
    a, b = deployment.a, deployment.b
    token = plans.add("first", Reply(text="second answer", chunk_delay=0.02), "third answer")
    first = (await http.post(f"{a}/v1/conversations", json={"input": f"{token} one"})).json()
    conversation_id = first["conversation_id"]
    before = await stored_events(http, a, conversation_id)
    url = f"{b}/v1/conversations/{conversation_id}/events"
    headers = {"Accept": "text/event-stream", "Last-Event-ID": str(before[-1]["seq"])}
    async with http.stream("GET", url, params={"follow": "true"}, headers=headers) as response:
        assert response.status_code == 200
        async with reading(response) as reader:
            assert await reader.quiet_for(0.3), "the stream ended or replayed what was before Last-Event-ID"
            for server, word, output in ((a, "two", "second answer"), (b, "three", "third answer")):
                done = await http.post(
                    f"{server}/v1/conversations/{conversation_id}/messages", json={"input": f"{token} {word}"}
                )
                assert done.json()["output"] == output, done.text
            seen = await reader.until(lambda events: count(events, "turn.completed") == 2, within=10)
            assert await reader.quiet_for(0.5), "the stream closed after the turns"
    stored = await stored_events(http, a, conversation_id)
    assert [int(e["id"]) for e in seen] == [e["seq"] for e in stored[len(before) :]]
    assert [e["data"]["id"] for e in seen] == [e["id"] for e in stored[len(before) :]]
    assert [e["event"] for e in seen].count("turn.started") == 2


# -- 1: a worker killed mid-turn --------------------------------------------------------------------


async def test_a_frozen_worker_that_wakes_up_changes_nothing(
    deployment: Deployment, http: httpx.AsyncClient, plans: Plans
) -> None:
    """The worker running a background turn is frozen (SIGSTOP: a paused VM, a GC pause) past its
    lease; the other worker takes the turn over and completes it. When the frozen one wakes up and
    gets its model's answer, its outcome is discarded: still one end event, one answer, version 1."""
    token = plans.add(Reply(text="from the frozen worker", delay=1), "From the live worker.")
    response = await http.post(
        f"{deployment.a}/v1/conversations", json={"input": f"{token} freeze", "background": True}
    )
    conversation_id, turn_id = response.json()["conversation_id"], response.json()["turn_id"]
    await until(lambda: plans.calls[token] == 1, within=15, what="a worker called the model")
    row = await deployment.turn_row(turn_id)
    assert row is not None
    frozen = next(w for w in deployment.workers if w.pid == int(row["lease_owner"].split(":")[1]))
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        turn = await wait_turn(http, deployment.b, conversation_id, turn_id, within=30)
        assert turn["status"] == "completed", f"{turn}{deployment.log_tail()}"
        assert turn["output"] == "From the live worker."
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    log = deployment.logs / f"worker-{deployment.workers.index(frozen) + 1}.log"
    await until(
        lambda: any("stored_turn_discarded" in line and turn_id in line for line in _lines(log)),
        within=15,
        what="the woken worker discarded its outcome",
    )
    await asyncio.sleep(0.2)
    crashed = [line for line in _lines(log) if "stored_turn_crashed" in line and turn_id in line]
    assert not crashed, crashed  # a discarded outcome is no crash (nor a failed job)
    assert plans.calls[token] == 2
    events = await stored_events(http, deployment.b, conversation_id)
    assert_one_end(events, "turn.completed")
    assert events[-1]["data"]["output"] == "From the live worker."
    messages = (await http.get(f"{deployment.b}/v1/conversations/{conversation_id}/messages")).json()["data"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[1]["parts"][0]["text"] == "From the live worker."
    conversation = (await http.get(f"{deployment.b}/v1/conversations/{conversation_id}")).json()
    assert conversation["version"] == 1
    # The woken worker is well, and the conversation takes the next message.
    assert frozen.poll() is None
    token = plans.add("Still fine.")
    nxt = await http.post(
        f"{deployment.a}/v1/conversations/{conversation_id}/messages", json={"input": f"{token} next"}
    )
    assert nxt.status_code == 200, nxt.text
    assert nxt.json()["output"] == "Still fine."


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


async def test_a_turn_whose_worker_is_killed_finishes_once_on_another(
    deployment: Deployment, http: httpx.AsyncClient, plans: Plans
) -> None:
    """The worker running a background turn is SIGKILLed while the model thinks; once its lease
    lapses the other worker runs the turn again (procrastinate's stalled-job retry or the recovery
    sweep, whichever comes first): one end event, one answer, one version, within bounded time.
    (Last in the module: it leaves one worker.)"""
    token = plans.add(Reply(text="never delivered", delay=30), "Recovered answer.")
    response = await http.post(
        f"{deployment.a}/v1/conversations", json={"input": f"{token} long job", "background": True}
    )
    assert response.status_code == 202, response.text
    conversation_id, turn_id = response.json()["conversation_id"], response.json()["turn_id"]
    await until(lambda: plans.calls[token] == 1, within=15, what="a worker called the model")
    row = await deployment.turn_row(turn_id)
    assert row is not None
    assert row["status"] == "running", row
    assert row["lease_owner"], row
    pid = int(row["lease_owner"].split(":")[1])
    victim = next(w for w in deployment.workers if w.pid == pid)
    survivor = next(w for w in deployment.workers if w.pid != pid and w.poll() is None)
    killed_at = time.monotonic()
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)

    turn = await wait_turn(http, deployment.b, conversation_id, turn_id, within=35)
    took = time.monotonic() - killed_at
    assert turn["status"] == "completed", f"{turn}{deployment.log_tail()}"
    assert turn["output"] == "Recovered answer."
    assert took < 35, took
    assert plans.calls[token] == 2
    # Nothing runs it a third time (a stalled job retried late, a sweep): give them a moment.
    await asyncio.sleep(1.5)
    assert plans.calls[token] == 2
    events = await stored_events(http, deployment.b, conversation_id)
    assert_one_end(events, "turn.completed")
    assert events[-1]["data"]["output"] == "Recovered answer."
    messages = (await http.get(f"{deployment.b}/v1/conversations/{conversation_id}/messages")).json()["data"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    conversation = (await http.get(f"{deployment.b}/v1/conversations/{conversation_id}")).json()
    assert conversation["version"] == 1
    assert conversation["status"] == "idle"
    assert conversation["usage"]["llm_calls"] == 1  # the dead worker's call was never accounted
    assert survivor.poll() is None
    print(f"the turn finished {took:.1f} s after its worker was killed")


async def test_a_streamed_turn_whose_server_is_killed_finishes_on_a_worker(
    deployment: Deployment, http: httpx.AsyncClient, plans: Plans
) -> None:
    """A streamed turn runs in the serving process (B); B is SIGKILLed while the model thinks. No
    job stands for that turn: the recovery sweep finds its lapsed lease and hands it to a worker,
    which completes it once. (Last in the module: it leaves A and one worker.)"""
    token = plans.add(Reply(text="never delivered", delay=30), "Finished elsewhere.")
    body = {"input": f"{token} stream", "stream": True}
    async with http.stream("POST", f"{deployment.b}/v1/conversations", json=body) as response:
        conversation_id, turn_id = ids_of(response.headers["location"])
        await until(lambda: plans.calls[token] == 1, within=15, what="B called the model")
        row = await deployment.turn_row(turn_id)
        assert row is not None
        assert int(row["lease_owner"].split(":")[1]) == deployment.servers[1].pid
        killed_at = time.monotonic()
        os.killpg(deployment.servers[1].pid, signal.SIGKILL)
        deployment.servers[1].wait(timeout=10)
    turn = await wait_turn(http, deployment.a, conversation_id, turn_id, within=30)
    took = time.monotonic() - killed_at
    assert turn["status"] == "completed", f"{turn}{deployment.log_tail()}"
    assert turn["output"] == "Finished elsewhere."
    assert plans.calls[token] == 2
    events = await stored_events(http, deployment.a, conversation_id)
    assert_one_end(events, "turn.completed")
    conversation = (await http.get(f"{deployment.a}/v1/conversations/{conversation_id}")).json()
    assert conversation["version"] == 1
    print(f"the streamed turn finished {took:.1f} s after its server was killed")
