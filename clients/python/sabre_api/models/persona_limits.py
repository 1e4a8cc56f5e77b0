from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="PersonaLimits")


@_attrs_define
class PersonaLimits:
    """Per-block sandbox limits; `null` means the service's default (`SABRE_BLOCK_<NAME>`).

    Attributes:
        cpu_seconds (float | None):
        disk_files (int | None):
        disk_mb (int | None):
        file_size_mb (int | None):
        max_processes (int | None):
        memory_mb (int | None):
        open_files (int | None):
        snapshot_bytes (int | None):
        stdout_bytes (int | None):
        wall_clock_seconds (float | None):
    """

    cpu_seconds: float | None
    disk_files: int | None
    disk_mb: int | None
    file_size_mb: int | None
    max_processes: int | None
    memory_mb: int | None
    open_files: int | None
    snapshot_bytes: int | None
    stdout_bytes: int | None
    wall_clock_seconds: float | None
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        cpu_seconds: float | None
        cpu_seconds = self.cpu_seconds

        disk_files: int | None
        disk_files = self.disk_files

        disk_mb: int | None
        disk_mb = self.disk_mb

        file_size_mb: int | None
        file_size_mb = self.file_size_mb

        max_processes: int | None
        max_processes = self.max_processes

        memory_mb: int | None
        memory_mb = self.memory_mb

        open_files: int | None
        open_files = self.open_files

        snapshot_bytes: int | None
        snapshot_bytes = self.snapshot_bytes

        stdout_bytes: int | None
        stdout_bytes = self.stdout_bytes

        wall_clock_seconds: float | None
        wall_clock_seconds = self.wall_clock_seconds

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "cpu_seconds": cpu_seconds,
                "disk_files": disk_files,
                "disk_mb": disk_mb,
                "file_size_mb": file_size_mb,
                "max_processes": max_processes,
                "memory_mb": memory_mb,
                "open_files": open_files,
                "snapshot_bytes": snapshot_bytes,
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

        def _parse_disk_files(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        disk_files = _parse_disk_files(d.pop("disk_files"))

        def _parse_disk_mb(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        disk_mb = _parse_disk_mb(d.pop("disk_mb"))

        def _parse_file_size_mb(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        file_size_mb = _parse_file_size_mb(d.pop("file_size_mb"))

        def _parse_max_processes(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        max_processes = _parse_max_processes(d.pop("max_processes"))

        def _parse_memory_mb(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        memory_mb = _parse_memory_mb(d.pop("memory_mb"))

        def _parse_open_files(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        open_files = _parse_open_files(d.pop("open_files"))

        def _parse_snapshot_bytes(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        snapshot_bytes = _parse_snapshot_bytes(d.pop("snapshot_bytes"))

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
            disk_files=disk_files,
            disk_mb=disk_mb,
            file_size_mb=file_size_mb,
            max_processes=max_processes,
            memory_mb=memory_mb,
            open_files=open_files,
            snapshot_bytes=snapshot_bytes,
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
