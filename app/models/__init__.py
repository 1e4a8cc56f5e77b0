"""ORM tables, one file each; importing this package registers them all on ``Base.metadata``."""

from app.models.api_key import ApiKey
from app.models.chat_link import ChatLink
from app.models.conversation import Conversation
from app.models.event import Event
from app.models.file import StoredFile
from app.models.idempotency import IdempotencyRecord
from app.models.message import Message
from app.models.server_secret import ServerSecret
from app.models.turn import Turn

__all__ = [
    "ApiKey",
    "ChatLink",
    "Conversation",
    "Event",
    "IdempotencyRecord",
    "Message",
    "ServerSecret",
    "StoredFile",
    "Turn",
]
