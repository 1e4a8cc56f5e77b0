"""The auth dependency: every endpoint that touches tenant data takes a ``Tenant``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.auth.service import LOCAL_TENANT, Authenticator
from app.kit.db import Session
from app.kit.errors import Unauthorized

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")


async def get_tenant(
    request: Request,
    session: Session,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The tenant of the request's key; ``local`` when no keys exist and we listen on loopback."""
    auth: Authenticator = request.app.state.authenticator
    if credentials is None:
        if request.headers.get("authorization"):
            raise Unauthorized("Use the Bearer scheme: `Authorization: Bearer <key>`.")
        if auth.open_mode:
            return LOCAL_TENANT
        raise Unauthorized("Send an API key as `Authorization: Bearer <key>`.")
    tenant = await auth.tenant_for(session, credentials.credentials)
    if tenant is None:
        raise Unauthorized("The API key is not valid.")
    return tenant


Tenant = Annotated[str, Depends(get_tenant)]
