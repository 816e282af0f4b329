"""Local backend speed: rollout and training tokens/s on the toy task, against TRL's GRPOTrainer.

Both trainers get the same tiny model, the same prompts at every step, batch (8 prompts x 8 samples =
64 sequences, one optimizer step per batch), sampling (temperature 1, top-p 1, no top-k), response
budget (27 tokens), learning rate (one too small to move the weights: see LR) and precision (float32:
TRL's own defaults, bf16 autocast and gradient checkpointing, are turned off, as the local backend on a
CPU uses neither), on the CPU with one thread.

Both trainers' `generate` calls are timed and counted alike, by wrapping transformers'
`GenerationMixin.generate` (the local backend's own timing_s/gen also covers decoding and scoring, which
TRL does outside generate). Rollout tokens/s = 64 x the decode steps / time in `generate`: generate loops
until the batch's longest response ends, and one of 64 samples that never stops costs the whole budget,
so the tokens sampled (printed: sampled tokens/s) follow the luck of a few batches more than the
trainer's speed. Training tokens/s = prompt + sampled tokens / the rest of the step (decoding, rewards,
log-probs, loss, backward, optimizer). The trainers run alternately, --rounds
times each, and each keeps its best round (by seconds per step), so that load from other processes
falls on both alike. TRL is measured only when it is installed (the `bench` extra). Target: at least as
fast as TRL (ratio >= 1), printed; the exit status is 0 unless a trainer fails.

    python benchmarks/bench_local.py [--steps 50] [--rounds 2]

BENCH_QUICK=1: 2 timed steps, one round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

PROMPTS, SAMPLES, BUDGET, WARMUP = 8, 8, 27, 3  # BUDGET: the toy's 32 positions less its 5-token prompts
# A learning rate too small to move the weights: every step still computes all it would (the optimizer
# included), but neither model drifts, so both sample from the toy model's own distribution throughout
# and a batch's length (generate's decode steps) is the same luck for both. At a real rate the two
# trainers' models learn apart (their losses' defaults differ) and one may sample longer batches.
LR = 1e-12
QUICK = os.environ.get("BENCH_QUICK") == "1"  # CI: a few steps, one round


class GenerateTimer:
    """Times every call of transformers' `generate` (both trainers sample through it) and counts its tokens:
    sampled (through the first end-of-sequence token) and prompt (the attention mask's)."""

    def __init__(self, eos_id: int):
        self.eos_id = eos_id
        self.calls: list[tuple[float, int, int, int]] = []  # (seconds, sampled tokens, prompt tokens, decode steps)

    def __enter__(self) -> GenerateTimer:
        from transformers.generation.utils import GenerationMixin

        self.original = original = GenerationMixin.generate

        def timed(model, *args, **kwargs):
            started = time.perf_counter()
            out = original(model, *args, **kwargs)
            elapsed = time.perf_counter() - started
            ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
            sequences = out if isinstance(out, torch.Tensor) else out.sequences
            completion = sequences[:, ids.shape[1] :]
            eos = (completion == self.eos_id).long()
            sampled = int(((eos.cumsum(-1) - eos) == 0).sum())  # up to and including the first eos
            prompt = int(kwargs["attention_mask"].sum()) if "attention_mask" in kwargs else ids.numel()
            self.calls.append((elapsed, sampled, prompt, completion.shape[1]))
            return out

        GenerationMixin.generate = timed
        return self

    def __exit__(self, *_) -> None:
        from transformers.generation.utils import GenerationMixin

        GenerationMixin.generate = self.original


def figures(calls: list[tuple[float, int, int, int]], step_s: list[float]) -> dict[str, float]:
    """Rollout and training tokens/s, seconds/step and the mean response of the timed steps (one generate
    call a step: the batch's 64 sequences)."""
    if len(calls) != len(step_s):
        raise RuntimeError(f"{len(calls)} generate calls for {len(step_s)} steps: expected one a step")
    gen = sum(c[0] for c in calls)
    sampled = sum(c[1] for c in calls)
    prompt = sum(c[2] for c in calls)
    decode_steps = sum(c[3] for c in calls)
    return {
        "rollout": PROMPTS * SAMPLES * decode_steps / gen,
        "sampled": sampled / gen,
        "train": (sampled + prompt) / (sum(step_s) - gen),
        "step_s": statistics.mean(step_s),
        "response": sampled / (len(calls) * PROMPTS * SAMPLES),
        "prompt": prompt / (len(calls) * PROMPTS * SAMPLES),
        "decode_steps": decode_steps / len(calls),
    }


def ours(toy, work: Path, steps: int, name: str = "ours") -> dict[str, float]:
    from rpg_cli.backends.local.trainer import main
    from rpg_cli.spec import ExperimentSpec

    spec = ExperimentSpec.model_validate(
        dict(
            algorithm="grpo",
            beta=0.0,
            clip={"eps_low": 0.2, "eps_high": 0.28},
            optimizer="adamw",
            context="2k",
            model=str(toy.model),
            data={"train_files": [str(toy.train)]},
            train_batch_size=PROMPTS,
            rollout_n=SAMPLES,
            ppo_mini_batch_size=PROMPTS,
            lr=LR,
            steps=steps + WARMUP,
            seed=0,
            save_every=10_000,
            backend="local",
            rollout={"temperature": 1.0, "top_p": 1.0, "engine": "hf"},
            resources={"nodes": 1, "gpus_per_node": 0, "cpus": 1},
        )
    )
    run = work / name
    run.mkdir()
    (run / "spec.json").write_text(json.dumps(spec.canonical()))
    with GenerateTimer(toy_eos(toy)) as timer:
        assert main(str(run / "spec.json")) == 0
    lines = [json.loads(line)["data"] for line in (run / "metrics.jsonl").read_text().splitlines()][WARMUP:]
    return figures(timer.calls[WARMUP:], [d["timing_s/step"] for d in lines])


def toy_eos(toy) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(toy.model).eos_token_id


def trl(toy, work: Path, steps: int, name: str = "trl") -> dict[str, float] | None:
    try:
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        return None
    import datasets
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from rpg_cli.rewards import score

    tokenizer = AutoTokenizer.from_pretrained(toy.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(toy.model, dtype=torch.float32)
    from rpg_cli.backends.local.data import batch_indices

    rows = pq.read_table(toy.train).to_pylist()
    order = [i for b in range(steps + WARMUP) for i in batch_indices(b, PROMPTS, len(rows), seed=0)]
    data = datasets.Dataset.from_list(  # the local backend's batches, step by step (shuffle_dataset=False below)
        [
            {"prompt": rows[i]["prompt"][0]["content"], "ground_truth": rows[i]["reward_model"]["ground_truth"]}
            for i in order
        ]
    )
    steps_s: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            steps_s.append(time.perf_counter() - self.started)

    def reward(prompts, completions, ground_truth, **_):
        return [score(c, gt)["score"] for c, gt in zip(completions, ground_truth)]

    args = GRPOConfig(
        output_dir=str(work / name),
        per_device_train_batch_size=PROMPTS * SAMPLES,
        num_generations=SAMPLES,
        max_completion_length=BUDGET,
        learning_rate=LR,
        max_steps=steps + WARMUP,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=10_000,
        seed=0,
        gradient_accumulation_steps=1,
        disable_tqdm=True,
        shuffle_dataset=False,  # the same prompts at every step as the local backend
        bf16=False,  # TRL's default (True) autocasts to bf16; the local backend computes in float32 on a CPU
        gradient_checkpointing=False,  # TRL's default (True) recomputes activations in backward; the local backend does not
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    with GenerateTimer(tokenizer.eos_token_id) as timer:
        trainer.train()
    return figures(timer.calls[WARMUP:], steps_s[WARMUP:])


def best(results: list[dict[str, float] | None]) -> dict[str, float] | None:
    """The round with the fewest seconds per step (the one least slowed by other load)."""
    found = [r for r in results if r is not None]
    return min(found, key=lambda r: r["step_s"]) if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2 if QUICK else 50)
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 2, help="alternating runs of each trainer")
    args = parser.parse_args()
    if QUICK:
        print("BENCH_QUICK=1: a few steps, one round; the ratios mean little at this size and are not judged")
    torch.set_num_threads(1)
    from rpg_cli.datasets.toy import write_toy

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        toy = write_toy(work / "toy")
        mine, theirs = [], []
        for i in range(args.rounds):
            mine.append(ours(toy, work, args.steps, f"ours{i}"))
            theirs.append(trl(toy, work, args.steps, f"trl{i}"))
        mine, theirs = best(mine), best(theirs)
    print(
        f"local backend vs TRL GRPOTrainer: tiny toy model, {PROMPTS}x{SAMPLES} sequences/step, "
        f"{args.steps} timed steps, best of {args.rounds} round(s), CPU, 1 thread, float32"
    )
    print(f"{'figure':<24}{'local':>12}{'TRL':>12}{'ratio':>10}  target")
    for key, label in (("rollout", "rollout tokens/s"), ("train", "training tokens/s"), ("step_s", "seconds/step")):
        if theirs is None:
            print(f"{label:<24}{mine[key]:>12.3f}{'n/a':>12}{'n/a':>10}  (TRL not installed)")
            continue
        ratio = mine[key] / theirs[key] if key != "step_s" else theirs[key] / mine[key]
        print(
            f"{label:<24}{mine[key]:>12.3f}{theirs[key]:>12.3f}{ratio:>9.2f}x  >= 1.00x {'ok' if ratio >= 1 else 'BELOW'}"
        )
    if theirs is not None:
        for key, label in (
            ("sampled", "sampled tokens/s"),
            ("prompt", "mean prompt tokens"),
            ("response", "mean response tokens"),
            ("decode_steps", "decode steps per batch"),
        ):
            print(f"{label:<24}{mine[key]:>12.2f}{theirs[key]:>12.2f}  (not a target)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
