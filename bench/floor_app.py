"""The floor of DESIGN §9: a minimal FastAPI app doing one PostgreSQL transaction per request.

``POST /items`` inserts a row and returns it (one transaction, SQLAlchemy async over asyncpg, the
same database stack SABRE uses); ``GET /readyz`` answers once the table exists. The database comes
from ``FLOOR_DATABASE_URL`` (``postgresql://...``). Served by ``bench/service_bench.py`` as
``python -m uvicorn bench.floor_app:app --port P``, in its own process.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS floor_items (
    id BIGSERIAL PRIMARY KEY,
    conversation TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""
INSERT = text(
    "INSERT INTO floor_items (conversation, body) VALUES (:conversation, :body) "
    "RETURNING id, conversation, body, created_at"
)


class ItemIn(BaseModel):
    conversation: str
    body: str


class ItemOut(BaseModel):
    id: int
    conversation: str
    body: str
    created_at: str


def _async_url(url: str) -> str:
    if url.startswith(("postgres://", "postgresql://")):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    return url


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    engine = create_async_engine(_async_url(os.environ["FLOOR_DATABASE_URL"]), pool_size=10)
    async with engine.begin() as connection:
        await connection.execute(text(CREATE_TABLE))
    app.state.engine = engine
    try:
        yield
    finally:
        await engine.dispose()


app = FastAPI(title="floor", lifespan=lifespan)


@app.get("/readyz")
async def readyz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/items", response_model=ItemOut)
async def create_item(item: ItemIn, request: Request) -> Any:
    async with request.app.state.engine.begin() as connection:
        row = (await connection.execute(INSERT, item.model_dump())).one()
    return ItemOut(
        id=row.id, conversation=row.conversation, body=row.body, created_at=row.created_at.isoformat()
    )
