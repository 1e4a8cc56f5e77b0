from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.conversation_out import ConversationOut
from ...models.patch_conversation import PatchConversation
from ...models.problem import Problem
from ...types import UNSET, Response, Unset


def _get_kwargs(
    conversation_id: str,
    *,
    body: PatchConversation,
    if_match: str | Unset = UNSET,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if not isinstance(if_match, Unset):
        headers["If-Match"] = if_match

    _kwargs: dict[str, Any] = {
        "method": "patch",
        "url": "/v1/conversations/{conversation_id}".format(
            conversation_id=quote(str(conversation_id), safe=""),
        ),
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ConversationOut | Problem | None:
    if response.status_code == 200:
        response_200 = ConversationOut.from_dict(response.json())

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

    if response.status_code == 412:
        response_412 = Problem.from_dict(response.json())

        return response_412

    if response.status_code == 413:
        response_413 = Problem.from_dict(response.json())

        return response_413

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
) -> Response[ConversationOut | Problem]:
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
    body: PatchConversation,
    if_match: str | Unset = UNSET,
) -> Response[ConversationOut | Problem]:
    """Patch Conversation

     Update the conversation's metadata as a JSON merge patch (RFC 7396; `application/json` or
    `application/merge-patch+json`): named keys are set, keys set to `null` removed, others kept.
    The version does not change (it counts turns, and a running turn is not disturbed);
    `If-Match: <version>` applies the patch only at that version (412 otherwise).

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        if_match (str | Unset): Run only if the conversation is at this version (its `ETag`,
            `"3"`); 412 otherwise.
        body (PatchConversation): Change a conversation's metadata, as a JSON merge patch (RFC
            7396) of the stored object.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ConversationOut | Problem]
    """

    kwargs = _get_kwargs(
        conversation_id=conversation_id,
        body=body,
        if_match=if_match,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    conversation_id: str,
    *,
    client: AuthenticatedClient,
    body: PatchConversation,
    if_match: str | Unset = UNSET,
) -> ConversationOut | Problem | None:
    """Patch Conversation

     Update the conversation's metadata as a JSON merge patch (RFC 7396; `application/json` or
    `application/merge-patch+json`): named keys are set, keys set to `null` removed, others kept.
    The version does not change (it counts turns, and a running turn is not disturbed);
    `If-Match: <version>` applies the patch only at that version (412 otherwise).

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        if_match (str | Unset): Run only if the conversation is at this version (its `ETag`,
            `"3"`); 412 otherwise.
        body (PatchConversation): Change a conversation's metadata, as a JSON merge patch (RFC
            7396) of the stored object.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ConversationOut | Problem
    """

    return sync_detailed(
        conversation_id=conversation_id,
        client=client,
        body=body,
        if_match=if_match,
    ).parsed


async def asyncio_detailed(
    conversation_id: str,
    *,
    client: AuthenticatedClient,
    body: PatchConversation,
    if_match: str | Unset = UNSET,
) -> Response[ConversationOut | Problem]:
    """Patch Conversation

     Update the conversation's metadata as a JSON merge patch (RFC 7396; `application/json` or
    `application/merge-patch+json`): named keys are set, keys set to `null` removed, others kept.
    The version does not change (it counts turns, and a running turn is not disturbed);
    `If-Match: <version>` applies the patch only at that version (412 otherwise).

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        if_match (str | Unset): Run only if the conversation is at this version (its `ETag`,
            `"3"`); 412 otherwise.
        body (PatchConversation): Change a conversation's metadata, as a JSON merge patch (RFC
            7396) of the stored object.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ConversationOut | Problem]
    """

    kwargs = _get_kwargs(
        conversation_id=conversation_id,
        body=body,
        if_match=if_match,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    conversation_id: str,
    *,
    client: AuthenticatedClient,
    body: PatchConversation,
    if_match: str | Unset = UNSET,
) -> ConversationOut | Problem | None:
    """Patch Conversation

     Update the conversation's metadata as a JSON merge patch (RFC 7396; `application/json` or
    `application/merge-patch+json`): named keys are set, keys set to `null` removed, others kept.
    The version does not change (it counts turns, and a running turn is not disturbed);
    `If-Match: <version>` applies the patch only at that version (412 otherwise).

    Args:
        conversation_id (str): A conversation id (`conv_…`).
        if_match (str | Unset): Run only if the conversation is at this version (its `ETag`,
            `"3"`); 412 otherwise.
        body (PatchConversation): Change a conversation's metadata, as a JSON merge patch (RFC
            7396) of the stored object.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ConversationOut | Problem
    """

    return (
        await asyncio_detailed(
            conversation_id=conversation_id,
            client=client,
            body=body,
            if_match=if_match,
        )
    ).parsed
