from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="PersonaLimits")


@_attrs_define
class PersonaLimits:
    """Per-block sandbox limits; `null` means the service's default.

    Attributes:
        cpu_seconds (float | None):
        memory_mb (int | None):
        stdout_bytes (int | None):
        wall_clock_seconds (float | None):
    """

    cpu_seconds: float | None
    memory_mb: int | None
    stdout_bytes: int | None
    wall_clock_seconds: float | None
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        cpu_seconds: float | None
        cpu_seconds = self.cpu_seconds

        memory_mb: int | None
        memory_mb = self.memory_mb

        stdout_bytes: int | None
        stdout_bytes = self.stdout_bytes

        wall_clock_seconds: float | None
        wall_clock_seconds = self.wall_clock_seconds

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "cpu_seconds": cpu_seconds,
                "memory_mb": memory_mb,
                "stdout_bytes": stdout_bytes,
                "wall_clock_seconds": wall_clock_seconds,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)

        def _parse_cpu_seconds(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        cpu_seconds = _parse_cpu_seconds(d.pop("cpu_seconds"))

        def _parse_memory_mb(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        memory_mb = _parse_memory_mb(d.pop("memory_mb"))

        def _parse_stdout_bytes(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        stdout_bytes = _parse_stdout_bytes(d.pop("stdout_bytes"))

        def _parse_wall_clock_seconds(data: object) -> float | None:
            if data is None:
                return data
            return cast(float | None, data)

        wall_clock_seconds = _parse_wall_clock_seconds(d.pop("wall_clock_seconds"))

        persona_limits = cls(
            cpu_seconds=cpu_seconds,
            memory_mb=memory_mb,
            stdout_bytes=stdout_bytes,
            wall_clock_seconds=wall_clock_seconds,
        )

        persona_limits.additional_properties = d
        return persona_limits

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
