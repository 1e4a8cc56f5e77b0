"""The auth dependency: every endpoint that touches tenant data takes a ``Tenant``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth.limits import TenantLimiter
from app.auth.service import LOCAL_TENANT, Authenticator
from app.kit.db import Session, autocommit_unit
from app.kit.errors import Unauthorized

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")


def _keyless_tenant(request: Request) -> str:
    """The tenant of a request without a Bearer key: ``local`` in open mode, else 401."""
    auth: Authenticator = request.app.state.authenticator
    if request.headers.get("authorization"):
        raise Unauthorized("Use the Bearer scheme: `Authorization: Bearer <key>`.")
    if not auth.open_mode:
        raise Unauthorized("Send an API key as `Authorization: Bearer <key>`.")
    return LOCAL_TENANT


async def _key_tenant(
    request: Request, session: AsyncSession, credentials: HTTPAuthorizationCredentials | None
) -> str:
    """The tenant of the request's key (``local`` in open mode); 401 without a valid one."""
    if credentials is None:
        return _keyless_tenant(request)
    auth: Authenticator = request.app.state.authenticator
    found = await auth.tenant_for(session, credentials.credentials)
    if found is None:
        raise Unauthorized("The API key is not valid.")
    return found


async def check_key_before_body(request: Request) -> None:
    """The key check of ``get_tenant``, made before the request's body is read (``StrictJSONRoute``
    calls it for a route with a body that takes a ``Tenant``): parsing and checking a body of the
    size limit holds the event loop for seconds, which a caller without a valid key must not get.
    The tenant found is kept for ``get_tenant`` (one key lookup per request); the rate limit stays
    there. Only a stored key is read from the store, in a unit of its own."""
    credentials = await _bearer(request)
    auth: Authenticator = request.app.state.authenticator
    if credentials is None:
        tenant = _keyless_tenant(request)
    elif (configured := auth.static_tenant(credentials.credentials)) is not None:
        tenant = configured
    else:
        sessionmaker: async_sessionmaker[AsyncSession] = request.app.state.sessionmaker
        async with sessionmaker() as session:
            await autocommit_unit(session)  # one read: no BEGIN and ROLLBACK around it
            tenant = await _key_tenant(request, session, credentials)
    request.state.key_tenant = tenant


async def get_tenant(
    request: Request,
    session: Session,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The tenant of the request's key (``local`` when no keys exist and we listen on loopback),
    once its rate limit lets the request through: a refused request has done nothing yet."""
    checked: str | None = getattr(request.state, "key_tenant", None)
    tenant = checked if checked is not None else await _key_tenant(request, session, credentials)
    request.state.tenant = tenant  # for the access log
    limiter: TenantLimiter = request.app.state.limiter
    await limiter.check_request(tenant)
    return tenant


Tenant = Annotated[str, Depends(get_tenant)]
