from http import HTTPStatus
from typing import Any

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.conversation_list import ConversationList
from ...models.conversations_list_metadata import ConversationsListMetadata
from ...models.conversations_list_status import (
    ConversationsListStatus,
)
from ...models.problem import Problem
from ...types import UNSET, Response, Unset


def _get_kwargs(
    *,
    status: ConversationsListStatus | Unset = UNSET,
    persona: str | Unset = UNSET,
    after: str | Unset = UNSET,
    limit: int | Unset = 20,
    metadata: ConversationsListMetadata | Unset = UNSET,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    json_status: str | Unset = UNSET
    if not isinstance(status, Unset):
        json_status = status

    params["status"] = json_status

    params["persona"] = persona

    params["after"] = after

    params["limit"] = limit

    json_metadata: dict[str, Any] | Unset = UNSET
    if not isinstance(metadata, Unset):
        json_metadata = metadata.to_dict()
    if not isinstance(json_metadata, Unset):
        params.update(json_metadata)

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/conversations",
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ConversationList | Problem | None:
    if response.status_code == 200:
        response_200 = ConversationList.from_dict(response.json())

        return response_200

    if response.status_code == 401:
        response_401 = Problem.from_dict(response.json())

        return response_401

    if response.status_code == 422:
        response_422 = Problem.from_dict(response.json())

        return response_422

    if response.status_code == 429:
        response_429 = Problem.from_dict(response.json())

        return response_429

    if response.status_code == 503:
        response_503 = Problem.from_dict(response.json())

        return response_503

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[ConversationList | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    status: ConversationsListStatus | Unset = UNSET,
    persona: str | Unset = UNSET,
    after: str | Unset = UNSET,
    limit: int | Unset = 20,
    metadata: ConversationsListMetadata | Unset = UNSET,
) -> Response[ConversationList | Problem]:
    """List Conversations

     The tenant's conversations, newest first, in pages that hold still while conversations are
    created between them (the cursor is a position, not an offset). A malformed cursor is a 422
    `invalid_cursor`.

    Args:
        status (ConversationsListStatus | Unset): `idle` or `awaiting_tool_results`: the state
            stored between turns (a conversation whose turn is running is listed under the state it
            started from, and shows `running`). `running` is a 422: it is a lease lock, not a stored
            state.
        persona (str | Unset): Persona name.
        after (str | Unset): `next_after` of the previous page (an opaque cursor).
        limit (int | Unset): Page size. Default: 20.
        metadata (ConversationsListMetadata | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ConversationList | Problem]
    """

    kwargs = _get_kwargs(
        status=status,
        persona=persona,
        after=after,
        limit=limit,
        metadata=metadata,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient,
    status: ConversationsListStatus | Unset = UNSET,
    persona: str | Unset = UNSET,
    after: str | Unset = UNSET,
    limit: int | Unset = 20,
    metadata: ConversationsListMetadata | Unset = UNSET,
) -> ConversationList | Problem | None:
    """List Conversations

     The tenant's conversations, newest first, in pages that hold still while conversations are
    created between them (the cursor is a position, not an offset). A malformed cursor is a 422
    `invalid_cursor`.

    Args:
        status (ConversationsListStatus | Unset): `idle` or `awaiting_tool_results`: the state
            stored between turns (a conversation whose turn is running is listed under the state it
            started from, and shows `running`). `running` is a 422: it is a lease lock, not a stored
            state.
        persona (str | Unset): Persona name.
        after (str | Unset): `next_after` of the previous page (an opaque cursor).
        limit (int | Unset): Page size. Default: 20.
        metadata (ConversationsListMetadata | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ConversationList | Problem
    """

    return sync_detailed(
        client=client,
        status=status,
        persona=persona,
        after=after,
        limit=limit,
        metadata=metadata,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    status: ConversationsListStatus | Unset = UNSET,
    persona: str | Unset = UNSET,
    after: str | Unset = UNSET,
    limit: int | Unset = 20,
    metadata: ConversationsListMetadata | Unset = UNSET,
) -> Response[ConversationList | Problem]:
    """List Conversations

     The tenant's conversations, newest first, in pages that hold still while conversations are
    created between them (the cursor is a position, not an offset). A malformed cursor is a 422
    `invalid_cursor`.

    Args:
        status (ConversationsListStatus | Unset): `idle` or `awaiting_tool_results`: the state
            stored between turns (a conversation whose turn is running is listed under the state it
            started from, and shows `running`). `running` is a 422: it is a lease lock, not a stored
            state.
        persona (str | Unset): Persona name.
        after (str | Unset): `next_after` of the previous page (an opaque cursor).
        limit (int | Unset): Page size. Default: 20.
        metadata (ConversationsListMetadata | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ConversationList | Problem]
    """

    kwargs = _get_kwargs(
        status=status,
        persona=persona,
        after=after,
        limit=limit,
        metadata=metadata,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    status: ConversationsListStatus | Unset = UNSET,
    persona: str | Unset = UNSET,
    after: str | Unset = UNSET,
    limit: int | Unset = 20,
    metadata: ConversationsListMetadata | Unset = UNSET,
) -> ConversationList | Problem | None:
    """List Conversations

     The tenant's conversations, newest first, in pages that hold still while conversations are
    created between them (the cursor is a position, not an offset). A malformed cursor is a 422
    `invalid_cursor`.

    Args:
        status (ConversationsListStatus | Unset): `idle` or `awaiting_tool_results`: the state
            stored between turns (a conversation whose turn is running is listed under the state it
            started from, and shows `running`). `running` is a 422: it is a lease lock, not a stored
            state.
        persona (str | Unset): Persona name.
        after (str | Unset): `next_after` of the previous page (an opaque cursor).
        limit (int | Unset): Page size. Default: 20.
        metadata (ConversationsListMetadata | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ConversationList | Problem
    """

    return (
        await asyncio_detailed(
            client=client,
            status=status,
            persona=persona,
            after=after,
            limit=limit,
            metadata=metadata,
        )
    ).parsed
