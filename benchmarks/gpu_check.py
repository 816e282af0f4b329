"""`make gpu-check`: what a GPU node shows of rpg that no CPU can, in one run of a few minutes.

1. verl 0.9.1's worker path on one CUDA GPU, FSDP1 and FSDP2, each in a fresh process
   (tests/verl_worker_harness.py --cuda: the CPU harness without its stand-ins but the rollout: verl's CUDA
   platform, NCCL, bf16 compute, flash_attention_2 where flash-attn is installed) on a Llama of about 350M random
   parameters built here: the RPG loss, the reference before and after its reset (exactly the actor after it),
   the checkpoint round trip of the actor and the reference (exact), seconds and tokens per second of one update,
   and its peak memory beside the memory estimator's figure for the same setting
   (rpg_cli/backends/verl/footprint.py, the training phase: no vLLM here).
2. The local backend on CUDA (benchmarks/bench_local_cuda.py --steps 100).

Exits 1 when a check fails; without a CUDA GPU it says so in one line and exits 0 (CI has none).

    python benchmarks/gpu_check.py [--out DIR] [--skip-local]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "verl_worker_harness.py"
STRATEGIES = ("fsdp", "fsdp2")


def harness(work: Path, strategy: str, timeout: int = 420) -> dict | str:
    """One strategy in a fresh process: what it measured, or the tail of its output when it failed."""
    out = work / f"{strategy}.json"
    done = subprocess.run(
        [sys.executable, str(HARNESS), str(work / strategy), str(out), strategy, "--cuda"],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    if done.returncode != 0 or not out.exists():
        return (done.stdout + done.stderr)[-3000:]
    return json.loads(out.read_text())


def checks(run: dict) -> list[tuple[str, bool]]:
    """What must hold on a GPU as it holds on the CPU (tests/test_verl_workers_cpu.py), bf16 tolerances."""
    return [
        ("the reference is the actor at step 1", run["step1_ref_minus_actor"] == 0.0),
        ("the update moved the actor", run["actor_moved"] > 0.0),
        ("no reset before step 2: the reference lags the actor", run["step2_ref_minus_actor"] > 0.0),
        ("after the reset the reference is the actor, exactly", run["step3_ref_minus_actor"] == 0.0),
        ("the actor's checkpoint round trip is exact", run["params_restored"] == 0.0),
        ("the reference's checkpoint round trip is exact", run["ref_restored_minus_saved_actor"] == 0.0),
        ("the loss went through rpg's plugin", run["update_loss_calls"] > 0),
    ]


def report(strategy: str, run: dict) -> bool:
    print(f"== verl worker, {strategy}, {run['attention']}, {run['parameters'] / 1e6:.0f}M parameters")
    tokens = run["tokens"]
    print(f"loss (whole batch) {run['loss_whole']:+.5f}, in micro-batches {run['loss_split']:+.5f}")
    print(
        f"max |ref - actor| log-prob: step 2 (before the reset) {run['step2_ref_minus_actor']:.3g}, "
        f"step 3 (after it) {run['step3_ref_minus_actor']:.3g}"
    )
    print(
        f"checkpoint round trip: actor {run['params_restored']:.3g}, "
        f"reference {run['ref_restored_minus_saved_actor']:.3g}"
    )
    print(
        f"update: {tokens:,} tokens in {run['update_s']:.2f} s ({tokens / run['update_s']:,.0f} tokens/s), "
        f"micro-batches of {run['micro_batch_tokens']:,} tokens"
    )
    estimate, measured = run["estimated_update_gib"], run["peak_allocated_gib"]
    versus = f"; rpg's estimate {estimate:.2f} GiB ({estimate / measured - 1:+.0%})"
    print(f"peak memory: {measured:.2f} GiB allocated, {run['peak_reserved_gib']:.2f} GiB reserved{versus}")
    ok = True
    for name, held in checks(run):
        ok &= held
        if not held:
            print(f"FAILED: {name}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the harness's files and JSON here")
    parser.add_argument("--skip-local", action="store_true", help="only verl's worker path")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(f"gpu-check: skipped: torch {torch.__version__} sees no CUDA GPU here; run it on a GPU node")
        return 0
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda})", flush=True)
    work = args.out or Path(tempfile.mkdtemp(prefix="rpg-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    ok = True
    for strategy in STRATEGIES:
        began = time.perf_counter()
        run = harness(work, strategy)
        if isinstance(run, str):
            print(f"== verl worker, {strategy}: FAILED\n{run}")
            ok = False
            continue
        ok &= report(strategy, run)
        print(f"({time.perf_counter() - began:.0f} s with start-up)", flush=True)
    if not args.skip_local:
        print("== the local backend on CUDA", flush=True)
        local = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_local_cuda.py"), "--steps", "100"])
        ok &= local.returncode == 0
    print("gpu-check: ok" if ok else "gpu-check: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
