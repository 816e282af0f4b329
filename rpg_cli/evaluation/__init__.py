"""`rpg eval`: checkpoints -> k samples per problem -> scored samples -> results store.

    options = EvalOptions(ref="runs/paper/rpg-...", benchmarks=("aime24",), k=32)
    results = evaluate(options, local=True)   # plan, evaluate here or as a Ray job, follow; stored results

    options     what the user asks (one pydantic model; an evaluation job receives it as JSON)
    plan        which runs and checkpoints, on which problems, sampled how; checks every input, no torch
    generation  k samples per problem with vLLM or transformers
    pipeline    the job's loop: generates and scores what is not scored yet, records every sample in the
                run directory, resumes (files only)
    files       the run directory's formats: scored samples, cached responses
    recording   the store side, only in the `rpg` process: ingests the scored samples, records the
                accuracy@k metrics from them, reads results and progress back
    results     the accuracy@k rows of a checkpoint's samples and the result `rpg eval` prints
    metrics     accuracy@k: mean@k, pass@k (unbiased), maj@k, std@k (pure functions)
    job         the evaluation as a Ray job (it never sees the store), and `evaluate`, the one call
                `rpg eval` makes

The job's entry point is `python -m rpg_cli.evaluation`. Importing this package imports nothing: the
names below load their module on first use (`metrics` stays light for anyone who wants the formulas).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rpg_cli.evaluation.job import evaluate
    from rpg_cli.evaluation.options import EvalError, EvalOptions
    from rpg_cli.evaluation.plan import EvalPlan, plan_eval

_LAZY = {"EvalError": "options", "EvalOptions": "options", "EvalPlan": "plan", "plan_eval": "plan", "evaluate": "job"}

__all__ = ["EvalError", "EvalOptions", "EvalPlan", "evaluate", "plan_eval"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"rpg_cli.evaluation.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
