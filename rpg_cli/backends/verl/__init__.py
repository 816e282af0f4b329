"""The verl backend (verl 0.9.1, FSDP + vLLM on a Ray cluster).

launch    spec -> the job's command (start, then `verl.trainer.main_ppo` overrides), resources and env (pure python)
start     the job's entrypoint: waits for the run's GPUs holding one CPU, then execs verl's main_ppo
admission the rule of that wait and the GPU leases; also verl's own check of free GPUs inside rpg's trainer
isolation each run's TransferQueue in its own Ray namespace (via plugin)
plugin    the RPG losses registered in verl, and ref_log_prob handed to them (imported by verl)
reference rpg's verl trainer and worker: the reference reset, its schedule and checkpoints (via plugin)
optim     schedule-free AdamW loadable from verl's optimizer config (imported by verl)
diagnose  submit-time plugin check and one-line reasons for failed jobs (no verl import)

Importing this package imports nothing heavy; `plugin` and `optim` import verl/torch themselves.
"""
