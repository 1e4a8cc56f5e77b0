from http import HTTPStatus
from typing import Any

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.chat_completion import ChatCompletion
from ...models.chat_completion_request import ChatCompletionRequest
from ...models.problem import Problem
from ...types import UNSET, Response, Unset


def _get_kwargs(
    *,
    body: ChatCompletionRequest,
    idempotency_key: str | Unset = UNSET,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if not isinstance(idempotency_key, Unset):
        headers["Idempotency-Key"] = idempotency_key

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/chat/completions",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ChatCompletion | Problem | None:
    if response.status_code == 200:
        response_200 = ChatCompletion.from_dict(response.json())

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

    if response.status_code == 409:
        response_409 = Problem.from_dict(response.json())

        return response_409

    if response.status_code == 410:
        response_410 = Problem.from_dict(response.json())

        return response_410

    if response.status_code == 413:
        response_413 = Problem.from_dict(response.json())

        return response_413

    if response.status_code == 422:
        response_422 = Problem.from_dict(response.json())

        return response_422

    if response.status_code == 429:
        response_429 = Problem.from_dict(response.json())

        return response_429

    if response.status_code == 502:
        response_502 = Problem.from_dict(response.json())

        return response_502

    if response.status_code == 503:
        response_503 = Problem.from_dict(response.json())

        return response_503

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[ChatCompletion | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    body: ChatCompletionRequest,
    idempotency_key: str | Unset = UNSET,
) -> Response[ChatCompletion | Problem]:
    """Create Chat Completion

     Run the persona named by `model` on the dialogue in `messages`, with `tools` as the caller's
    tools. The answer is the turn's output (`finish_reason: stop`) or the calls it waits on
    (`tool_calls`, several when the code made them at once). Send the whole dialogue each time: a
    history SABRE answered continues its conversation (the `Sabre-Conversation-Id` header names it),
    any other history starts a new one seeded with it.

    Args:
        idempotency_key (str | Unset): Retry-safe writes: the same key and body return the stored
            response.
        body (ChatCompletionRequest): ``POST /v1/chat/completions``: the whole dialogue, as Chat
            Completions clients send it.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ChatCompletion | Problem]
    """

    kwargs = _get_kwargs(
        body=body,
        idempotency_key=idempotency_key,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient,
    body: ChatCompletionRequest,
    idempotency_key: str | Unset = UNSET,
) -> ChatCompletion | Problem | None:
    """Create Chat Completion

     Run the persona named by `model` on the dialogue in `messages`, with `tools` as the caller's
    tools. The answer is the turn's output (`finish_reason: stop`) or the calls it waits on
    (`tool_calls`, several when the code made them at once). Send the whole dialogue each time: a
    history SABRE answered continues its conversation (the `Sabre-Conversation-Id` header names it),
    any other history starts a new one seeded with it.

    Args:
        idempotency_key (str | Unset): Retry-safe writes: the same key and body return the stored
            response.
        body (ChatCompletionRequest): ``POST /v1/chat/completions``: the whole dialogue, as Chat
            Completions clients send it.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ChatCompletion | Problem
    """

    return sync_detailed(
        client=client,
        body=body,
        idempotency_key=idempotency_key,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    body: ChatCompletionRequest,
    idempotency_key: str | Unset = UNSET,
) -> Response[ChatCompletion | Problem]:
    """Create Chat Completion

     Run the persona named by `model` on the dialogue in `messages`, with `tools` as the caller's
    tools. The answer is the turn's output (`finish_reason: stop`) or the calls it waits on
    (`tool_calls`, several when the code made them at once). Send the whole dialogue each time: a
    history SABRE answered continues its conversation (the `Sabre-Conversation-Id` header names it),
    any other history starts a new one seeded with it.

    Args:
        idempotency_key (str | Unset): Retry-safe writes: the same key and body return the stored
            response.
        body (ChatCompletionRequest): ``POST /v1/chat/completions``: the whole dialogue, as Chat
            Completions clients send it.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ChatCompletion | Problem]
    """

    kwargs = _get_kwargs(
        body=body,
        idempotency_key=idempotency_key,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    body: ChatCompletionRequest,
    idempotency_key: str | Unset = UNSET,
) -> ChatCompletion | Problem | None:
    """Create Chat Completion

     Run the persona named by `model` on the dialogue in `messages`, with `tools` as the caller's
    tools. The answer is the turn's output (`finish_reason: stop`) or the calls it waits on
    (`tool_calls`, several when the code made them at once). Send the whole dialogue each time: a
    history SABRE answered continues its conversation (the `Sabre-Conversation-Id` header names it),
    any other history starts a new one seeded with it.

    Args:
        idempotency_key (str | Unset): Retry-safe writes: the same key and body return the stored
            response.
        body (ChatCompletionRequest): ``POST /v1/chat/completions``: the whole dialogue, as Chat
            Completions clients send it.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ChatCompletion | Problem
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
            idempotency_key=idempotency_key,
        )
    ).parsed
