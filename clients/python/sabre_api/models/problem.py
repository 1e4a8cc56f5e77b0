from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.problem_current_type_0 import ProblemCurrentType0
    from ..models.problem_errors_type_0_item import ProblemErrorsType0Item


T = TypeVar("T", bound="Problem")


@_attrs_define
class Problem:
    """The problem+json body every error response carries (RFC 9457); ``code`` is stable, for programs.

    Attributes:
        code (str):
        detail (str):
        status (int):
        title (str):
        type_ (str):
        current (None | ProblemCurrentType0 | Unset):
        errors (list[ProblemErrorsType0Item] | None | Unset):
        expected_tool_call_ids (list[str] | None | Unset):
        instance (None | str | Unset):
    """

    code: str
    detail: str
    status: int
    title: str
    type_: str
    current: None | ProblemCurrentType0 | Unset = UNSET
    errors: list[ProblemErrorsType0Item] | None | Unset = UNSET
    expected_tool_call_ids: list[str] | None | Unset = UNSET
    instance: None | str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.problem_current_type_0 import ProblemCurrentType0

        code = self.code

        detail = self.detail

        status = self.status

        title = self.title

        type_ = self.type_

        current: dict[str, Any] | None | Unset
        if isinstance(self.current, Unset):
            current = UNSET
        elif isinstance(self.current, ProblemCurrentType0):
            current = self.current.to_dict()
        else:
            current = self.current

        errors: list[dict[str, Any]] | None | Unset
        if isinstance(self.errors, Unset):
            errors = UNSET
        elif isinstance(self.errors, list):
            errors = []
            for errors_type_0_item_data in self.errors:
                errors_type_0_item = errors_type_0_item_data.to_dict()
                errors.append(errors_type_0_item)

        else:
            errors = self.errors

        expected_tool_call_ids: list[str] | None | Unset
        if isinstance(self.expected_tool_call_ids, Unset):
            expected_tool_call_ids = UNSET
        elif isinstance(self.expected_tool_call_ids, list):
            expected_tool_call_ids = self.expected_tool_call_ids

        else:
            expected_tool_call_ids = self.expected_tool_call_ids

        instance: None | str | Unset
        if isinstance(self.instance, Unset):
            instance = UNSET
        else:
            instance = self.instance

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "code": code,
                "detail": detail,
                "status": status,
                "title": title,
                "type": type_,
            }
        )
        if current is not UNSET:
            field_dict["current"] = current
        if errors is not UNSET:
            field_dict["errors"] = errors
        if expected_tool_call_ids is not UNSET:
            field_dict["expected_tool_call_ids"] = expected_tool_call_ids
        if instance is not UNSET:
            field_dict["instance"] = instance

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.problem_current_type_0 import ProblemCurrentType0
        from ..models.problem_errors_type_0_item import ProblemErrorsType0Item

        d = dict(src_dict)
        code = d.pop("code")

        detail = d.pop("detail")

        status = d.pop("status")

        title = d.pop("title")

        type_ = d.pop("type")

        def _parse_current(data: object) -> None | ProblemCurrentType0 | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                current_type_0 = ProblemCurrentType0.from_dict(data)

                return current_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | ProblemCurrentType0 | Unset, data)

        current = _parse_current(d.pop("current", UNSET))

        def _parse_errors(data: object) -> list[ProblemErrorsType0Item] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                errors_type_0 = []
                _errors_type_0 = data
                for errors_type_0_item_data in _errors_type_0:
                    errors_type_0_item = ProblemErrorsType0Item.from_dict(
                        errors_type_0_item_data
                    )

                    errors_type_0.append(errors_type_0_item)

                return errors_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[ProblemErrorsType0Item] | None | Unset, data)

        errors = _parse_errors(d.pop("errors", UNSET))

        def _parse_expected_tool_call_ids(data: object) -> list[str] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                expected_tool_call_ids_type_0 = cast(list[str], data)

                return expected_tool_call_ids_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[str] | None | Unset, data)

        expected_tool_call_ids = _parse_expected_tool_call_ids(
            d.pop("expected_tool_call_ids", UNSET)
        )

        def _parse_instance(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        instance = _parse_instance(d.pop("instance", UNSET))

        problem = cls(
            code=code,
            detail=detail,
            status=status,
            title=title,
            type_=type_,
            current=current,
            errors=errors,
            expected_tool_call_ids=expected_tool_call_ids,
            instance=instance,
        )

        problem.additional_properties = d
        return problem

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
