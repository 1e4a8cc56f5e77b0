"""The auth dependency: every endpoint that touches tenant data takes a ``Tenant``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.auth.limits import TenantLimiter
from app.auth.service import LOCAL_TENANT, Authenticator
from app.kit.db import Session
from app.kit.errors import Unauthorized

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")


async def get_tenant(
    request: Request,
    session: Session,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The tenant of the request's key (``local`` when no keys exist and we listen on loopback),
    once its rate limit lets the request through: a refused request has done nothing yet."""
    auth: Authenticator = request.app.state.authenticator
    if credentials is None:
        if request.headers.get("authorization"):
            raise Unauthorized("Use the Bearer scheme: `Authorization: Bearer <key>`.")
        if not auth.open_mode:
            raise Unauthorized("Send an API key as `Authorization: Bearer <key>`.")
        tenant = LOCAL_TENANT
    else:
        found = await auth.tenant_for(session, credentials.credentials)
        if found is None:
            raise Unauthorized("The API key is not valid.")
        tenant = found
    request.state.tenant = tenant  # for the access log
    limiter: TenantLimiter = request.app.state.limiter
    await limiter.check_request(tenant)
    return tenant


Tenant = Annotated[str, Depends(get_tenant)]
