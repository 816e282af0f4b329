"""Test helper: the rows tests record in a store by hand, written once. `eval_row(**overrides)` is one row
of the evals table as `rpg eval` records it (`Store.record_evals`): the key, the sampling protocol, the
value and the scorer's version (`from helpers import eval_row`)."""

from __future__ import annotations

from typing import Any

PROTOCOL: dict[str, Any] = {"n": 8, "temperature": 1.0, "top_p": 1.0, "max_tokens": 64, "seed": 0}  # schema.PROTOCOL


def eval_row(**overrides: Any) -> dict[str, Any]:
    """A mean@k score of run "r1" at step 2 on aime24 by the dapo scorer, drawn under PROTOCOL; `overrides`
    replace any field. `k` follows `n` unless given (mean@k over all n samples); an unknown field is an
    error, so a typo never records a row the test did not mean."""
    row: dict[str, Any] = {
        "run_id": "r1",
        "step": 2,
        "benchmark": "aime24",
        "metric": "mean@k",
        "k": overrides.get("n", PROTOCOL["n"]),
        "scorer": "dapo",
        "value": 0.5,
        "scorer_version": "1",
        **PROTOCOL,
    }
    unknown = sorted(set(overrides) - set(row))
    assert not unknown, f"eval_row: unknown field(s) {unknown}; the fields are {sorted(row)}"
    return {**row, **overrides}


def record_eval(
    store: Any, run_id: str, step: int, bench: str, correct: list[int], scorer: str = "dapo", **protocol: Any
):
    """An `rpg eval` result as the store keeps it: per problem p (`<bench>-p000`, ...), `correct[p]` of the
    protocol's n samples right, and its mean@n row (`eval_row`). `protocol` replaces any of PROTOCOL."""
    protocol = {**PROTOCOL, **protocol}
    n = protocol["n"]
    store.record_samples(
        {
            "run_id": run_id,
            "step": step,
            "benchmark": bench,
            "problem": f"{bench}-p{p:03d}",
            "sample_index": j,
            "scorer": scorer,
            **protocol,
            "position": p,
            "extracted": "1",
            "correct": j < c,
            "response_length": 5,
        }
        for p, c in enumerate(correct)
        for j in range(n)
    )
    value = sum(correct) / len(correct) / n
    store.record_evals([eval_row(run_id=run_id, step=step, benchmark=bench, value=value, scorer=scorer, **protocol)])
