"""A spec's own loss, `loss: "package.module:function"` (MATH.md section 11): found, hashed, imported, checked.

Torch-free at import: the spec validates a custom run, and `rpg sweep --dry-run` plans it, without importing
torch or the researcher's module. `source_hash` reads the module's file without executing it (not even its
parent packages' `__init__.py`), so planning a sweep never runs the researcher's code; `load` imports it
where the loss is computed. `check` runs the function on small random batches and says, one line per
check, what a run would trip on (`rpg check-loss`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CUSTOM_LOSS_NAME = "custom"
# the keywords a custom loss is called with (rpg_cli.algorithms.custom.custom_policy_loss)
KEYWORDS = ("log_prob", "old_log_prob", "ref_log_prob", "advantages", "response_mask", "settings")
EXAMPLE = "my_losses.reinforce:loss"
# rpg's verl plugin (backends/verl/launch.PLUGIN_MODULE), imported by name as verl imports it
# (VERL_USE_EXTERNAL_MODULES): it sits layers above this module, and imports the spec, which imports this one
VERL_PLUGIN = "rpg_cli.backends.verl.plugin"


# ---------------------------------------------------------------- the target: package.module:function


def parse_target(text: str) -> tuple[str, str]:
    """`package.module:function` -> (module, function); ValueError (one line) on anything else."""
    module, sep, function = str(text).strip().partition(":")
    parts = module.split(".")
    if not sep or not function.isidentifier() or not all(p.isidentifier() for p in parts):
        raise ValueError(
            f"loss {text!r} is not package.module:function; name the module as Python imports it and the "
            f"function after a colon, e.g. {EXAMPLE}"
        )
    return module, function


def _search_path() -> list[str]:
    """sys.path, then the current directory (a console script's sys.path lacks it; `python -m` puts it first)."""
    cwd = os.getcwd()
    return [*sys.path, cwd] if cwd not in sys.path and "" not in sys.path else list(sys.path)


def _not_found(module: str, why: str) -> ValueError:
    return ValueError(
        f"cannot find module {module!r} of the loss ({why}); put its directory on PYTHONPATH, or install its "
        "package (pip install -e .)"
    )


def _spec(module: str) -> importlib.machinery.ModuleSpec:
    """The module's spec, found level by level without executing any of it.

    `importlib.util.find_spec("pkg.mod")` imports `pkg` (runs its `__init__.py`); here only the top level goes
    through the import system's finders (which execute nothing: editable installs' finders answer too) and each
    lower level through `PathFinder` on its parent's search locations, so no module is run.
    """
    if module in sys.modules and getattr(sys.modules[module], "__spec__", None) is not None:
        return sys.modules[module].__spec__
    importlib.invalidate_caches()  # a file written since the finders last listed its directory
    parts = module.split(".")
    spec = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name in sys.modules and getattr(sys.modules[name], "__spec__", None) is not None:
            spec = sys.modules[name].__spec__
        elif depth == 1:
            spec = importlib.machinery.PathFinder.find_spec(name, _search_path())
            if spec is None:
                spec = _meta_path_spec(name)
        else:
            locations = spec.submodule_search_locations if spec is not None else None
            if not locations:
                raise _not_found(module, f"{'.'.join(parts[: depth - 1])} is not a package")
            spec = importlib.machinery.PathFinder.find_spec(name, list(locations))
        if spec is None:
            raise _not_found(module, f"no {name.replace('.', '/')}.py on the path")
    return spec


def _meta_path_spec(name: str) -> importlib.machinery.ModuleSpec | None:
    """A top-level module the path does not hold (an editable install's finder, say): asking a finder for a
    top-level name imports nothing."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None or finder is importlib.machinery.PathFinder:
            continue
        try:
            spec = find(name, None)
        except Exception:  # a third-party finder's bug is not the researcher's
            continue
        if spec is not None:
            return spec
    return None


def source_file(target: str) -> Path:
    """The Python file that defines the target's module (its `__init__.py` for a package), not executed."""
    module, _ = parse_target(target)
    spec = _spec(module)
    origin = spec.origin if spec.has_location else None
    if not origin or not origin.endswith(".py") or not Path(origin).is_file():
        raise _not_found(module, f"it is {origin or 'a namespace package'}, not a Python source file")
    return Path(origin)


def source_hash(target: str) -> str:
    """sha256 (first 12 hex digits) of the bytes of the target's module file: part of a custom run's id, so
    that an edited loss is a new run. ValueError (one line) when the module cannot be found."""
    return hashlib.sha256(source_file(target).read_bytes()).hexdigest()[:12]


def module_root(target: str) -> Path:
    """The directory that must be on sys.path for the target's module to import (a job's PYTHONPATH)."""
    module, _ = parse_target(target)
    path = source_file(target).resolve()
    levels = module.count(".") + (1 if path.name == "__init__.py" else 0)
    return path.parents[levels]


def not_found(target: str | None) -> str | None:
    """Why a run's custom loss cannot run from here, in one line (its module is not found: every backend's
    preflight refuses the run with it); None when it can, or when there is none."""
    if not target:
        return None
    try:
        source_file(target)
    except ValueError as e:
        return str(e)
    return None


def job_pythonpath(target: str | None, pythonpath: str | None = None) -> str | None:
    """A job's PYTHONPATH for a custom loss: its module's directory, then `pythonpath` (the spec's own), else the
    node's (`${PYTHONPATH}`, which Ray expands in every process of the job: ray/_private/utils.py update_envs).
    On a cluster of several nodes the directory must be on a filesystem they all see. None without a loss, or
    where the module is not found here (`not_found` says why)."""
    if not_found(target) is not None or not target:
        return None
    return os.pathsep.join([str(module_root(target)), pythonpath or "${PYTHONPATH}"])


def load(target: str) -> Callable[..., Any]:
    """Import the target's module and return its function, checked to take rpg's keywords.
    ValueError (one line) naming the problem and the fix."""
    module, function = parse_target(target)
    root = str(module_root(target))
    if root not in sys.path:
        sys.path.append(root)  # last, as _search_path found it: it shadows nothing
    try:
        loaded = importlib.import_module(module)
    except Exception as e:  # the researcher's module failed: say how, in one line
        raise ValueError(f"importing {module} for loss {target!r} failed: {_one_line(e)}; fix the module") from None
    fn = getattr(loaded, function, None)
    if fn is None:
        raise ValueError(f"module {module} ({loaded.__file__}) has no {function!r}; define it, or fix the loss name")
    if not callable(fn):
        raise ValueError(f"{target} is a {type(fn).__name__}, not a function; point the loss at a function")
    missing = _missing_keywords(fn)
    if missing:
        raise ValueError(
            f"loss function {target} does not take {', '.join(missing)}; rpg calls it by keyword with "
            f"{', '.join(KEYWORDS)} (add **kwargs for those it ignores)"
        )
    return fn


def _missing_keywords(fn: Callable[..., Any]) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function: nothing to read, the call will tell
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return []
    takes = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return [k for k in KEYWORDS if k not in takes]


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# ---------------------------------------------------------------- rpg check-loss

CHECK_CALL = "returns a per-token loss of the batch's shape"
CHECK_FINITE = "finite values and gradients"
CHECK_GRADIENT = "gradients reach log_prob"
CHECK_PADDING = "padding changes nothing"
CHECK_VERL = "verl's plugin computes the same"
CHECKS = (CHECK_CALL, CHECK_FINITE, CHECK_GRADIENT, CHECK_PADDING, CHECK_VERL)

# (valid lengths of the rows, response_len): ragged with trailing padding and a row of length 1, no padding,
# a single token
_LAYOUTS = (((5, 1, 8, 3), 11), ((6, 6, 6), 6), ((1,), 1), ((2, 7), 9))
_TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "bfloat16": 2e-2}  # relative, on values and gradients


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: passed, failed (`failure`: one line saying where and why) or skipped (`skipped`)."""

    name: str
    failure: str | None = None
    skipped: str | None = None

    def line(self) -> str:
        if self.failure is not None:
            return f"FAIL  {self.name}: {self.failure}"
        if self.skipped is not None:
            return f"skip  {self.name}: {self.skipped}"
        return f"ok  {self.name}"


@dataclass(frozen=True)
class _Batch:
    """A small random padded batch, as verl hands one to a loss (log-probs below 0, padding at the end)."""

    label: str
    log_prob: Any
    old_log_prob: Any
    ref_log_prob: Any
    advantages: Any  # (batch,) or (batch, response_len)
    response_mask: Any

    def replace(self, **changes: Any) -> _Batch:
        import dataclasses

        return dataclasses.replace(self, **changes)


def _batches() -> list[_Batch]:
    """Every layout in float64, float32 and bfloat16, with per-sequence and per-token advantages. Seeded."""
    import torch

    generator = torch.Generator().manual_seed(0)

    def normal(*size: int, std: float = 1.0) -> Any:
        return torch.randn(*size, generator=generator, dtype=torch.float64) * std

    batches = []
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        for lengths, width in _LAYOUTS:
            for per_token in (False, True):
                shape = (len(lengths), width)
                mask = torch.arange(width) < torch.tensor(lengths).unsqueeze(-1)
                old = -torch.rand(shape, generator=generator, dtype=torch.float64) * 3 - 0.05
                log_prob = (old + normal(*shape, std=0.05)).clamp(max=-1e-3)  # near pi_old: no clip bites
                ref = (old + normal(*shape, std=0.05)).clamp(max=-1e-3)
                adv = normal(*shape) if per_token else normal(shape[0])
                adv = torch.where(adv.abs() < 0.05, torch.full_like(adv, 0.5), adv)  # every advantage clearly non-0
                kind = "per-token" if per_token else "per-sequence"
                label = f"{str(dtype).removeprefix('torch.')} batch {shape[0]}x{width}, {kind} advantages"
                batches.append(_Batch(label, log_prob.to(dtype), old.to(dtype), ref.to(dtype), adv.to(dtype), mask))
    return batches


def _evaluate(fn: Callable[..., Any], batch: _Batch, settings: Mapping[str, Any], *, ref: bool = True) -> tuple:
    """(loss, gradient w.r.t. log_prob or None when the loss does not depend on it, metrics)."""
    from rpg_cli.algorithms.custom import custom_policy_loss

    log_prob = batch.log_prob.clone().requires_grad_(True)
    loss, metrics = custom_policy_loss(
        fn,
        log_prob=log_prob,
        old_log_prob=batch.old_log_prob,
        advantages=batch.advantages,
        response_mask=batch.response_mask,
        ref_log_prob=batch.ref_log_prob if ref else None,
        settings=settings,
    )
    if not loss.requires_grad:
        return loss.detach(), None, metrics
    loss.backward()
    grad = log_prob.grad if log_prob.grad is not None else log_prob.detach() * 0
    return loss.detach(), grad, metrics


def checks(target: str, settings: Mapping[str, Any] | None = None) -> Iterator[CheckResult]:
    """Run the loss through `custom_policy_loss` as a run would and yield each check's outcome as it is known.

    Loading the target comes first: a ValueError (one line) when it cannot be found, imported or called by
    rpg's keywords. Deterministic: the batches are seeded.
    """
    fn = load(target)
    settings = dict(settings or {})
    batches = _batches()
    base: dict[str, tuple] = {}
    for batch in batches:
        for ref in (True, False):
            try:
                result = _evaluate(fn, batch, settings, ref=ref)
            except Exception as e:
                without = "" if ref else " with ref_log_prob=None (the iterative reference)"
                yield CheckResult(CHECK_CALL, f"{_one_line(e)}, on a {batch.label}{without}")
                return
            if ref:
                base[batch.label] = result
    yield CheckResult(CHECK_CALL)
    yield _guarded(CHECK_FINITE, batches, lambda b: _finite(b, *base[b.label]))
    yield _guarded(CHECK_GRADIENT, batches, lambda b: _gradient(fn, b.replace(log_prob=b.old_log_prob), settings))
    yield _guarded(CHECK_PADDING, batches, lambda b: _padding(fn, b, settings, base[b.label]))
    yield _verl_check(fn, target, settings, batches)


def check(target: str, settings: Mapping[str, Any] | None = None) -> list[str]:
    """The failed checks of `checks`, one line each (empty: the loss is sound)."""
    return [r.line() for r in checks(target, settings) if r.failure is not None]


def _guarded(name: str, batches: list[_Batch], step: Callable[[_Batch], str | None]) -> CheckResult:
    """The check's first failure over the batches; the function raising is a failure too."""
    for batch in batches:
        try:
            failure = step(batch)
        except Exception as e:
            failure = f"the function raised {_one_line(e)} on a {batch.label}"
        if failure is not None:
            return CheckResult(name, failure)
    return CheckResult(name)


def _finite(batch: _Batch, loss: Any, grad: Any, metrics: Mapping[str, float]) -> str | None:
    import math

    import torch

    if not torch.isfinite(loss).all():
        return f"the loss is {loss.item()} on a {batch.label}"
    if grad is not None and not torch.isfinite(grad).all():
        bad = int((~torch.isfinite(grad) & batch.response_mask).sum())
        return f"the gradient is not finite at {bad} of {int(batch.response_mask.sum())} tokens on a {batch.label}"
    for key, value in metrics.items():
        if not math.isfinite(value):
            return f"metric {key!r} is {value} on a {batch.label}"
    return None


def _gradient(fn: Callable[..., Any], batch: _Batch, settings: Mapping[str, Any]) -> str | None:
    """On-policy (w = 1, where no clip bites), every token with an advantage must move log_prob."""
    _, grad, _ = _evaluate(fn, batch, settings)
    if grad is None:
        return f"the loss does not depend on log_prob on a {batch.label}: is it detached (.detach(), .item())?"
    adv = batch.advantages if batch.advantages.dim() == 2 else batch.advantages.unsqueeze(-1).expand_as(grad)
    live = batch.response_mask & (adv != 0)
    dead = int((live & (grad == 0)).sum())
    if dead:
        return (
            f"the gradient is 0 at {dead} of {int(live.sum())} tokens with an advantage, on-policy (w = 1), on a "
            f"{batch.label}: is part of the loss detached?"
        )
    return None


def _padding(fn: Callable[..., Any], batch: _Batch, settings: Mapping[str, Any], base: tuple) -> str | None:
    """The same batch with junk in its padding, and cut to its valid columns, gives the same loss and gradient."""
    import torch

    mask = batch.response_mask
    if bool(mask.all()):
        return None
    loss, grad, _ = base

    def junk(tensor: Any, value: float) -> Any:
        return torch.where(mask, tensor, torch.full_like(tensor, value)) if tensor.dim() == 2 else tensor

    dirty = batch.replace(
        log_prob=junk(batch.log_prob, float("nan")),
        old_log_prob=junk(batch.old_log_prob, -float("inf")),
        ref_log_prob=junk(batch.ref_log_prob, float("inf")),
        advantages=junk(batch.advantages, float("nan")),
    )
    dirty_loss, dirty_grad, _ = _evaluate(fn, dirty, settings)
    why = _differs(batch, loss, grad, dirty_loss, dirty_grad, mask)
    if why:
        return f"{why} when the padding holds NaN/inf, on a {batch.label}"
    width = int(mask.sum(-1).max())
    if width < mask.shape[-1]:
        cut = batch.replace(**{k: _cut(getattr(batch, k), width) for k in _TENSORS})
        cut_loss, cut_grad, _ = _evaluate(fn, cut, settings)
        why = _differs(batch, loss, None if grad is None else grad[:, :width], cut_loss, cut_grad, cut.response_mask)
        if why:
            return (
                f"{why} when the batch is cut to its {width} valid columns, on a {batch.label}: does it reduce over "
                "padded tokens (use response_mask) or read the response length?"
            )
    return None


_TENSORS = ("log_prob", "old_log_prob", "ref_log_prob", "advantages", "response_mask")


def _cut(tensor: Any, width: int) -> Any:
    return tensor[:, :width] if tensor.dim() == 2 else tensor


def _differs(batch: _Batch, loss: Any, grad: Any, other_loss: Any, other_grad: Any, mask: Any) -> str | None:
    """Why two evaluations of the same valid tokens disagree, or None (relative tolerance of the dtype)."""
    import torch

    tolerance = _TOLERANCE[str(batch.log_prob.dtype).removeprefix("torch.")]

    def close(a: Any, b: Any) -> bool:
        a, b = a.to(torch.float64), b.to(torch.float64)
        scale = max(float(a.abs().max()), float(b.abs().max()), 1e-12)
        return bool(torch.isfinite(b).all()) and float((a - b).abs().max()) <= tolerance * scale

    if not close(loss, other_loss):
        return f"the loss changes ({float(loss):.6g} -> {float(other_loss):.6g})"
    if grad is not None and other_grad is not None:
        if not close(torch.where(mask, grad, 0), torch.where(mask, other_grad, 0)):
            return "the gradient changes"
        if bool((other_grad[~mask] != 0).any()):
            return "the gradient reaches padded tokens"
    return None


def _verl_check(fn: Callable[..., Any], target: str, settings: Mapping[str, Any], batches: list[_Batch]) -> CheckResult:
    """verl's registered `custom` loss (rpg's plugin), called as verl's actor calls it, against the local path."""
    if importlib.util.find_spec("verl") is None:
        return CheckResult(CHECK_VERL, skipped="verl is not installed here (pip install -e '.[verl]' to check it)")
    try:
        verl_loss = _verl_loss_fn(target, settings)
    except Exception as e:
        return CheckResult(CHECK_VERL, f"{_one_line(e)}")
    for batch in batches:
        local = _evaluate(fn, batch, settings, ref=False)
        try:
            remote = verl_loss(batch)
        except Exception as e:
            return CheckResult(CHECK_VERL, f"verl's custom loss raised {_one_line(e)} on a {batch.label}")
        why = _differs(batch, local[0], local[1], remote[0], remote[1], batch.response_mask) or _metrics_differ(
            local[2], remote[2]
        )
        if why:
            return CheckResult(CHECK_VERL, f"{why} between verl's loss and the local one, on a {batch.label}")
    return CheckResult(CHECK_VERL)


def _metrics_differ(local: Mapping[str, float], logged: Mapping[str, Any]) -> str | None:
    """The function's own metrics must reach verl's log under their logged names (`rpg_cli.metrics.loss_metrics`)."""
    import math

    from rpg_cli.algorithms.custom import LOGGED
    from rpg_cli.metrics import loss_metrics

    own = loss_metrics({k: v for k, v in local.items() if k not in LOGGED})
    for key, value in own.items():
        if key not in logged:
            return f"metric {key} is missing"
        if not math.isclose(float(logged[key]), value, rel_tol=1e-4, abs_tol=1e-6) and math.isfinite(value):
            return f"metric {key} differs ({value:.6g} -> {float(logged[key]):.6g})"
    return None


def _verl_loss_fn(target: str, settings: Mapping[str, Any]) -> Callable[[_Batch], tuple]:
    """verl's policy loss for mode `custom`, from verl's registry once rpg's plugin is imported (as verl imports it),
    wrapped to take a _Batch and return (loss, gradient w.r.t. log_prob, logged metrics)."""
    import logging
    import warnings
    from types import SimpleNamespace

    with warnings.catch_warnings():  # verl's import warns about engines and accelerators a check does not use
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            importlib.import_module(VERL_PLUGIN)
        finally:
            logging.disable(logging.NOTSET)
    plugin = sys.modules[VERL_PLUGIN]
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    registered = POLICY_LOSS_REGISTRY.get(CUSTOM_LOSS_NAME)
    if registered is None:
        raise RuntimeError(
            f"verl has no policy loss {CUSTOM_LOSS_NAME!r}: rpg's plugin does not register it; reinstall rpg-cli"
        )
    policy_loss = plugin.RPGPolicyLossConfig(loss_mode=CUSTOM_LOSS_NAME, custom=target, custom_settings=dict(settings))
    config = SimpleNamespace(
        policy_loss=policy_loss, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, global_batch_info={}
    )

    def run(batch: _Batch) -> tuple:
        log_prob = batch.log_prob.clone().requires_grad_(True)
        adv = batch.advantages
        adv = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(log_prob)  # verl's advantages are per token
        loss, metrics = registered(
            old_log_prob=batch.old_log_prob,
            log_prob=log_prob,
            advantages=adv,
            response_mask=batch.response_mask,  # bool, as verl's ppo_loss passes it
            loss_agg_mode="token-mean",
            config=config,
        )
        if not loss.requires_grad:
            return loss.detach(), None, metrics
        loss.backward()
        return loss.detach(), log_prob.grad, metrics

    return run
