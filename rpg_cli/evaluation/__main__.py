"""Entry point of an evaluation job: `python -m rpg_cli.evaluation '<EvalOptions as JSON>'`.

`rpg eval` writes the command (evaluation/job.py), with a second argument: the targets it resolved
(`encode_targets`). The job opens no store: it writes what it scores to the run directories, and the
`rpg eval` that submitted it ingests them. Progress goes to stdout, one line per problem batch; exit
status 0 done, 2 bad input (one line on stderr, passwords in URLs masked).
"""

from __future__ import annotations

import json
import sys

from pydantic import ValidationError

from rpg_cli.evaluation.options import EvalError, EvalOptions
from rpg_cli.store.url import redact


def parse_args(argv: list[str]) -> EvalOptions:
    """The options of the job's one argument; EvalError (one line) when it is not valid EvalOptions JSON."""
    if len(argv) != 1:
        raise EvalError("usage: python -m rpg_cli.evaluation '<EvalOptions as JSON>' (rpg eval writes it)")
    try:
        fields = json.loads(argv[0])
    except ValueError as e:
        raise EvalError(f"bad evaluation options: not JSON ({e})") from None
    try:
        return EvalOptions.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise EvalError(f"bad evaluation options: {where}: {err['msg']}") from None


def parse_targets(text: str) -> list:
    """The targets of the job's second argument; EvalError (one line) when it is not what rpg eval wrote."""
    from rpg_cli.evaluation.job import decode_targets

    try:
        return decode_targets(text)
    except (ValueError, KeyError, TypeError) as e:
        raise EvalError(f"bad evaluation targets ({type(e).__name__}: {e}); rpg eval writes them") from None


def main(argv: list[str] | None = None) -> int:
    from rpg_cli.evaluation.pipeline import run_eval
    from rpg_cli.evaluation.plan import plan_eval
    from rpg_cli.store import StoreError

    def show(p) -> None:
        print(f"{p.label}: {p.done}/{p.total} samples scored ({p.generated} generated here)", flush=True)

    try:
        args = sys.argv[1:] if argv is None else argv
        options = parse_args(args[:1] if len(args) == 2 else args)
        plan = plan_eval(options, parse_targets(args[1]) if len(args) == 2 else None)
        for line in plan.skipped:
            print(f"skipped {line}", flush=True)
        results = run_eval(plan, on_progress=show)  # files only (pipeline.py): the job holds no store
    except (EvalError, StoreError) as e:
        print(redact(f"rpg eval: {e}"), file=sys.stderr)
        return 2
    for r in results:
        values = " ".join(f"{name} {value:.4f}" for name, value in r.values.items() if value is not None)
        print(f"{r.run} step {r.step} {r.benchmark} (k={r.k}, scorer {r.scorer}): {values}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
