"""A spec's fields by dotted path (`clip.c`, `verl.env`): the field a path names and the fields beside it (the
sweep's and `--where`'s one-line errors), and a spec mapping as dotted paths to its leaf values (`flatten`:
what differs between runs, for tags and comparisons)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpg_cli.spec.errors import _model_in
from rpg_cli.spec.models import ExperimentSpec

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic.fields import FieldInfo


def field_info(dotted: str) -> FieldInfo | None:
    """The ExperimentSpec field a dotted path names (None: no such field)."""
    model: type[BaseModel] | None = ExperimentSpec
    info = None
    for part in dotted.split("."):
        if model is None or part not in model.model_fields:
            return None
        info = model.model_fields[part]
        model = _model_in(info.annotation)
    return info


def model_at(dotted: str) -> type[BaseModel] | None:
    """The model whose fields a value of `dotted` holds (for listing allowed sub-fields)."""
    info = field_info(dotted)
    return _model_in(info.annotation) if info is not None else None


def field_names(dotted: str) -> list[str]:
    """The fields beside the one `dotted` names: its parent model's (the spec's at the top)."""
    parent = dotted.rpartition(".")[0]
    model = model_at(parent) if parent else ExperimentSpec
    return list(model.model_fields) if model is not None else []


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as {dotted path: leaf value}; an empty mapping is a leaf (`{"verl": {}}` stays)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}
