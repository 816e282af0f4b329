"""Bad spec input as one line: `SpecError`, and pydantic's validation errors mapped to it.

Every invalid input raises `SpecError`, whose one-line message names the file, the field path and what
is allowed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError


class SpecError(Exception):
    """Bad spec input, reported as one line: `<file>: [<cell>] <field path>: <reason>`.

    Deliberately not a ValueError: raised inside a pydantic validator it propagates unchanged, so
    cross-field checks keep their own field path.
    """

    def __init__(self, reason: str, path: str = "", source: str = "", where: str = ""):
        self.reason, self.path, self.source, self.where = reason, path, source, where
        super().__init__(self.message)

    @property
    def message(self) -> str:
        place = " ".join(p for p in (self.where, self.path) if p)
        return ": ".join(p for p in (self.source, place, self.reason) if p)

    def within(self, source: str = "", where: str = "", prefix: str = "") -> SpecError:
        """The same problem seen from further out (a file, a grid cell, an enclosing field)."""
        path = _join_path(prefix, self.path)
        return SpecError(self.reason, path, source or self.source, where or self.where)


# ---------------------------------------------------------------------------------------------
# Validation errors -> one line


def _validate(model: type[BaseModel], data: Any) -> Any:
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise SpecError(f"expected a mapping of {model.__name__} fields, got {got}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _from_pydantic(e.errors()[0], model) from None


def _from_pydantic(err: dict[str, Any], root: type[BaseModel] | None) -> SpecError:
    loc = tuple(err["loc"])
    path = _loc_path(loc)
    kind, got = err["type"], err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        owner = _owner_model(root, loc[:-1])
        fields = ", ".join(owner.model_fields) if owner is not None else "?"
        return SpecError(f"unknown field; allowed: {fields}", path)
    if kind == "missing":
        return SpecError("required field is missing", path)
    if kind == "literal_error":
        return SpecError(f"got {got!r}; allowed: {ctx.get('expected', '?')}", path)
    if kind == "value_error":
        return SpecError(str(ctx.get("error", err["msg"])), path)
    bounds = {
        "greater_than": "> {gt}",
        "greater_than_equal": ">= {ge}",
        "less_than": "< {lt}",
        "less_than_equal": "<= {le}",
        "too_short": "at least {min_length} item(s)",
        "string_too_long": "at most {max_length} characters",
        "string_pattern_mismatch": "text matching {pattern}",
    }
    if kind in bounds:
        limits = {k: _num(v) if isinstance(v, float) else v for k, v in ctx.items()}  # 1048576, not 1.04858e+06
        return SpecError(f"got {got!r}; allowed: {bounds[kind].format(**limits)}", path)
    message = err["msg"].removeprefix("Input should be ")
    return SpecError(f"got {got!r} ({type(got).__name__}); allowed: {message}", path)


def _owner_model(root: type[BaseModel] | None, loc: tuple) -> type[BaseModel] | None:
    model = root
    for part in loc:
        if model is None:
            return None
        if isinstance(part, str) and part in model.model_fields:
            model = _model_in(model.model_fields[part].annotation)
        elif isinstance(part, str) and isinstance(model, type) and part == model.__name__:
            continue  # pydantic names the union member it tried
    return model


def _loc_path(loc: tuple) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("Clip", "Every", "DynamicSampling", "Overlong", "KLLoss") or part.startswith(
            ("literal[", "function-")
        ):
            continue  # union-member tags, not fields
        else:
            path = _join_path(path, part)
    return path


def _join_path(prefix: str, path: str) -> str:
    if not prefix or not path:
        return prefix or path
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)
