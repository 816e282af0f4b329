"""Entry point of an evaluation job: `python -m rpg_cli.evaluation RUN_OR_CHECKPOINT [options]`.

The options are `rpg eval`'s (EvalOptions.to_argv writes them). Progress goes to stdout, one line per
problem batch; exit status 0 done, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys

from rpg_cli.evaluation.plan import DEFAULT_BENCHMARKS, EvalError, EvalOptions


def parse_args(argv: list[str] | None = None) -> EvalOptions:
    defaults = EvalOptions(ref="")
    parser = argparse.ArgumentParser(prog="python -m rpg_cli.evaluation", description=__doc__.splitlines()[0])
    parser.add_argument("ref", metavar="RUN_OR_CHECKPOINT")
    parser.add_argument("--benchmarks", default=",".join(DEFAULT_BENCHMARKS))
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--steps", default=defaults.steps)
    parser.add_argument("--scorer", default=defaults.scorer)
    parser.add_argument("--data-dir", default=defaults.data_dir)
    parser.add_argument("--db", default=defaults.db)
    parser.add_argument("--runs-dir", default=defaults.runs_dir)
    parser.add_argument("--engine", default=defaults.engine)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = vars(parser.parse_args(argv))
    args["benchmarks"] = tuple(b.strip() for b in args["benchmarks"].split(",") if b.strip())
    return EvalOptions(**args)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    from rpg_cli.evaluation.pipeline import run_eval
    from rpg_cli.evaluation.plan import plan_eval
    from rpg_cli.store import StoreError, open_store

    def show(p) -> None:
        print(f"{p.label}: {p.done}/{p.total} samples scored ({p.generated} generated here)", flush=True)

    try:
        plan = plan_eval(options)
        for line in plan.skipped:
            print(f"skipped {line}", flush=True)
        store = open_store(options.db)
        try:
            results = run_eval(plan, store, on_progress=show)
        finally:
            store.close()
    except (EvalError, StoreError) as e:
        print(f"rpg eval: {e}", file=sys.stderr)
        return 2
    for r in results:
        values = " ".join(f"{name} {value:.4f}" for name, value in r.values.items() if value is not None)
        print(f"{r.run} step {r.step} {r.benchmark} (k={r.k}): {values}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
