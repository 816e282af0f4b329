"""`rpg eval`: checkpoints -> k samples per problem -> scored samples -> results store.

    plan = plan_eval(EvalOptions(ref="runs/paper/rpg-...", benchmarks=("aime24",), k=32))
    run_eval(plan, store)                  # in this process (what the Ray job runs, and `--local`)

`plan` resolves what to evaluate (runs, checkpoints, benchmark files, sampling settings) and checks
every input without importing torch; `generation` samples with vLLM or transformers; `pipeline`
scores, stores every sample and the accuracy@k metrics (rpg_cli.evaluate), and resumes;
`verl_val` ingests the validation metrics a training run logged itself; `job` runs an evaluation
as a Ray job. The job's entry point is `python -m rpg_cli.evaluation`.
"""

from rpg_cli.evaluation.plan import EvalError, EvalOptions, EvalPlan, plan_eval
from rpg_cli.evaluation.verl_val import ingest_verl_val_metrics

__all__ = ["EvalError", "EvalOptions", "EvalPlan", "ingest_verl_val_metrics", "plan_eval"]
