from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.event_list import EventList
from ...models.problem import Problem
from ...types import UNSET, Response, Unset


def _get_kwargs(
    conversation_id: str,
    *,
    after: int | Unset = 0,
    limit: int | Unset = 100,
    follow: bool | Unset = False,
    last_event_id: str | Unset = UNSET,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if not isinstance(last_event_id, Unset):
        headers["Last-Event-ID"] = last_event_id

    params: dict[str, Any] = {}

    params["after"] = after

    params["limit"] = limit

    params["follow"] = follow

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/conversations/{conversation_id}/events".format(
            conversation_id=quote(str(conversation_id), safe=""),
        ),
        "params": params,
    }

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> EventList | Problem | None:
    if response.status_code == 200:
        response_200 = EventList.from_dict(response.json())

        return response_200

    if response.status_code == 400:
        response_400 = Problem.from_dict(response.json())

        return response_400

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
) -> Response[EventList | Problem]:
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
    after: int | Unset = 0,
    limit: int | Unset = 100,
    follow: bool | Unset = False,
    last_event_id: str | Unset = UNSET,
) -> Response[EventList | Problem]:
    """List Events

     The conversation's events in order. As JSON, one page after ``after``; as SSE
    (``Accept: text/event-stream``), what is stored after ``Last-Event-ID`` (or ``after``), then the
    running turn live until its end event (``follow=true``: every later turn too).

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        after (int | Unset): Events with seq greater than this. Default: 0.
        limit (int | Unset):  Default: 100.
        follow (bool | Unset): SSE: stay open across turns (heartbeat every 15 s). Default: False.
        last_event_id (str | Unset): SSE: resume after this event (the `id:` of the last one
            received).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EventList | Problem]
    """

    kwargs = _get_kwargs(
        conversation_id=conversation_id,
        after=after,
        limit=limit,
        follow=follow,
        last_event_id=last_event_id,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    conversation_id: str,
    *,
    client: AuthenticatedClient,
    after: int | Unset = 0,
    limit: int | Unset = 100,
    follow: bool | Unset = False,
    last_event_id: str | Unset = UNSET,
) -> EventList | Problem | None:
    """List Events

     The conversation's events in order. As JSON, one page after ``after``; as SSE
    (``Accept: text/event-stream``), what is stored after ``Last-Event-ID`` (or ``after``), then the
    running turn live until its end event (``follow=true``: every later turn too).

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        after (int | Unset): Events with seq greater than this. Default: 0.
        limit (int | Unset):  Default: 100.
        follow (bool | Unset): SSE: stay open across turns (heartbeat every 15 s). Default: False.
        last_event_id (str | Unset): SSE: resume after this event (the `id:` of the last one
            received).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EventList | Problem
    """

    return sync_detailed(
        conversation_id=conversation_id,
        client=client,
        after=after,
        limit=limit,
        follow=follow,
        last_event_id=last_event_id,
    ).parsed


async def asyncio_detailed(
    conversation_id: str,
    *,
    client: AuthenticatedClient,
    after: int | Unset = 0,
    limit: int | Unset = 100,
    follow: bool | Unset = False,
    last_event_id: str | Unset = UNSET,
) -> Response[EventList | Problem]:
    """List Events

     The conversation's events in order. As JSON, one page after ``after``; as SSE
    (``Accept: text/event-stream``), what is stored after ``Last-Event-ID`` (or ``after``), then the
    running turn live until its end event (``follow=true``: every later turn too).

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        after (int | Unset): Events with seq greater than this. Default: 0.
        limit (int | Unset):  Default: 100.
        follow (bool | Unset): SSE: stay open across turns (heartbeat every 15 s). Default: False.
        last_event_id (str | Unset): SSE: resume after this event (the `id:` of the last one
            received).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EventList | Problem]
    """

    kwargs = _get_kwargs(
        conversation_id=conversation_id,
        after=after,
        limit=limit,
        follow=follow,
        last_event_id=last_event_id,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    conversation_id: str,
    *,
    client: AuthenticatedClient,
    after: int | Unset = 0,
    limit: int | Unset = 100,
    follow: bool | Unset = False,
    last_event_id: str | Unset = UNSET,
) -> EventList | Problem | None:
    """List Events

     The conversation's events in order. As JSON, one page after ``after``; as SSE
    (``Accept: text/event-stream``), what is stored after ``Last-Event-ID`` (or ``after``), then the
    running turn live until its end event (``follow=true``: every later turn too).

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        after (int | Unset): Events with seq greater than this. Default: 0.
        limit (int | Unset):  Default: 100.
        follow (bool | Unset): SSE: stay open across turns (heartbeat every 15 s). Default: False.
        last_event_id (str | Unset): SSE: resume after this event (the `id:` of the last one
            received).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EventList | Problem
    """

    return (
        await asyncio_detailed(
            conversation_id=conversation_id,
            client=client,
            after=after,
            limit=limit,
            follow=follow,
            last_event_id=last_event_id,
        )
    ).parsed
