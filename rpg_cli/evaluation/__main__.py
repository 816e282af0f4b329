"""Entry point of an evaluation job: `python -m rpg_cli.evaluation '<EvalOptions as JSON>'`.

`rpg eval` writes the command (evaluation/job.py); the database URL comes from $RPG_EVAL_DB when the
JSON leaves it out. Progress goes to stdout, one line per problem batch; exit status 0 done, 2 bad
input (one line on stderr, passwords in URLs masked).
"""

from __future__ import annotations

import json
import os
import sys

from pydantic import ValidationError

from rpg_cli.evaluation.options import DB_ENV, EvalError, EvalOptions
from rpg_cli.store.url import redact


def parse_args(argv: list[str]) -> EvalOptions:
    """The options of the job's one argument; EvalError (one line) when it is not valid EvalOptions JSON."""
    if len(argv) != 1:
        raise EvalError("usage: python -m rpg_cli.evaluation '<EvalOptions as JSON>' (rpg eval writes it)")
    try:
        fields = json.loads(argv[0])
    except ValueError as e:
        raise EvalError(f"bad evaluation options: not JSON ({e})") from None
    if isinstance(fields, dict) and "db" not in fields and os.environ.get(DB_ENV):
        fields["db"] = os.environ[DB_ENV]
    try:
        return EvalOptions.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise EvalError(f"bad evaluation options: {where}: {err['msg']}") from None


def main(argv: list[str] | None = None) -> int:
    from rpg_cli.evaluation.pipeline import run_eval
    from rpg_cli.evaluation.plan import plan_eval
    from rpg_cli.store import StoreError, open_store

    def show(p) -> None:
        print(f"{p.label}: {p.done}/{p.total} samples scored ({p.generated} generated here)", flush=True)

    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
        plan = plan_eval(options)
        for line in plan.skipped:
            print(f"skipped {line}", flush=True)
        store = open_store(options.db)
        try:
            results = run_eval(plan, store, on_progress=show)
        finally:
            store.close()
    except (EvalError, StoreError) as e:
        print(redact(f"rpg eval: {e}"), file=sys.stderr)
        return 2
    for r in results:
        values = " ".join(f"{name} {value:.4f}" for name, value in r.values.items() if value is not None)
        print(f"{r.run} step {r.step} {r.benchmark} (k={r.k}, scorer {r.scorer}): {values}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
