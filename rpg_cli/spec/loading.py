"""Reading spec YAML files: `load_spec` (one run) and `load_sweep` (a grid), every problem a `SpecError`.
A key given twice in a YAML mapping is an error, as is a file whose aliases expand without bound.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rpg_cli.spec.errors import SpecError, _validate
from rpg_cli.spec.models import ExperimentSpec
from rpg_cli.spec.sweep import SweepSpec, _check_fragments

# aliases may share a fragment; a file whose aliases expand past this many values is refused (billion laughs)
MAX_YAML_VALUES = 100_000


def load_spec(path: str | Path) -> ExperimentSpec:
    """One run from a YAML file (interpolations resolved)."""
    data = _read_yaml(Path(path))
    try:
        return _validate(ExperimentSpec, data)
    except SpecError as e:
        raise e.within(source=str(path)) from None


def load_sweep(path: str | Path) -> SweepSpec:
    """A sweep from a YAML file; every fragment (base, grid values, include/exclude) is checked here."""
    data = _read_yaml(Path(path))
    try:
        sweep = _validate(SweepSpec, data)
        _check_fragments(sweep)
    except SpecError as e:
        raise e.within(source=str(path)) from None
    sweep._source = str(path)
    return sweep


# ---------------------------------------------------------------------------------------------
# YAML


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(
            "no such file; pass the path of a spec YAML (the paper's are in experiments/)", source=str(path)
        ) from None
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", source=str(path)) from None
    except UnicodeDecodeError as e:
        raise SpecError(
            f"not a text file (byte {e.start} is not UTF-8); pass the path of a spec YAML", source=str(path)
        ) from None
    import yaml

    try:
        data = yaml.load(text, Loader=_loader())
    except _DuplicateKey as e:
        raise SpecError(
            f"line {e.problem_mark.line + 1}: {e.problem}; allowed: each key once per mapping", source=str(path)
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{where}invalid YAML ({problem})", source=str(path)) from None
    if _expanded_size(data) > MAX_YAML_VALUES:
        raise SpecError(
            f"its aliases (*name) expand to more than {MAX_YAML_VALUES:,} values; allowed: a spec whose "
            "anchors are reused a bounded number of times",
            source=str(path),
        )
    if "${" in text:  # omegaconf is slow to import; only files that interpolate pay for it
        data = _resolve_interpolations(data, path)
    return data


def _expanded_size(data: Any) -> int:
    """How many values `data` holds with every alias expanded, counted without expanding: PyYAML shares an
    aliased fragment, but deep copies, validation and JSON would each expand it (nested aliases: 10^9)."""
    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) not in sizes:
            sizes[id(node)] = MAX_YAML_VALUES + 1  # a fragment that holds itself expands without end
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            sizes[id(node)] = min(1 + sum(size(c) for c in children), MAX_YAML_VALUES + 1)
        return sizes[id(node)]

    return size(data)


# OmegaConf's resolvers that read the process environment: a spec is published (spec.json, the store, Ray's jobs
# API), so a value from rpg's environment (a password in $DB_PASS) must not become part of it under any name
_ENV_RESOLVER = re.compile(r"(?<!\\)\$\{\s*(?:oc\.env|env)\s*:")  # escaped \${...} is text to OmegaConf


def _resolve_interpolations(data: Any, path: Path) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if (where := _env_interpolation(data)) is not None:
        raise SpecError(
            "reads rpg's environment (${oc.env:...}) into the spec, which spec.json, the store and Ray's jobs API "
            "keep; allowed: interpolations of the file's own fields (${base.steps}), values written out",
            where,
            str(path),
        )
    try:
        return OmegaConf.to_container(OmegaConf.create(data), resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        raise SpecError(f"interpolation failed: {str(e).splitlines()[0]}", str(key), str(path)) from None


def _env_interpolation(data: Any, at: str = "") -> str | None:
    """The dotted path of the first value (or key) that interpolates an environment variable, else None."""
    if isinstance(data, dict):
        for key, value in data.items():
            here = f"{at}.{key}" if at else str(key)
            if isinstance(key, str) and _ENV_RESOLVER.search(key):
                return here
            if (found := _env_interpolation(value, here)) is not None:
                return found
    elif isinstance(data, list):
        for i, value in enumerate(data):
            if (found := _env_interpolation(value, f"{at}[{i}]")) is not None:
                return found
    elif isinstance(data, str) and _ENV_RESOLVER.search(data):
        return at or "(top)"
    return None


_LOADER: type | None = None
_DuplicateKey: type = type("_DuplicateKey", (Exception,), {})  # replaced by a yaml.YAMLError subclass in _loader


def _loader() -> type:
    """PyYAML's safe loader that also reads `1e-4` as a float (YAML 1.1 wants `1.0e-4`), as omegaconf does,
    and rejects a key given twice in one mapping (PyYAML keeps the last silently). Keys merged in with
    `<<: *anchor` may be overridden: only a mapping's own keys must be distinct."""
    global _LOADER, _DuplicateKey
    if _LOADER is None:
        import yaml

        class DuplicateKey(yaml.constructor.ConstructorError):
            pass

        def construct_map(loader, node):
            seen: dict[str, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                if key_node.value in seen:
                    raise DuplicateKey(
                        None,
                        None,
                        f"duplicate key {key_node.value!r} (first on line {seen[key_node.value]})",
                        key_node.start_mark,
                    )
                seen[key_node.value] = key_node.start_mark.line + 1
            yield from yaml.constructor.SafeConstructor.construct_yaml_map(loader, node)

        base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        _LOADER = type("SpecLoader", (base,), {})
        _DuplicateKey = DuplicateKey
        _LOADER.add_implicit_resolver(
            "tag:yaml.org,2002:float",
            re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
            list("-+0123456789."),
        )
        _LOADER.add_constructor("tag:yaml.org,2002:map", construct_map)
    return _LOADER
