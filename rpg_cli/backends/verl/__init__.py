"""The verl backend (verl 0.9.1, FSDP + vLLM on a Ray cluster).

launch    spec -> `python -m verl.trainer.main_ppo` overrides, resources and env (pure python)
plugin    the RPG losses registered in verl, and ref_log_prob handed to them (imported by verl)
reference rpg's verl trainer and worker: the reference reset, its schedule and checkpoints (via plugin)
optim     schedule-free AdamW loadable from verl's optimizer config (imported by verl)
diagnose  submit-time plugin check and one-line reasons for failed jobs (no verl import)

Importing this package imports nothing heavy; `plugin` and `optim` import verl/torch themselves.
"""
