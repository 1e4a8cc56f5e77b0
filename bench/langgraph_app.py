"""The LangGraph build of the DESIGN §9 workload: what a user would write instead of SABRE (issue 12).

FastAPI + LangGraph + its PostgreSQL checkpointer, written the way LangGraph's docs suggest: a
``StateGraph`` over messages with an ``agent`` node (a ``langchain-openai`` chat model with the tool
bound) and a ``tools`` node for the external tool, which pauses the run with ``interrupt()`` and
returns the caller's results as tool messages when the run is resumed with ``Command(resume=...)``.
State lives in ``AsyncPostgresSaver`` over one psycopg pool per process, opened by the lifespan.

HTTP, shaped like SABRE's so the bench drives both alike:
``POST /conversations`` ``{"input": str}`` and ``POST /conversations/{id}/tool-results``
``{"results": [{"tool_call_id": str, "output": any}]}`` both answer ``{"conversation_id", "status":
"awaiting_tool_results" | "completed", "pending_tool_calls": [{"id", "name", "arguments"}], "output"}``;
``GET /readyz`` answers once the checkpointer's tables exist.

Environment: ``LANGGRAPH_DATABASE_URL`` (``postgresql://...``), ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
``LANGGRAPH_MODEL`` (default ``scripted-model``). Served by ``bench/service_bench.py`` as
``python -m uvicorn bench.langgraph_app:app``; needs the ``bench`` dependency group
(``uv run --group bench ...``).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, HTTPException, Request
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command, interrupt
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

SETUP_LOCK = 0x1A6C  # an arbitrary advisory lock key
SYSTEM = "You are a support agent. Use the tools to look up orders, then answer briefly."
GET_ORDER_DETAILS: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_order_details",
        "description": "Get the status of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}


class StartIn(BaseModel):
    input: str = Field(min_length=1, max_length=100_000)


class ToolResult(BaseModel):
    tool_call_id: str = Field(min_length=1, max_length=200)
    output: Any


class ToolResultsIn(BaseModel):
    results: list[ToolResult] = Field(min_length=1, max_length=64)


class PendingCall(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any]


class TurnOut(BaseModel):
    conversation_id: str
    status: Literal["awaiting_tool_results", "completed"]
    pending_tool_calls: list[PendingCall] = Field(default_factory=list)
    output: str | None = None


def build_graph(model: ChatOpenAI) -> StateGraph[MessagesState]:
    """agent → (tool calls?) → tools (interrupts for the caller's results) → agent → answer."""
    llm = model.bind_tools([GET_ORDER_DETAILS])

    async def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        reply = await llm.ainvoke([SystemMessage(SYSTEM), *state["messages"]])
        return {"messages": [reply]}

    def tools(state: MessagesState) -> dict[str, list[AnyMessage]]:
        calls = state["messages"][-1].tool_calls  # type: ignore[union-attr]
        pending: list[dict[str, Any]] = [
            {"id": c["id"], "name": c["name"], "arguments": c["args"]} for c in calls
        ]
        results: dict[str, Any] = interrupt(pending)  # the caller's results, by call id
        return {
            "messages": [ToolMessage(json.dumps(results[p["id"]]), tool_call_id=p["id"]) for p in pending]
        }

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "agent")
    return graph


async def _take_setup_lock(connection: AsyncConnection[Any]) -> None:
    """Take the setup lock by polling: a statement waiting in pg_advisory_lock holds a snapshot,
    and setup()'s CREATE INDEX CONCURRENTLY in the process holding the lock waits for every
    such snapshot to end (a deadlock PostgreSQL does not detect)."""
    for _ in range(1200):  # 60 s
        cursor = await connection.execute("SELECT pg_try_advisory_lock(%s) AS taken", (SETUP_LOCK,))
        row = await cursor.fetchone()  # a dict: the pool's row factory
        if row is not None and row["taken"]:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("another server process held the LangGraph setup lock for 60 s")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """One connection pool and one compiled graph per process."""
    async with AsyncConnectionPool(
        os.environ["LANGGRAPH_DATABASE_URL"],
        max_size=10,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    ) as pool:
        checkpointer = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        # setup() migrates; with several server processes, one at a time.
        async with pool.connection() as connection:
            await _take_setup_lock(connection)
            try:
                await checkpointer.setup()
            finally:
                await connection.execute("SELECT pg_advisory_unlock(%s)", (SETUP_LOCK,))
        model = ChatOpenAI(
            model=os.environ.get("LANGGRAPH_MODEL", "scripted-model"),
            base_url=os.environ.get("OPENAI_BASE_URL"),
            api_key=os.environ.get("OPENAI_API_KEY"),
            use_responses_api=False,
        )
        app.state.graph = build_graph(model).compile(checkpointer=checkpointer)
        yield


app = FastAPI(title="langgraph peer", lifespan=lifespan)


async def run_turn(graph: CompiledStateGraph[Any], conversation_id: str, value: Any) -> TurnOut:
    """Run the graph on the thread until it ends or interrupts, and say which."""
    config: RunnableConfig = {"configurable": {"thread_id": conversation_id}}
    result = await graph.ainvoke(value, config, version="v2")
    if result.interrupts:
        pending = [PendingCall(**call) for call in result.interrupts[0].value]
        return TurnOut(
            conversation_id=conversation_id, status="awaiting_tool_results", pending_tool_calls=pending
        )
    answer = result.value["messages"][-1]
    return TurnOut(conversation_id=conversation_id, status="completed", output=answer.text)


@app.get("/readyz")
async def readyz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/conversations", response_model=TurnOut)
async def start(body: StartIn, request: Request) -> TurnOut:
    """Start a conversation: the model's first reply either answers or asks for the external tool."""
    return await run_turn(request.app.state.graph, uuid.uuid4().hex, {"messages": [HumanMessage(body.input)]})


@app.post("/conversations/{conversation_id}/tool-results", response_model=TurnOut)
async def tool_results(conversation_id: str, body: ToolResultsIn, request: Request) -> TurnOut:
    """Resume the paused run with the caller's results, one for each pending call (as SABRE checks)."""
    graph: CompiledStateGraph[Any] = request.app.state.graph
    snapshot = await graph.aget_state({"configurable": {"thread_id": conversation_id}})
    if not snapshot.values:
        raise HTTPException(404, "no such conversation")
    pending = {call["id"] for paused in snapshot.interrupts for call in paused.value}
    if not pending:
        raise HTTPException(409, "the conversation is not waiting for tool results")
    results = {r.tool_call_id: r.output for r in body.results}
    if len(results) != len(body.results) or results.keys() != pending:
        raise HTTPException(422, "give exactly one result for each pending tool call")
    return await run_turn(graph, conversation_id, Command(resume=results))
