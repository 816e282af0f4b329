"""A run's context: the paper's "Nk" prompt and response budgets, or explicit ones, and how names write them.
The only place these numbers live (spec/models.py's `context` field, run names, tables, the dry run)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rpg_cli.spec.frozen import _Frozen

# context "Nk" -> (max_prompt_length, max_response_length) = (N x 1024, N x 1024): the paper's "maximum
# training and rollout length 4,096 tokens for a 2K context length and 8,192 for a 4K", the released
# scripts' 2048 + 2048.
CONTEXT_LENGTHS: dict[str, tuple[int, int]] = {"2k": (2048, 2048), "4k": (4096, 4096), "8k": (8192, 8192)}
MAX_CONTEXT_TOKENS = 1_048_576  # an explicit budget's bound: far above any model, below a typo


class ContextTokens(_Frozen):
    """Explicit prompt and response token budgets, beside the paper's Nk: for tests, tiny models, ablations."""

    prompt: int = Field(ge=1, le=MAX_CONTEXT_TOKENS)
    response: int = Field(ge=1, le=MAX_CONTEXT_TOKENS)


def context_lengths(context: str | dict[str, Any] | ContextTokens) -> tuple[int, int]:
    """(prompt, response) tokens of a context: "Nk", {prompt, response} (as in spec.json) or ContextTokens."""
    if isinstance(context, ContextTokens):
        return context.prompt, context.response
    if isinstance(context, dict):
        return int(context["prompt"]), int(context["response"])
    return CONTEXT_LENGTHS[context]


def context_label(context: str | dict[str, Any] | ContextTokens) -> str:
    """A context as run names and tables write it: "2k", or "64+32" for explicit budgets."""
    if isinstance(context, str):
        return context
    prompt, response = context_lengths(context)
    return f"{prompt}+{response}"
