"""Local backend speed: rollout and training tokens/s on the toy task, against TRL's GRPOTrainer.

Both trainers get the same tiny model, prompts, batch (8 prompts x 8 samples = 64 sequences, one
optimizer step per batch), sampling (temperature 1, top-p 1, no top-k), response budget (27 tokens)
and learning rate, on the CPU with one thread. Rollout tokens/s = response tokens sampled / time in
`generate`; training tokens/s = prompt + response tokens / the rest of the step (log-probs, loss,
backward, optimizer). TRL is measured only when it is installed (pip install trl); its generate
call is timed by wrapping the model's `generate`. Target: at least as fast as TRL (ratio >= 1).

    python benchmarks/bench_local.py [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

PROMPTS, SAMPLES, BUDGET, LR, WARMUP = 8, 8, 27, 5e-4, 3  # BUDGET: the toy's 32 positions less its 5-token prompts


def ours(toy, work: Path, steps: int) -> dict[str, float]:
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
    run = work / "ours"
    run.mkdir()
    (run / "spec.json").write_text(json.dumps(spec.canonical()))
    assert main(str(run / "spec.json")) == 0
    lines = [json.loads(line)["data"] for line in (run / "metrics.jsonl").read_text().splitlines()][WARMUP:]
    gen_tokens = sum(d["response_length/mean"] * PROMPTS * SAMPLES for d in lines)
    all_tokens = sum(d["perf/total_num_tokens"] for d in lines)
    gen_time = sum(d["timing_s/gen"] for d in lines)
    step_time = sum(d["timing_s/step"] for d in lines)
    return {
        "rollout": gen_tokens / gen_time,
        "train": all_tokens / (step_time - gen_time),
        "step_s": step_time / len(lines),
    }


def trl(toy, work: Path, steps: int) -> dict[str, float] | None:
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
    rows = pq.read_table(toy.train).to_pylist()
    data = datasets.Dataset.from_list(
        [{"prompt": r["prompt"][0]["content"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows] * 50
    )
    timings = {"gen": [], "gen_tokens": [], "tokens": [], "step": []}
    generate = model.generate
    eos = tokenizer.eos_token_id

    def timed_generate(*args, **kwargs):
        started = time.perf_counter()
        out = generate(*args, **kwargs)
        timings["gen"].append(time.perf_counter() - started)
        prompt_width = (kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).shape[1]
        completion = out[:, prompt_width:]
        after_eos = ((completion == eos).long().cumsum(-1) - (completion == eos).long()) > 0
        timings["gen_tokens"].append(int((~after_eos).sum()))
        timings["tokens"].append(
            int((~after_eos).sum()) + int(kwargs["attention_mask"].sum()) if "attention_mask" in kwargs else 0
        )
        return out

    model.generate = timed_generate

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            timings["step"].append(time.perf_counter() - self.started)

    def reward(prompts, completions, ground_truth, **_):
        return [score(c, gt)["score"] for c, gt in zip(completions, ground_truth)]

    args = GRPOConfig(
        output_dir=str(work / "trl"),
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
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    trainer.train()
    gen, gen_tokens, tokens, step = (timings[k][WARMUP:] for k in ("gen", "gen_tokens", "tokens", "step"))
    return {
        "rollout": sum(gen_tokens) / sum(gen),
        "train": sum(tokens) / (sum(step) - sum(gen)),
        "step_s": statistics.mean(step),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from rpg_cli.datasets.toy import write_toy

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        toy = write_toy(work / "toy")
        mine = ours(toy, work, args.steps)
        theirs = trl(toy, work, args.steps)
    print(
        f"local backend vs TRL GRPOTrainer: tiny toy model, {PROMPTS}x{SAMPLES} sequences/step, "
        f"{args.steps} timed steps, CPU, 1 thread"
    )
    print(f"{'figure':<22}{'local':>12}{'TRL':>12}{'ratio':>10}  target")
    for key, label in (("rollout", "rollout tokens/s"), ("train", "training tokens/s"), ("step_s", "seconds/step")):
        if theirs is None:
            print(f"{label:<22}{mine[key]:>12.1f}{'n/a':>12}{'n/a':>10}  (TRL not installed)")
            continue
        ratio = mine[key] / theirs[key] if key != "step_s" else theirs[key] / mine[key]
        print(
            f"{label:<22}{mine[key]:>12.1f}{theirs[key]:>12.1f}{ratio:>9.2f}x  >= 1.00x {'ok' if ratio >= 1 else 'BELOW'}"
        )


if __name__ == "__main__":
    main()
