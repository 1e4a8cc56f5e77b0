from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.problem import Problem
from ...models.turn_out import TurnOut
from ...types import UNSET, Response, Unset


def _get_kwargs(
    conversation_id: str,
    turn_id: str,
    *,
    wait: float | Unset = 10.0,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    params["wait"] = wait

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/conversations/{conversation_id}/turns/{turn_id}/cancel".format(
            conversation_id=quote(str(conversation_id), safe=""),
            turn_id=quote(str(turn_id), safe=""),
        ),
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Problem | TurnOut | None:
    if response.status_code == 200:
        response_200 = TurnOut.from_dict(response.json())

        return response_200

    if response.status_code == 202:
        response_202 = TurnOut.from_dict(response.json())

        return response_202

    if response.status_code == 401:
        response_401 = Problem.from_dict(response.json())

        return response_401

    if response.status_code == 404:
        response_404 = Problem.from_dict(response.json())

        return response_404

    if response.status_code == 409:
        response_409 = Problem.from_dict(response.json())

        return response_409

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
    wait: float | Unset = 10.0,
) -> Response[Problem | TurnOut]:
    """Cancel Turn

     Stop a queued or running turn wherever it runs: the model call is abandoned, the block is
    killed, and the turn ends ``cancelled`` with what it had done so far stored. 200 with the
    cancelled turn (again on a repeated cancel), 202 if it has not stopped within ``wait`` seconds,
    409 if it had already ended otherwise.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        turn_id (str): A turn id (`turn_…`).
        wait (float | Unset): Seconds to wait for the turn to stop. Default: 10.0.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Problem | TurnOut]
    """

    kwargs = _get_kwargs(
        conversation_id=conversation_id,
        turn_id=turn_id,
        wait=wait,
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
    wait: float | Unset = 10.0,
) -> Problem | TurnOut | None:
    """Cancel Turn

     Stop a queued or running turn wherever it runs: the model call is abandoned, the block is
    killed, and the turn ends ``cancelled`` with what it had done so far stored. 200 with the
    cancelled turn (again on a repeated cancel), 202 if it has not stopped within ``wait`` seconds,
    409 if it had already ended otherwise.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        turn_id (str): A turn id (`turn_…`).
        wait (float | Unset): Seconds to wait for the turn to stop. Default: 10.0.

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
        wait=wait,
    ).parsed


async def asyncio_detailed(
    conversation_id: str,
    turn_id: str,
    *,
    client: AuthenticatedClient,
    wait: float | Unset = 10.0,
) -> Response[Problem | TurnOut]:
    """Cancel Turn

     Stop a queued or running turn wherever it runs: the model call is abandoned, the block is
    killed, and the turn ends ``cancelled`` with what it had done so far stored. 200 with the
    cancelled turn (again on a repeated cancel), 202 if it has not stopped within ``wait`` seconds,
    409 if it had already ended otherwise.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        turn_id (str): A turn id (`turn_…`).
        wait (float | Unset): Seconds to wait for the turn to stop. Default: 10.0.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Problem | TurnOut]
    """

    kwargs = _get_kwargs(
        conversation_id=conversation_id,
        turn_id=turn_id,
        wait=wait,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    conversation_id: str,
    turn_id: str,
    *,
    client: AuthenticatedClient,
    wait: float | Unset = 10.0,
) -> Problem | TurnOut | None:
    """Cancel Turn

     Stop a queued or running turn wherever it runs: the model call is abandoned, the block is
    killed, and the turn ends ``cancelled`` with what it had done so far stored. 200 with the
    cancelled turn (again on a repeated cancel), 202 if it has not stopped within ``wait`` seconds,
    409 if it had already ended otherwise.

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        turn_id (str): A turn id (`turn_…`).
        wait (float | Unset): Seconds to wait for the turn to stop. Default: 10.0.

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
            wait=wait,
        )
    ).parsed
