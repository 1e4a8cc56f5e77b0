"""``GET /v1/files/{id}``: files turns produced (matplotlib figures), to their tenant only."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Response

from app.auth.dependencies import Tenant
from app.files.repository import FileRepository
from app.kit.db import Session
from app.kit.errors import NotFound
from app.kit.openapi import problem_responses
from app.kit.routing import api_router

router = api_router(prefix="/v1/files", tags=["files"])


@router.get(
    "/{file_id}",
    response_class=Response,
    responses={
        200: {
            "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}},
            "description": "The file's bytes (a PNG figure).",
        },
        **problem_responses(404),
    },
)
async def get_file(
    file_id: Annotated[str, Path(max_length=64, description="A file id (`file_…`).")],
    tenant: Tenant,
    session: Session,
) -> Response:
    """The bytes of a file a turn produced."""
    stored = await FileRepository(session).get(tenant=tenant, file_id=file_id)
    if stored is None:
        raise NotFound(f"No file {file_id!r}.")
    return Response(
        content=stored.data,
        media_type=stored.content_type,
        headers={
            "Cache-Control": "private, max-age=31536000, immutable",
            "X-Content-Type-Options": "nosniff",
        },
    )
