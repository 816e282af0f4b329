"""rpg's overhead in a verl run: the plugin's policy losses against verl 0.9.1's own vanilla loss, on one batch.

Each loss the plugin registers with verl (`rpg_cli.backends.verl.plugin`; the spec's own `custom` loss apart: it
is the researcher's code) is called as verl's ppo_loss calls it (`POLICY_LOSS_REGISTRY[name](old_log_prob,
log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)`, with verl's global batch info
set, as on a real run), forward and backward, against `get_policy_loss_fn("vanilla")` on the same tensors:
the ratio of best times, in fp32 and bf16 log-probs. Target: <= 1.2x vanilla (on an H100 the RPG losses took
0.70-1.18x). On CUDA it also counts each call's device-to-host syncs (torch.cuda.set_sync_debug_mode), which stall
the launch of the backward: the plugin's should be no more than vanilla's (its three metric .item()s).

    python benchmarks/bench_plugin_loss.py [--device cuda] [--batch 16] [--length 4096] [--repeat 30]

BENCH_QUICK=1: a (4, 256) batch, 3 rounds; the ratios are printed, not judged. The exit status is 0 whatever
the ratios.
"""

from __future__ import annotations

import argparse
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from bench_losses import paired_times  # the same alternating rounds as the loss benchmark

TARGET = 1.2
QUICK = os.environ.get("BENCH_QUICK") == "1"  # CI: tiny sizes, timings printed but not judged


@dataclass
class BenchActorConfig:
    """The fields of verl's ActorConfig a policy loss reads (building verl's own needs a whole composed run)."""

    policy_loss: Any
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float = 10.0
    loss_scale_factor: int | None = None
    global_batch_info: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def make_inputs(batch: int, length: int, device: str, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """A micro-batch as verl's ppo_loss hands it over: padded log-probs, per-token advantages, a boolean mask."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g) * 3
    log_prob = old + 0.1 * torch.randn(batch, length, generator=g)
    adv = torch.randn(batch, 1, generator=g).expand(batch, length).contiguous()
    lengths = torch.randint(length // 4, length + 1, (batch,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    tensors = dict(log_prob=log_prob.to(dtype), old=old.to(dtype), adv=adv.to(dtype), mask=mask)
    return {k: v.to(device) for k, v in tensors.items()}


def config(x: dict[str, torch.Tensor], loss_mode: str) -> BenchActorConfig:
    """verl's vanilla config, or the plugin's for `loss_mode`, with the global batch info verl's ppo_loss sets."""
    from verl.workers.config import PolicyLossConfig

    from rpg_cli.backends.verl.plugin import RPGPolicyLossConfig

    info = dict(dp_size=1, batch_num_tokens=int(x["mask"].sum()), global_batch_size=len(x["mask"]))
    info["loss_scale_factor"] = None
    if loss_mode == "vanilla":
        return BenchActorConfig(PolicyLossConfig(loss_mode=loss_mode), global_batch_info=info)
    return BenchActorConfig(RPGPolicyLossConfig(loss_mode=loss_mode, beta=1e-3), global_batch_info=info)


def caller(fn, config, x):
    def run() -> None:
        lp = x["log_prob"].clone().requires_grad_(True)
        loss, _ = fn(x["old"], lp, x["adv"], x["mask"], "token-mean", config, None)
        loss.backward()

    return run


def syncs(run) -> int | None:
    """Device-to-host syncs in one call on CUDA (each one a warning in torch's sync debug mode); None on CPU."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=4 if QUICK else 16)
    parser.add_argument("--length", type=int, default=256 if QUICK else 4096)
    parser.add_argument("--repeat", type=int, default=3 if QUICK else 30)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1: repeatable on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn

    from rpg_cli.backends.verl import plugin
    from rpg_cli.backends.verl.launch import CUSTOM_LOSS

    names = [n for n in plugin.registered_names() if n != CUSTOM_LOSS]
    vanilla_fn = get_policy_loss_fn("vanilla")
    cuda = args.device.startswith("cuda")
    where = torch.cuda.get_device_name(args.device) if cuda else f"cpu, {torch.get_num_threads()} thread(s)"
    print(f"the plugin's losses vs verl's vanilla, forward+backward on ({args.batch}, {args.length}), {where}")
    worst = 0.0
    for dtype in (torch.float32, torch.bfloat16):
        x = make_inputs(args.batch, args.length, args.device, dtype)
        base = caller(vanilla_fn, config(x, "vanilla"), x)
        base_syncs = syncs(base) if cuda else None
        print(f"\n{str(dtype).removeprefix('torch.')}: best of {args.repeat} alternating rounds")
        print(f"{'loss':<22}{'ms':>8}{'vanilla ms':>12}{'ratio':>8}{'syncs':>7}  target <= {TARGET}x")
        for name in names:
            run = caller(POLICY_LOSS_REGISTRY[name], config(x, name), x)
            t, base_t = paired_times(run, base, args.repeat, args.device)
            ratio = t / base_t
            if name.startswith("rpg"):  # the target is the RPG losses'; the others are printed beside them
                worst = max(worst, ratio)
            counted = "-" if not cuda else f"{syncs(run)}/{base_syncs}"
            print(
                f"{name:<22}{t * 1e3:8.3f}{base_t * 1e3:12.3f}{ratio:8.2f}{counted:>7}  "
                f"{'ok' if ratio <= TARGET else 'SLOW'}"
            )
    verdict = "not judged (BENCH_QUICK)" if QUICK else ("PASS" if worst <= TARGET else "FAIL")
    print(f"\nworst RPG loss: {worst:.2f}x verl's vanilla loss, target <= {TARGET}x: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
