"""What a user asks of `rpg eval`, declared once: the CLI builds it, `plan_eval` reads it, and an
evaluation job receives it as JSON (`python -m rpg_cli.evaluation '<options as JSON>'`).

Every check that needs nothing but the options runs when they are built, with a one-line EvalError.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from rpg_cli.store.url import DEFAULT_DB_URL

DEFAULT_BENCHMARKS = ("aime24", "aime25", "amc23")
ENGINES = ("auto", "vllm", "hf")


class EvalError(RuntimeError):
    """Bad `rpg eval` input; the message is one line naming the problem and the fix."""


class EvalOptions(BaseModel):
    """The user's request, as typed; `plan_eval` turns it into an `EvalPlan`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ref: str
    benchmarks: tuple[str, ...] = DEFAULT_BENCHMARKS  # presets or prepared .parquet files
    k: int | None = None  # samples per problem; default: the run's val.n (32 without a spec)
    steps: str = "last"  # last | all | N,M,...
    # None: each benchmark's (rpg_cli.benchmarks: the run's spec's override, else the table's)
    scorer: str | None = None
    data_dir: str = "data"
    db: str = DEFAULT_DB_URL
    runs_dir: str = "runs"
    engine: str = "auto"  # auto: vLLM when installed and a GPU is present, else transformers
    # vLLM's tensor parallel size; None: the largest the model's heads and the visible GPUs allow
    tp: int | None = None
    temperature: float | None = None  # default: the run's val.temperature
    top_p: float | None = None  # default: the run's val.top_p
    max_tokens: int | None = None  # default: the run's response length (its context)
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> EvalOptions:
        # EvalError is no ValueError: pydantic lets it through as it is, one line
        from rpg_cli.rewards import SCORERS

        if self.scorer is not None and self.scorer not in SCORERS:
            raise EvalError(f"unknown scorer {self.scorer!r}; choose one of: {', '.join(SCORERS)}")
        if self.engine not in ENGINES:
            raise EvalError(f"unknown engine {self.engine!r}; choose one of: {', '.join(ENGINES)}")
        if self.tp is not None and self.tp < 1:
            raise EvalError(f"--tp must be at least 1, got {self.tp}")
        if self.tp is not None and self.engine == "hf":
            raise EvalError(f"--tp {self.tp} sets vLLM's tensor parallelism; drop it, or use --engine vllm or auto")
        if self.k is not None and self.k < 1:
            raise EvalError(f"--k must be at least 1, got {self.k}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise EvalError(f"--max-tokens must be at least 1, got {self.max_tokens}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise EvalError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.temperature is not None and self.temperature < 0:
            raise EvalError(f"--temperature must be >= 0, got {self.temperature}")
        parse_steps(self.steps)
        if not self.benchmarks:
            raise EvalError(
                f"no benchmark given; pass --benchmarks with any of {', '.join(DEFAULT_BENCHMARKS)} or a parquet file"
            )
        return self


def parse_steps(steps: str) -> str | list[int]:
    """'last' | 'all' | [N, M, ...]."""
    text = steps.strip()
    if text in ("last", "all"):
        return text
    try:
        chosen = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        chosen = []
    if not chosen or chosen[0] < 0:
        raise EvalError(f"--steps {steps!r}: expected last, all, or step numbers like 100,200")
    return chosen
