"""Config errors as one readable message: stack file, key path, offending value, what would work."""

from __future__ import annotations

import difflib
import json
import types
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

_MISSING = object()
PROJECT_NAMESPACE = "vllm-platform"


class ConfigProblem(ValueError):
    """Raised by validators for a problem at a key below the model being validated.

    `at` is the key path relative to that model (e.g. ("models", 2, "gpu_group")), so a validator
    that crosses fields still points the user at the exact key to change.
    """

    def __init__(self, message: str, *, at: tuple[str | int, ...] = (), value: Any = _MISSING) -> None:
        super().__init__(message)
        self.message = message
        self.at = at
        self.value = value


@dataclass(frozen=True)
class Problem:
    path: tuple[str | int, ...]
    value: Any
    message: str

    def key_path(self) -> str:
        text = ""
        for part in self.path:
            text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
        return f"{PROJECT_NAMESPACE}:{text}" if text else PROJECT_NAMESPACE


class ConfigError(Exception):
    """An invalid stack config. `str()` is the whole user-facing message."""

    def __init__(self, stack_file: str, problems: list[Problem]) -> None:
        self.stack_file = stack_file
        self.problems = problems
        super().__init__(self.render())

    def render(self) -> str:
        count = len(self.problems)
        lines = [f"{self.stack_file}: invalid config ({count} problem{'s' if count != 1 else ''})"]
        for problem in self.problems:
            shown = "(missing)" if problem.value is _MISSING else _show(problem.value)
            lines.append(f"  {problem.key_path()} = {shown}")
            lines.append(f"    {problem.message}")
        return "\n".join(lines)


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def problems_from_validation_error(error: ValidationError, root: type[BaseModel]) -> list[Problem]:
    problems = []
    for detail in error.errors(include_url=False):
        loc = tuple(detail["loc"])
        value: Any = detail.get("input", _MISSING)
        original = (detail.get("ctx") or {}).get("error")
        if isinstance(original, ConfigProblem):
            loc = loc + original.at
            if original.value is not _MISSING:
                value = original.value
            elif original.at:
                value = _lookup(value, original.at)
            message = original.message
        else:
            message = _message_for(detail, root, loc)
            if detail["type"] == "missing":
                value = _MISSING
        problems.append(Problem(path=_clean_loc(loc), value=value, message=message))
    return problems


def _lookup(value: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return value


def _clean_loc(loc: tuple[Any, ...]) -> tuple[str | int, ...]:
    # pydantic adds the name of a tagged-union member or a function validator to the location;
    # the user never typed those, so drop them.
    return tuple(
        part
        for part in loc
        if isinstance(part, int) or not (str(part).startswith("function-") or part == "[key]")
    )


def _message_for(detail: dict[str, Any], root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    kind = detail["type"]
    if kind == "extra_forbidden":
        known = _fields_at(root, loc[:-1])
        unknown = str(loc[-1])
        suggestion = difflib.get_close_matches(unknown, known, n=1)
        hint = f"did you mean '{suggestion[0]}'? " if suggestion else ""
        return f"unknown key '{unknown}': {hint}known keys here: {', '.join(known)}"
    if kind == "missing":
        return "required key is missing: add it to the stack file (README.md, 'Config reference')"
    message = detail["msg"]
    if message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    if message.startswith("Input should"):
        message = "must" + message.removeprefix("Input should")
    return message


def _fields_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at `loc`, found by walking the model classes the way pydantic did."""
    current: Any = root
    for part in loc:
        current = _step(current, part)
        if current is None:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def _step(annotation: Any, part: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(str(part))
        return None if field is None else _unwrap(field.annotation)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (list, tuple) and args:
        return _unwrap(args[0])
    if origin is dict and len(args) == 2:
        return _unwrap(args[1])
    if origin in (Union, types.UnionType):
        return _step(_unwrap(annotation), part)
    return None


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            members = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation
