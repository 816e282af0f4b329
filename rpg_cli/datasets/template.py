"""The paper's prompt template and verl's parquet row format.

Both are taken from the paper's released evaluation files (AIME24/AIME25/AMC23): every prompt is
DAPO's "Answer:" template around the raw problem, and every row carries the same five columns.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

PROMPT_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
PROMPT_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'

ABILITY = "MATH"
# verl's name for the rule-based scorer family the paper's files declare; the scorer itself is
# chosen by `data_source`.
REWARD_STYLE = "rule-lighteval/MATH_v2"

# Field order and types as in the paper's files, plus `extra_info.raw_answer`: the answer as the source
# stored it where rpg wrote it otherwise (`["$1$", "$2$"]` -> "1, 2", "033" -> "33"), else null.
# `extra_info.split` is always null there (the paper's README: "split": None), which Arrow stores as the
# null type.
VERL_SCHEMA = pa.schema(
    [
        pa.field("data_source", pa.string()),
        pa.field(
            "prompt",
            pa.list_(pa.struct([pa.field("content", pa.string()), pa.field("role", pa.string())])),
        ),
        pa.field("ability", pa.string()),
        pa.field(
            "reward_model",
            pa.struct([pa.field("ground_truth", pa.string()), pa.field("style", pa.string())]),
        ),
        pa.field(
            "extra_info",
            pa.struct(
                [
                    pa.field("index", pa.int64()),
                    pa.field("raw_problem", pa.string()),
                    pa.field("split", pa.null()),
                    pa.field("raw_answer", pa.string()),
                ]
            ),
        ),
    ]
)


def make_prompt(problem: str) -> str:
    """The user message the policy sees: DAPO's template around the raw problem."""
    return PROMPT_PREFIX + problem + PROMPT_SUFFIX


def unwrap_prompt(text: str) -> str:
    """The raw problem inside a templated prompt; text without the template comes back unchanged.

    DAPO-Math-17k (and verl files like the paper's) store prompts already templated, so reading
    them back must undo `make_prompt` exactly, or the template would be applied twice.
    """
    if text.startswith(PROMPT_PREFIX) and text.endswith(PROMPT_SUFFIX):
        return text[len(PROMPT_PREFIX) : len(text) - len(PROMPT_SUFFIX)]
    return text


def verl_row(problem: str, answer: str, data_source: str, index: int, raw_answer: str | None = None) -> dict[str, Any]:
    """One parquet row in verl's format for a problem and its ground-truth answer (and the source's, where
    rpg normalized it)."""
    return {
        "data_source": data_source,
        "prompt": [{"content": make_prompt(problem), "role": "user"}],
        "ability": ABILITY,
        "reward_model": {"ground_truth": answer, "style": REWARD_STYLE},
        "extra_info": {"index": index, "raw_problem": problem, "split": None, "raw_answer": raw_answer},
    }
