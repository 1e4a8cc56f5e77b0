from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.patch_conversation_metadata import PatchConversationMetadata


T = TypeVar("T", bound="PatchConversation")


@_attrs_define
class PatchConversation:
    """Change a conversation's metadata, as a JSON merge patch (RFC 7396) of the stored object.

    Attributes:
        metadata (PatchConversationMetadata): Merged into the stored metadata: a key with a value sets it (same limits
            as at creation), a key with `null` removes it, keys not named are kept. At most 64 keys may remain. The
            conversation's version does not change.
    """

    metadata: PatchConversationMetadata

    def to_dict(self) -> dict[str, Any]:
        metadata = self.metadata.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "metadata": metadata,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.patch_conversation_metadata import PatchConversationMetadata

        d = dict(src_dict)
        metadata = PatchConversationMetadata.from_dict(d.pop("metadata"))

        patch_conversation = cls(
            metadata=metadata,
        )

        return patch_conversation
