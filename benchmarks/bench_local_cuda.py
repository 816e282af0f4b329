"""The local backend on one CUDA GPU (bf16 autocast, fp32 weights): it learns as on the CPU, and how fast.

1. Learning: the toy task (`rpg prepare-data --toy`), GRPO as in experiments/smoke-seeds.yaml (300 steps of
   8 prompts x 8 samples), once on the GPU and once on this machine's CPU: held-out validation accuracy
   (mean@8) at the start and the end, and seconds per step. Target: the GPU run gains as the CPU run does
   (within 0.15: two trajectories of one seed differ once bf16 rounds differently).
2. Throughput: a randomly initialised Llama (hidden 1024, 16 layers, about 200M parameters) over the toy
   vocabulary, 8 prompts x 8 samples, 512-token responses (its end-of-sequence logit held at 0 among sharp random
   ones, so it seldom stops), a few steps on
   the GPU: rollout tokens/s (transformers' generate), training tokens/s, peak GPU memory.

Where no CUDA GPU is visible (the CI machines) it prints that it skipped.

    python benchmarks/bench_local_cuda.py [--steps 300] [--big-steps 4]

BENCH_QUICK=1: 20 toy steps, 3 big ones (what runs, not what it learns).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

PROMPTS, SAMPLES, LR = 8, 8, 5e-4
QUICK = os.environ.get("BENCH_QUICK") == "1"  # CI: tiny sizes, timings printed but not judged
BIG = dict(
    hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=8
)
BIG_RESPONSE = 512
SHARP = 10  # lm_head scale: logits of std ~6 at hidden 1024


def run(work: Path, name: str, model: Path, toy, steps: int, gpu: bool, **changes) -> list[dict]:
    """One local-backend run in this process; its metrics.jsonl as {step, data} lines, restarts applied."""
    from rpg_cli.backends.local.trainer import main
    from rpg_cli.spec import ExperimentSpec
    from rpg_cli.store.ingest import metrics_view

    spec = ExperimentSpec.model_validate(
        {
            "algorithm": "grpo",
            "reference": "frozen",
            "beta": 1e-3,
            "clip": {"eps_low": 0.2, "eps_high": 0.28, "c": 10.0},
            "optimizer": "adamw",
            "context": "2k",
            "model": str(model),
            "data": {"train_files": [str(toy.train)], "val_files": [str(toy.val)]},
            "train_batch_size": PROMPTS,
            "rollout_n": SAMPLES,
            "ppo_mini_batch_size": PROMPTS // 2,
            "lr": LR,
            "steps": steps,
            "seed": 0,
            "val": {"n": 8, "every": steps, "temperature": 1.0, "top_p": 1.0},
            "rollout": {"temperature": 1.0, "top_p": 1.0, "engine": "hf"},
            "save_every": 10_000,
            "backend": "local",
            "resources": {"nodes": 1, "gpus_per_node": int(gpu), "cpus": os.cpu_count() or 1},
            **changes,
        }
    )
    run_dir = work / name
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps(spec.canonical()))
    started = time.perf_counter()
    assert main(str(run_dir / "spec.json")) == 0, name
    print(f"  {name}: {time.perf_counter() - started:.0f} s", flush=True)
    return [{"step": s, **d} for s, d in metrics_view((run_dir / "metrics.jsonl").read_text()).items()]


def learning(work: Path, toy, steps: int) -> None:
    from rpg_cli.metrics import val_key

    key = val_key("toy_add", 8)
    print(f"1. the toy task, GRPO, {steps} steps of {PROMPTS}x{SAMPLES}, held-out validation mean@8", flush=True)
    rows = {}
    for device, gpu in (("cuda", True), ("cpu", False)):
        lines = run(work, f"toy-{device}", toy.model, toy, steps, gpu)
        train = [d for d in lines if d["step"] > 0]
        rows[device] = (lines[0][key], lines[-1][key], sum(d["timing_s/step"] for d in train) / len(train))
    print(f"{'device':<8}{'start':>8}{'end':>8}{'gain':>8}{'s/step':>9}")
    for device, (start, end, step_s) in rows.items():
        print(f"{device:<8}{start:>8.3f}{end:>8.3f}{end - start:>+8.3f}{step_s:>9.3f}")
    gap = abs((rows["cuda"][1] - rows["cuda"][0]) - (rows["cpu"][1] - rows["cpu"][0]))
    print(f"gain gap cuda vs cpu: {gap:.3f}  target <= 0.15 {'ok' if gap <= 0.15 else 'ABOVE'}", flush=True)


def throughput(work: Path, toy, steps: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from rpg_cli.datasets.toy import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.model_max_length = 1024
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        **BIG,
    )
    torch.manual_seed(0)
    model_dir = work / "big"
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharp random logits and an end-of-sequence logit of 0: responses run the whole budget
        model.lm_head.weight.mul_(SHARP)
        model.lm_head.weight[tokenizer.eos_token_id] = 0
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    del model
    print(f"2. a random Llama of {params / 1e6:.0f}M parameters, {PROMPTS}x{SAMPLES} x {BIG_RESPONSE}-token responses")
    torch.cuda.reset_peak_memory_stats()
    lines = run(
        work,
        "big-cuda",
        model_dir,
        toy,
        steps,
        True,
        context={"prompt": 16, "response": BIG_RESPONSE},
        data={"train_files": [str(toy.train)], "val_files": []},
    )[2:]  # the first steps warm up kernels and the allocator
    gen = sum(d["timing_s/gen"] for d in lines)
    step = sum(d["timing_s/step"] for d in lines)
    sampled = sum(d["response_length/mean"] * PROMPTS * SAMPLES for d in lines)
    total = sum(d["perf/total_num_tokens"] for d in lines)
    print(
        f"rollout tokens/s {sampled / gen:,.0f} (mean response {sampled / len(lines) / PROMPTS / SAMPLES:.0f} tokens)"
    )
    print(f"training tokens/s {total / (step - gen):,.0f}; s/step {step / len(lines):.2f}")
    print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20 if QUICK else 300)
    parser.add_argument("--big-steps", type=int, default=3 if QUICK else 4)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_local_cuda: no CUDA GPU visible here: skipped")
        return
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16 autocast", flush=True)
    from rpg_cli.datasets.toy import write_toy

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        toy = write_toy(work / "toy")
        learning(work, toy, args.steps)
        if args.big_steps > 2:
            throughput(work, toy, args.big_steps)


if __name__ == "__main__":
    main()
