from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.problem import Problem
from ...models.turn_out import TurnOut
from ...types import Response


def _get_kwargs(
    conversation_id: str,
    turn_id: str,
) -> dict[str, Any]:

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/conversations/{conversation_id}/turns/{turn_id}".format(
            conversation_id=quote(str(conversation_id), safe=""),
            turn_id=quote(str(turn_id), safe=""),
        ),
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Problem | TurnOut | None:
    if response.status_code == 200:
        response_200 = TurnOut.from_dict(response.json())

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
) -> Response[Problem | TurnOut]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    conversation_id: str,
    turn_id: str,
    *,
    client: AuthenticatedClient,
) -> Response[Problem | TurnOut]:
    """Get Turn

     One turn: queued, running, or how it ended.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        turn_id (str): A turn id (`turn_…`).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Problem | TurnOut]
    """

    kwargs = _get_kwargs(
        conversation_id=conversation_id,
        turn_id=turn_id,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    conversation_id: str,
    turn_id: str,
    *,
    client: AuthenticatedClient,
) -> Problem | TurnOut | None:
    """Get Turn

     One turn: queued, running, or how it ended.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        turn_id (str): A turn id (`turn_…`).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Problem | TurnOut
    """

    return sync_detailed(
        conversation_id=conversation_id,
        turn_id=turn_id,
        client=client,
    ).parsed


async def asyncio_detailed(
    conversation_id: str,
    turn_id: str,
    *,
    client: AuthenticatedClient,
) -> Response[Problem | TurnOut]:
    """Get Turn

     One turn: queued, running, or how it ended.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        turn_id (str): A turn id (`turn_…`).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Problem | TurnOut]
    """

    kwargs = _get_kwargs(
        conversation_id=conversation_id,
        turn_id=turn_id,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    conversation_id: str,
    turn_id: str,
    *,
    client: AuthenticatedClient,
) -> Problem | TurnOut | None:
    """Get Turn

     One turn: queued, running, or how it ended.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        turn_id (str): A turn id (`turn_…`).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Problem | TurnOut
    """

    return (
        await asyncio_detailed(
            conversation_id=conversation_id,
            turn_id=turn_id,
            client=client,
        )
    ).parsed
