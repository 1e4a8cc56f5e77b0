"""SABRE's Python SDK: ``Sabre`` / ``AsyncSabre`` over the generated ``sabre_api`` package.

from sabre_client import Sabre
with Sabre("http://127.0.0.1:8011", api_key="sk-…") as sabre:
    turn = sabre.create_conversation("What is 2**100?")
    for event in sabre.stream_message(turn.conversation_id, "And 2**200?"):
        ...
"""

from sabre_api import models

from sabre_client.client import AsyncSabre, Sabre
from sabre_client.errors import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    ConnectionFailed,
    EventTooLarge,
    GoneError,
    InternalServerError,
    NotFoundError,
    PayloadTooLargeError,
    PreconditionFailedError,
    RateLimitError,
    SabreError,
    ServiceUnavailableError,
    StreamInterrupted,
    UnprocessableError,
    error_for,
    unwrap,
)
from sabre_client.streaming import END_TYPES, MAX_EVENT_BYTES, AsyncTurnStream, TurnStream

__all__ = [
    "END_TYPES",
    "MAX_EVENT_BYTES",
    "ApiError",
    "AsyncSabre",
    "AsyncTurnStream",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "ConnectionFailed",
    "EventTooLarge",
    "GoneError",
    "InternalServerError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PreconditionFailedError",
    "RateLimitError",
    "Sabre",
    "SabreError",
    "ServiceUnavailableError",
    "StreamInterrupted",
    "TurnStream",
    "UnprocessableError",
    "error_for",
    "models",
    "unwrap",
]
