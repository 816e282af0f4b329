"""The local backend's RL loop: one process, one device, the same spec and math as the verl backend.

Per step: reset the reference to the current policy when `rpg_cli.spec.reference.ReferenceTracker` says so
(`reference: {every: K}` / `{kl_target: ...}`), draw `train_batch_size` prompts, sample `rollout_n`
responses each, score them with `rpg_cli.rewards`, (dynamic sampling, any algorithm: draw `gen_batches`
prompt batches per round, drop groups whose accuracy is the same for every response and draw more;
overlong shaping: add the length penalty), take old log-probs (and reference log-probs unless the
reference is pi_old itself: their KL feeds the tracker and the `ref/*` metrics), compute
the spec's advantages, then `ppo_epochs` passes over mini-batches of `ppo_mini_batch_size` prompts,
each one optimizer step on `policy_loss` (plus the spec's KL loss) with gradient clipping. Validation
(k = val.n samples per distinct problem) runs before training and every val.every steps; checkpoints every
save_every steps and at the end.

Stopping on request (rundir.request_stop: a preemption's signal, which the job's entry point turns into the
request, or `rpg cancel --graceful`): after the step in progress is logged, its checkpoint is saved (the
reference and trainer state with it, as every checkpoint) if the step had none, `rundir.stopped_line` ends
metrics.jsonl, and the process exits 0; rerunning it resumes at the next step.

Schedule-free AdamW keeps two weight sequences: the optimizer is in train mode (gradient point y) only
inside the update; rollouts, old log-probs, validation and checkpoints use eval mode (the averaged x),
so the policy that samples is the one that is saved. Dropout is off throughout (the module stays in
`eval()`), as in verl's actor, so pi_theta equals pi_old at the first mini-batch.

The algorithm is read from its entry in `rpg_cli.algorithms.table`: its advantage estimator (`ADVANTAGE_FUNCTIONS`),
where beta goes (`beta_in`: "reward" folds beta * k1 into each response's reward, as verl's use_kl_in_reward does),
and its loss, `policy_loss(spec.loss_name, ...)`, or for `algorithm: custom` the spec's own function through
`custom_policy_loss` (MATH.md section 11). Rollout correction (MATH.md section 10) is accepted and changes nothing
here: rollout and training log-probs come from the same model in the same process, so every importance weight is
exactly 1 and no token is rejected.

Determinism: the spec's seed seeds what the model's initialisation may draw, every step reseeds torch
from (seed, step), and prompts come from a pure function of (seed, generation-batch counter), so a run
resumed from step N's checkpoint repeats, on CPU, exactly what an uninterrupted run computes after step N.
"""

from __future__ import annotations

import math
import random
import re
import sys
import time
from dataclasses import dataclass

import torch

from rpg_cli import custom_loss, rundir
from rpg_cli.algorithms import advantages as adv
from rpg_cli.algorithms import aggregate, kl_penalty_loss, policy_loss
from rpg_cli.algorithms.kl import reference_kl
from rpg_cli.backends.local import checkpoint as ckpt
from rpg_cli.backends.local.costs import CostMeter
from rpg_cli.backends.local.data import batch_indices, load_problems
from rpg_cli.backends.local.preflight import BackendError, Plan
from rpg_cli.backends.local.rollout import Problem, Rollouts, concat, eos_ids, generate, score_rollouts, token_log_probs
from rpg_cli.metrics import (
    ADVANTAGES,
    DIVERGED_KEYS,
    ENTROPY,
    EPOCH,
    GLOBAL_STEP,
    GRAD_NORM,
    KL_LOSS,
    LR,
    PG_LOSS,
    PROMPT_LENGTH,
    RESPONSE_CLIPPED,
    RESPONSE_LENGTH,
    REWARD,
    REWARDS,
    STEP_TIME,
    TESTING_TIME,
    TOKENS,
    VAL_AUX,
    VAL_CORE,
    loss_metrics,
    val_key,
)
from rpg_cli.spec import Every
from rpg_cli.spec.reference import ReferenceTracker
from rpg_cli.trackers import TrackerError
from rpg_cli.trackers.writers import open_run

# Sequences per forward/backward chunk are bounded by this many tokens (gradient accumulation above it).
MICRO_BATCH_TOKENS = 32_768


def log(message: str) -> None:
    print(f"[rpg local] {message}", flush=True)


def step_seed(seed: int, step: int) -> int:
    return seed * 1_000_003 + step


@dataclass
class Batch:
    """One step's training data: rollouts with their problems, scores and shaped rewards."""

    rollouts: Rollouts
    scores: torch.Tensor
    acc: torch.Tensor
    rewards: torch.Tensor
    gen_batches: int


class Trainer:
    def __init__(self, plan: Plan):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.spec, self.run_dir = plan.spec, plan.run_dir
        self.device = torch.device(plan.device)
        spec = self.spec
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, int(spec.resources.cpus)))
        resume = ckpt.latest_checkpoint(self.run_dir)
        source = str(resume[1]) if resume else spec.model
        torch.manual_seed(step_seed(spec.seed, 0))  # weights a checkpoint lacks (a new head) start from the seed
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(source, padding_side="left")
            self.model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(self.device)
        except (OSError, ValueError) as e:
            raise BackendError(
                f"model: cannot load {source} ({str(e).splitlines()[0]}); point it at an HF causal-LM directory"
            ) from None
        self.model.eval()  # dropout off (see module doc)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.eos_ids = eos_ids(self.model, self.tokenizer)
        as_spec = dict(scorers=spec.scorers, chat_template_kwargs=spec.chat_template_kwargs)
        self.train_problems = load_problems(spec.data.train_files, self.tokenizer, spec.max_prompt_length, **as_spec)
        self.val_problems = (
            load_problems(spec.data.val_files, self.tokenizer, spec.max_prompt_length, distinct=True, **as_spec)
            if spec.data.val_files
            else []
        )
        self.optimizer = make_optimizer(spec, self.model)
        self.custom = None  # the spec's own loss function (algorithm: custom)
        if spec.loss_name == custom_loss.CUSTOM_LOSS_NAME:
            try:
                self.custom = custom_loss.load(spec.loss)
            except ValueError as e:
                raise BackendError(f"loss: {e}") from None
        self.ref_model = None
        self.reference = ReferenceTracker(spec.reference)  # when pi_ref is reset, and the ref/* metrics
        if spec.reference != "iterative":  # frozen, or reset now and then: starts as the initial model
            self.ref_model = (
                AutoModelForCausalLM.from_pretrained(spec.model, dtype=torch.float32).to(self.device).eval()
            )
            self.ref_model.requires_grad_(False)
        self.start_step, self.gen_batches = 1, 0
        if resume:
            state = ckpt.load_state(resume[1])
            self.optimizer.load_state_dict(state["optimizer"])
            if state.get("ref") is not None:
                self.ref_model.load_state_dict(state["ref"])
            if state.get("reference") is not None:
                self.reference.load_state_dict(state["reference"])
            self.start_step, self.gen_batches = state["step"] + 1, state["gen_batches"]
            log(f"resuming from {resume[1].name}: continuing at step {self.start_step}")
        self.metrics = rundir.MetricsLog(rundir.metrics_path(self.run_dir), keep_through=resume[0] if resume else None)
        self.trackers = open_run(spec, self.run_dir, resumed_after=resume[0] if resume else None)
        self.costs = CostMeter(self.model, self.device, spec)  # perf/*: throughput, MFU, peak memory

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """One step's line in metrics.jsonl, and the same values to the spec's trackers."""
        self.metrics.write(step, metrics)
        if self.trackers is not None:
            self.trackers.log(step, metrics)

    # ------------------------------------------------------------------ the loop

    def fit(self, stop_after: int | None = None) -> None:
        spec = self.spec
        last = spec.steps if stop_after is None else min(spec.steps, stop_after)
        why = rundir.stop_requested(self.run_dir) if self.start_step <= spec.steps else None
        if why:  # asked while the model loaded: the checkpoint this attempt resumed from (if any) stands
            self.stop(self.start_step - 1, why)
            last = self.start_step - 1
        elif self.start_step == 1 and self.val_problems:
            torch.manual_seed(step_seed(spec.seed, 0))
            self.log_metrics(0, self.validate())
        for step in range(self.start_step, last + 1):
            started = time.perf_counter()
            self.costs.begin()
            torch.manual_seed(step_seed(spec.seed, step))
            random.seed(step_seed(spec.seed, step))
            try:
                metrics = self.train_step(step)
            except RuntimeError as exc:  # torch.multinomial on the probabilities of overflowed weights
                if not re.search(r"\b(?:inf|nan)\b", str(exc)):
                    raise
                raise BackendError(rundir.diverged(step, f"sampling met {str(exc).splitlines()[0]}")) from None
            metrics[STEP_TIME] = time.perf_counter() - started  # without validation, as verl times a step
            metrics.update(self.costs.step(metrics[TOKENS], metrics[STEP_TIME]))
            if self.val_problems and (step % spec.val.every == 0 or step == spec.steps):
                t = time.perf_counter()
                metrics.update(self.validate())
                metrics[TESTING_TIME] = time.perf_counter() - t
            # the line goes first: a crash before the checkpoint is renamed into place redoes the step
            self.log_metrics(step, metrics)
            for key in DIVERGED_KEYS:  # no checkpoint of weights a NaN has reached
                if not math.isfinite(metrics.get(key, 0.0)):
                    raise BackendError(rundir.diverged(step, f"{key} is {metrics[key]}"))
            if not bool(torch.stack([p.isfinite().all() for p in self.model.parameters()]).all()):
                raise BackendError(rundir.diverged(step, "the update left non-finite weights"))
            why = rundir.stop_requested(self.run_dir) if step < spec.steps else None  # the last step ends it anyway
            if step % spec.save_every == 0 or step == spec.steps or why:
                self.save(step)
            log(
                f"step {step}/{spec.steps} score {metrics[REWARD]:+.3f} "
                f"pg_loss {metrics[PG_LOSS]:+.4f} {metrics[STEP_TIME]:.2f}s"
                + "".join(f" {k} {v:.3f}" for k, v in metrics.items() if k.startswith(f"{VAL_CORE}/"))
            )
            if why:
                self.stop(step, why)
                break
        if self.trackers is not None:
            self.trackers.close()

    def stop(self, step: int, why: str) -> None:
        """End the attempt on request after step `step`, whose checkpoint is on disk (none for step 0): the
        stopped line closes metrics.jsonl (the orchestrator reads it: orchestration/stops.py)."""
        rundir.append_line(self.metrics.path, rundir.stopped_line(step, why))
        log(f"stopped after step {step} ({why}): rerunning this job resumes at step {step + 1}")

    def train_step(self, step: int) -> dict[str, float]:
        spec, timing = self.spec, {}
        self._eval_weights()
        if self.reference.begin_step(step) and self.ref_model is not None:
            self.ref_model.load_state_dict(self.model.state_dict())  # reset pi_ref to the current policy
        t = time.perf_counter()
        batch = self.sample_batch()
        timing["timing_s/gen"] = time.perf_counter() - t
        r = batch.rollouts
        t = time.perf_counter()
        old_log_prob = self.forward_log_probs(self.model, r)
        timing["timing_s/old_log_prob"] = time.perf_counter() - t
        ref_log_prob = None
        if self.ref_model is not None:
            t = time.perf_counter()
            ref_log_prob = self.forward_log_probs(self.ref_model, r)
            timing["timing_s/ref"] = time.perf_counter() - t
        # the step's KL to its reference (0 for the iterative one, pi_ref = pi_old): the KL trigger's input
        self.reference.observe(
            0.0 if ref_log_prob is None else reference_kl(old_log_prob, ref_log_prob, r.response_mask)
        )
        t = time.perf_counter()
        rewards = batch.rewards
        extra: dict[str, float] = {}
        if self.beta_in_reward and ref_log_prob is not None:
            # KL in the reward (verl's use_kl_in_reward): R - beta * sum of the per-token k1 penalties
            k1 = adv.reward_kl_penalty(old_log_prob, ref_log_prob, r.response_mask)
            extra["actor/reward_kl_penalty"] = float(k1.sum() / r.response_mask.sum())
            extra["actor/reward_kl_penalty_coeff"] = spec.beta
            rewards = rewards - spec.beta * k1.sum(-1).to(rewards.device)
        advantages = self.advantages(batch, rewards, old_log_prob, ref_log_prob)
        timing["timing_s/adv"] = time.perf_counter() - t
        t = time.perf_counter()
        self._train_weights()
        actor = self.update(step, r, old_log_prob, ref_log_prob, advantages)
        self._eval_weights()
        timing["timing_s/update_actor"] = time.perf_counter() - t
        seqlens = (r.prompt_mask.sum(-1) + r.response_mask.sum(-1)).tolist()
        extra.update(self.costs.update(seqlens, spec.ppo_epochs, timing["timing_s/update_actor"]))  # MFU (CUDA)
        return {
            **actor,
            **extra,
            **batch_metrics(batch, rewards, advantages, self.max_new_tokens(r)),
            **timing,
            **self.reference.metrics(step),
            "train/num_gen_batches": float(batch.gen_batches),
            GLOBAL_STEP: float(step),
            EPOCH: float(self.gen_batches * spec.train_batch_size // len(self.train_problems)),
        }

    # ------------------------------------------------------------------ pieces of a step

    def sample_batch(self) -> Batch:
        """Rollouts of the next prompt batch; with dynamic sampling, of enough informative groups."""
        spec = self.spec
        sampling = spec.dynamic_sampling
        per_round = sampling.gen_batches if sampling is not None else 1
        kept: list[tuple[Rollouts, torch.Tensor, torch.Tensor]] = []
        groups, generated = 0, 0
        while True:
            problems = [
                self.train_problems[i]
                for b in range(self.gen_batches, self.gen_batches + per_round)
                for i in batch_indices(b, spec.train_batch_size, len(self.train_problems), spec.seed)
            ]
            self.gen_batches += per_round
            generated += 1
            r = self.rollout(problems, spec.rollout_n, spec.rollout.temperature, spec.rollout.top_p)
            scores, acc = score_rollouts(r, problems)
            r.group = r.group + (self.gen_batches - per_round) * spec.train_batch_size  # unique across rounds
            if sampling is None:
                kept.append((r, scores, acc))
                break
            keep = adv.dynamic_sampling_keep(acc, r.group).nonzero().squeeze(-1)  # filter metric: raw accuracy
            if len(keep):
                kept.append((r.select(keep), scores[keep], acc[keep]))
                groups += len(keep) // spec.rollout_n
            if groups >= spec.train_batch_size or (
                sampling.max_num_gen_batches and generated >= sampling.max_num_gen_batches
            ):
                break
        if not kept:  # every group uniform: train on the last round's first batch as is (group advantages 0)
            first = torch.arange(spec.train_batch_size * spec.rollout_n)
            kept.append((r.select(first), scores[first], acc[first]))
        r = concat([k[0] for k in kept], self.tokenizer.pad_token_id)
        scores, acc = torch.cat([k[1] for k in kept]), torch.cat([k[2] for k in kept])
        if len(r.texts) > spec.train_batch_size * spec.rollout_n:
            first = torch.arange(spec.train_batch_size * spec.rollout_n)  # verl keeps the first full batch
            r, scores, acc = r.select(first), scores[first], acc[first]
        rewards = scores.clone()
        if spec.overlong is not None:
            budget = self.max_new_tokens(r)
            lengths = r.response_mask.sum(-1).cpu()
            rewards = rewards + adv.overlong_penalty(
                lengths, budget, min(spec.overlong.buffer, budget), spec.overlong.penalty_factor
            )
        return Batch(r, scores, acc, rewards, generated)

    @property
    def beta_in_reward(self) -> bool:
        """Whether beta weighs a k1 penalty folded into the reward (the table's `beta_in`), not a loss term."""
        return self.spec.kl_in_reward

    def advantages(
        self, batch: Batch, rewards: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor | None
    ) -> torch.Tensor:
        """The spec's advantages (`advantages.ESTIMATORS[spec.advantage_estimator]`) of `rewards`, one per response
        net of any KL penalty; REINFORCE++ folds the per-token k1 penalty into the batch's scores itself."""
        spec, r = self.spec, batch.rollouts
        estimator = adv.ESTIMATORS.get(spec.advantage_estimator)
        if estimator is None:
            raise BackendError(
                f"advantage estimator {spec.advantage_estimator!r} is not supported by the local backend; "
                f"allowed: {', '.join(adv.ESTIMATORS)}"
            )
        inputs = adv.AdvantageInputs(
            rewards=rewards.to(self.device),
            scores=batch.rewards.to(self.device),
            group=r.group,
            mask=r.response_mask,
            old_log_prob=old_log_prob,
            ref_log_prob=ref_log_prob if ref_log_prob is not None else old_log_prob,
            beta=spec.beta if self.beta_in_reward else 0.0,
        )
        return estimator(inputs)

    def update(self, step: int, r: Rollouts, old_log_prob, ref_log_prob, advantages) -> dict[str, float]:
        """ppo_epochs passes over mini-batches of ppo_mini_batch_size prompts, one optimizer step each."""
        spec = self.spec
        mini = spec.ppo_mini_batch_size * spec.rollout_n
        lr = spec.lr
        if spec.optimizer == "adamw" and spec.lr_warmup_steps:
            lr = spec.lr * min(1.0, step / spec.lr_warmup_steps)  # verl's constant schedule with linear warmup
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        sums: dict[str, list[float]] = {}
        for _ in range(spec.ppo_epochs):
            for start in range(0, len(r.texts), mini):
                index = torch.arange(start, min(start + mini, len(r.texts)), device=self.device)
                self.optimizer.zero_grad(set_to_none=True)
                for micro in self.micro_batches(r, index):
                    part = r.select(micro)
                    weight = len(micro) / len(index)
                    log_prob, entropy = token_log_probs(
                        self.model,
                        part,
                        spec.rollout.temperature,
                        with_entropy=True,
                        entropy_grad=bool(spec.entropy_coeff),
                        autocast=self.device.type == "cuda",
                    )
                    tensors = self.normalised_width(
                        r,
                        log_prob=log_prob,
                        old_log_prob=old_log_prob[micro],
                        advantages=advantages[micro],
                        response_mask=part.response_mask,
                        ref_log_prob=None if ref_log_prob is None else ref_log_prob[micro],
                        entropy=entropy,
                    )
                    entropy, mask = tensors.pop("entropy"), tensors["response_mask"]
                    loss, m = self.policy_loss(**tensors)
                    entropy_mean = aggregate(entropy, mask.bool(), spec.loss_agg_mode)
                    if spec.entropy_coeff:
                        loss = loss - spec.entropy_coeff * entropy_mean
                    kl_loss = None
                    if spec.kl_loss is not None:  # toward the frozen model, or pi_old for the iterative reference
                        reference = tensors["ref_log_prob"]
                        kl_value = kl_penalty_loss(
                            spec.kl_loss.estimator,
                            log_prob=tensors["log_prob"],
                            ref_log_prob=tensors["old_log_prob"] if reference is None else reference,
                            response_mask=mask,
                            loss_agg_mode=spec.loss_agg_mode,
                        )
                        loss = loss + spec.kl_loss.coef * kl_value
                        kl_loss = float(kl_value.detach())
                    (loss * weight).backward()
                    values = {**loss_metrics(m), ENTROPY: float(entropy_mean.detach())}
                    if kl_loss is not None:  # as on verl, only where the spec has one
                        values[KL_LOSS] = kl_loss
                    record(sums, values)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), spec.grad_clip))
                if math.isfinite(grad_norm):  # verl skips the step on a non-finite gradient
                    self.optimizer.step()
                record(sums, {GRAD_NORM: grad_norm})
        out = {k: sum(v) / len(v) for k, v in sums.items()}
        out[LR] = lr
        return out

    def normalised_width(self, r: Rollouts, **tensors: torch.Tensor | None) -> dict[str, torch.Tensor | None]:
        """A micro-batch's per-token tensors, right-padded to the response budget under seq-mean-token-sum-norm:
        Dr. GRPO divides each sequence's token sum by that constant (MATH.md section 9.1; verl's
        `loss_scale_factor`, which rpg sets to it), and `aggregate` divides by the tensors' width. The padding is
        masked out (every loss neutralises it); other modes are left as they are."""
        budget = self.max_new_tokens(r)
        width = tensors["response_mask"].shape[-1]
        if self.spec.loss_agg_mode != "seq-mean-token-sum-norm" or width >= budget:
            return tensors
        pad = budget - width
        return {k: None if v is None else torch.nn.functional.pad(v, (0, pad)) for k, v in tensors.items()}

    def policy_loss(self, **tensors: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        """The spec's loss of one micro-batch and its metrics: `policy_loss(spec.loss_name, ...)` with the spec's clip,
        beta and SAPO's temperatures, or the spec's own function (`custom_policy_loss`, with its settings)."""
        spec = self.spec
        if self.custom is not None:
            from rpg_cli.algorithms.custom import custom_policy_loss

            return custom_policy_loss(
                self.custom, **tensors, settings=dict(spec.loss_settings), loss_agg_mode=spec.loss_agg_mode
            )
        clip = spec.clip
        # an unclipped run leaves the bounds to the loss's defaults (unused without a clip)
        bounds = dict(eps_low=clip.eps_low, eps_high=clip.eps_high, clip_c=clip.c) if clip else {}
        taus = dict(tau_pos=spec.sapo.tau_pos, tau_neg=spec.sapo.tau_neg) if spec.sapo is not None else {}
        return policy_loss(
            spec.loss_name,
            **tensors,
            beta=spec.beta,
            clip=clip is not None,
            **bounds,
            **taus,
            loss_agg_mode=spec.loss_agg_mode,
            clipped_weight=bool(clip and clip.clipped_weight_in_sg),
            kl_clamp=spec.kl_clamp,
        )

    def validate(self) -> dict[str, float]:
        """mean@k of accuracy (and score) per data source, k = val.n samples per problem."""
        spec = self.spec
        self._eval_weights()
        r = self.rollout(self.val_problems, spec.val.n, spec.val.temperature, spec.val.top_p)
        scores, acc = score_rollouts(r, self.val_problems)
        sources = [self.val_problems[g].data_source for g in r.group.tolist()]
        out: dict[str, float] = {}
        for source in sorted(set(sources)):
            rows = torch.tensor([s == source for s in sources])
            k = spec.val.n
            out[val_key(source, k)] = float(acc[rows].mean())
            out[val_key(source, k, "score", VAL_AUX)] = float(scores[rows].mean())
            out[f"val-aux/{source}/response_length/mean"] = float(
                r.response_mask[rows.to(self.device)].sum(-1).float().mean()
            )
        return out

    def save(self, step: int) -> None:
        self._eval_weights()
        resets = isinstance(self.spec.reference, Every)  # the reference may be neither the initial model nor the policy
        state = {
            "step": step,
            "gen_batches": self.gen_batches,
            "optimizer": self.optimizer.state_dict(),
            "ref": self.ref_model.state_dict() if resets else None,
            "reference": self.reference.state_dict(),
            "run_id": self.spec.run_id,
        }
        ckpt.save_checkpoint(self.run_dir, step, self.model, self.tokenizer, state)
        rundir.prune_checkpoints(self.run_dir, self.spec.checkpoints.keep, self.spec.checkpoints.weights)

    # ------------------------------------------------------------------ helpers

    def rollout(self, problems: list[Problem], n: int, temperature: float, top_p: float) -> Rollouts:
        longest = max(len(p.prompt_ids) for p in problems)
        return generate(
            self.model,
            self.tokenizer,
            problems,
            n,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=self.response_budget(longest),
            eos_ids=self.eos_ids,
            device=self.device,
        )

    def response_budget(self, prompt_length: int) -> int:
        """The spec's response length, within the model's position limit."""
        limit = getattr(self.model.config, "max_position_embeddings", None)
        budget = self.spec.max_response_length
        return max(1, min(budget, limit - prompt_length)) if limit else budget

    def max_new_tokens(self, r: Rollouts) -> int:
        return self.response_budget(r.prompt_ids.shape[1])

    def micro_batches(self, r: Rollouts, index: torch.Tensor) -> list[torch.Tensor]:
        width = r.prompt_ids.shape[1] + r.response_ids.shape[1]
        size = max(1, MICRO_BATCH_TOKENS // width)
        return list(index.split(size))

    @torch.no_grad()
    def forward_log_probs(self, model, r: Rollouts) -> torch.Tensor:
        index = torch.arange(len(r.texts), device=self.device)
        parts = [
            token_log_probs(model, r.select(m), self.spec.rollout.temperature, autocast=self.device.type == "cuda")[0]
            for m in self.micro_batches(r, index)
        ]
        return torch.cat(parts)

    def _eval_weights(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def _train_weights(self) -> None:
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()


def make_optimizer(spec, model) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if spec.optimizer == "schedule_free":
        from schedulefree import AdamWScheduleFree

        return AdamWScheduleFree(params, lr=spec.lr, weight_decay=spec.weight_decay, warmup_steps=spec.lr_warmup_steps)
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)


def record(sums: dict[str, list[float]], values: dict[str, float]) -> None:
    for key, value in values.items():
        sums.setdefault(key, []).append(float(value))


def batch_metrics(batch: Batch, rewards: torch.Tensor, advantages: torch.Tensor, budget: int) -> dict[str, float]:
    r = batch.rollouts
    mask = r.response_mask.bool()
    length = r.response_mask.sum(-1).float()
    prompt_length = r.prompt_mask.sum(-1).float()
    valid_adv = advantages[mask]
    out = {
        REWARD: batch.scores.mean(),
        "critic/score/max": batch.scores.max(),
        "critic/score/min": batch.scores.min(),
        REWARDS: rewards.mean(),
        "critic/rewards/max": rewards.max(),
        "critic/rewards/min": rewards.min(),
        ADVANTAGES: valid_adv.mean(),
        "critic/advantages/max": valid_adv.max(),
        "critic/advantages/min": valid_adv.min(),
        "train/acc/mean": batch.acc.mean(),
        RESPONSE_LENGTH: length.mean(),
        "response_length/max": length.max(),
        "response_length/min": length.min(),
        RESPONSE_CLIPPED: (length >= budget).float().mean(),
        PROMPT_LENGTH: prompt_length.mean(),
        "prompt_length/max": prompt_length.max(),
        "prompt_length/min": prompt_length.min(),
        TOKENS: length.sum() + prompt_length.sum(),
    }
    return {k: float(v) for k, v in out.items()}


def main(spec_path: str, stop_after: int | None = None) -> int:
    """Check, then train; returns the process exit status (2: the spec or machine cannot be honoured)."""
    from rpg_cli.backends.local.preflight import check

    try:
        plan = check(spec_path)
        for note in plan.notes:
            log(f"note: {note}")
        trainer = Trainer(plan)
        log(
            f"{plan.spec.run_name}: {plan.spec.algorithm} ({plan.spec.loss_name}) on {plan.device}, "
            f"{len(trainer.train_problems)} training prompts, steps {trainer.start_step}..{plan.spec.steps}"
        )
        trainer.fit(stop_after)
    except (BackendError, TrackerError) as e:
        print(f"rpg local backend: {e}", file=sys.stderr, flush=True)
        return 2
    return 0
