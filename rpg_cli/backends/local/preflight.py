"""What the local backend checks before any work: the spec, the machine, and (rpg_cli/inputs.py) the
model, the data and the prompts' lengths against the model's positions.

Every problem is a `BackendError` with a one-line message naming it and the fix; the entry point
prints it and exits with status 2 before a model is loaded or a file is written.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from rpg_cli import custom_loss
from rpg_cli.inputs import check_run
from rpg_cli.spec import ExperimentSpec, SpecError


class BackendError(Exception):
    """A spec or environment the local backend cannot honour (one-line message)."""


@dataclass(frozen=True)
class Plan:
    spec: ExperimentSpec
    run_dir: Path
    device: str  # "cpu" or "cuda"
    notes: list[str] = field(default_factory=list)  # what was adapted, logged at start


def read_spec(spec_path: Path) -> ExperimentSpec:
    try:
        data = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BackendError(f"{spec_path}: no such spec file; pass the run's spec.json (rpg sweep writes it)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise BackendError(f"{spec_path}: not a readable JSON spec ({e}); rewrite it with rpg sweep") from None
    try:
        return ExperimentSpec.model_validate(data)
    except SpecError as e:
        raise BackendError(f"{spec_path}: {e.message}") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise BackendError(f"{spec_path}: {where}: {err['msg']}; fix the spec and rerun") from None


def check(spec_path: Path) -> Plan:
    """The spec and everything it names, checked; raises BackendError on the first problem."""
    spec = read_spec(spec_path)
    notes: list[str] = []
    if spec.backend != "local":
        raise BackendError(f"{spec_path}: backend is {spec.backend!r}; this is the local backend (set backend: local)")
    res = spec.resources
    if res.nodes > 1:
        raise BackendError(f"resources.nodes is {res.nodes}, but the local backend runs on one machine; allowed: 1")
    if res.gpus_per_node > 1:
        raise BackendError(
            f"resources.gpus_per_node is {res.gpus_per_node}, but the local backend uses one device; "
            "allowed: 0 (CPU) or 1 (use the verl backend for more)"
        )
    device = "cpu"
    if res.gpus_per_node == 1:
        import torch

        if not torch.cuda.is_available():
            raise BackendError(
                "resources.gpus_per_node is 1 but no CUDA GPU is visible here; allowed: 0 (runs on the CPU)"
            )
        device = "cuda"
    if spec.rollout.engine == "vllm":
        why = (
            "vLLM is not installed"
            if importlib.util.find_spec("vllm") is None
            else "the local backend samples with transformers"
        )
        notes.append(f"rollout.engine vllm: {why}; sampling with transformers (hf) instead")
    if why := custom_loss.not_found(spec.loss):  # the spec's own function: found here, not executed yet
        raise BackendError(f"loss: {why}")
    for finding in check_run(spec):  # data files, model, prompts against the model's positions
        if finding.error:
            raise BackendError(str(finding))
        notes.append(str(finding))
    return Plan(spec, Path(spec_path).absolute().parent, device, notes)
