from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.message_list import MessageList
from ...models.problem import Problem
from ...types import UNSET, Response, Unset


def _get_kwargs(
    conversation_id: str,
    *,
    after: int | Unset = -1,
    limit: int | Unset = 100,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    params["after"] = after

    params["limit"] = limit

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/conversations/{conversation_id}/messages".format(
            conversation_id=quote(str(conversation_id), safe=""),
        ),
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> MessageList | Problem | None:
    if response.status_code == 200:
        response_200 = MessageList.from_dict(response.json())

        return response_200

    if response.status_code == 401:
        response_401 = Problem.from_dict(response.json())

        return response_401

    if response.status_code == 404:
        response_404 = Problem.from_dict(response.json())

        return response_404

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
) -> Response[MessageList | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    conversation_id: str,
    *,
    client: AuthenticatedClient,
    after: int | Unset = -1,
    limit: int | Unset = 100,
) -> Response[MessageList | Problem]:
    """List Messages

     The transcript, oldest first, paginated by `seq`.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        after (int | Unset): Return messages with seq greater than this. Default: -1.
        limit (int | Unset):  Default: 100.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[MessageList | Problem]
    """

    kwargs = _get_kwargs(
        conversation_id=conversation_id,
        after=after,
        limit=limit,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    conversation_id: str,
    *,
    client: AuthenticatedClient,
    after: int | Unset = -1,
    limit: int | Unset = 100,
) -> MessageList | Problem | None:
    """List Messages

     The transcript, oldest first, paginated by `seq`.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        after (int | Unset): Return messages with seq greater than this. Default: -1.
        limit (int | Unset):  Default: 100.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        MessageList | Problem
    """

    return sync_detailed(
        conversation_id=conversation_id,
        client=client,
        after=after,
        limit=limit,
    ).parsed


async def asyncio_detailed(
    conversation_id: str,
    *,
    client: AuthenticatedClient,
    after: int | Unset = -1,
    limit: int | Unset = 100,
) -> Response[MessageList | Problem]:
    """List Messages

     The transcript, oldest first, paginated by `seq`.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        after (int | Unset): Return messages with seq greater than this. Default: -1.
        limit (int | Unset):  Default: 100.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[MessageList | Problem]
    """

    kwargs = _get_kwargs(
        conversation_id=conversation_id,
        after=after,
        limit=limit,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    conversation_id: str,
    *,
    client: AuthenticatedClient,
    after: int | Unset = -1,
    limit: int | Unset = 100,
) -> MessageList | Problem | None:
    """List Messages

     The transcript, oldest first, paginated by `seq`.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        after (int | Unset): Return messages with seq greater than this. Default: -1.
        limit (int | Unset):  Default: 100.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        MessageList | Problem
    """

    return (
        await asyncio_detailed(
            conversation_id=conversation_id,
            client=client,
            after=after,
            limit=limit,
        )
    ).parsed
