"""Forward+backward time and memory of every policy loss against a plain inline dual-clip PPO loss.

The floor is the least any framework must compute for a clipped policy gradient: ratio, two
surrogates, dual clip, masked token mean. Target: every RPG loss <= 1.3x the floor's time.

Memory is what the loss keeps alive for backward (bytes of the tensors autograd saves), exact and
repeatable on any device; on CUDA the allocator's peak is printed as well.

Today's baselines (gspo, cispo, gmpo, sapo: MATH.md section 9) are printed beside the others; they take no
reference, so they run once (pi_old). `--losses` runs only the named ones.

    python benchmarks/bench_losses.py [--device cuda] [--batch 64] [--length 4096] [--repeat 30] [--losses gspo sapo]

BENCH_QUICK=1: a (4, 256) batch, 3 rounds. The exit status is 0 whatever the ratios (they are printed).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from rpg_cli.algorithms import LOSS_NAMES, policy_loss

TARGET = 1.3
QUICK = os.environ.get("BENCH_QUICK") == "1"  # CI: tiny sizes, timings printed but not judged


def floor_ppo(log_prob, old_log_prob, advantages, response_mask, eps_low=0.2, eps_high=0.28, c=10.0):
    ratio = torch.exp((log_prob - old_log_prob).clamp(-20, 20))
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1 - eps_low, 1 + eps_high)
    clipped = torch.maximum(loss1, loss2)
    loss = torch.where(advantages < 0, torch.minimum(clipped, -c * advantages), clipped)
    mask = response_mask.to(loss.dtype)
    return (loss * mask).sum() / mask.sum()


def make_inputs(batch, length, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g) * 3
    log_prob = old + 0.1 * torch.randn(batch, length, generator=g)
    ref = old + 0.1 * torch.randn(batch, length, generator=g)
    adv = torch.randn(batch, 1, generator=g).expand(batch, length).contiguous()
    lengths = torch.randint(length // 4, length + 1, (batch,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return {k: v.to(device) for k, v in dict(log_prob=log_prob, old=old, ref=ref, adv=adv, mask=mask).items()}


def saved_bytes(fn) -> int:
    """Bytes of distinct storages autograd saves for backward while fn builds its graph."""
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def paired_times(fn, floor, repeat, device) -> tuple[float, float]:
    """Best time of fn and of the floor, measured in alternating rounds so that load on a shared
    machine hits both alike. On CPU it is the process's CPU time (one thread), which other processes
    on the machine barely move; on CUDA it is wall time after a synchronize."""
    cuda = device.startswith("cuda")
    clock = time.perf_counter if cuda else time.process_time

    def timed(f):
        start = clock()
        f()
        if cuda:
            torch.cuda.synchronize()
        return clock() - start

    for _ in range(3):
        timed(fn), timed(floor)
    rounds = [(timed(fn), timed(floor)) for _ in range(repeat)]
    return min(r[0] for r in rounds), min(r[1] for r in rounds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=4 if QUICK else 64)
    parser.add_argument("--length", type=int, default=256 if QUICK else 4096)
    parser.add_argument("--repeat", type=int, default=3 if QUICK else 30)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1: repeatable on a shared machine)")
    parser.add_argument("--losses", nargs="+", choices=LOSS_NAMES, default=list(LOSS_NAMES), help="losses to time")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = make_inputs(args.batch, args.length, args.device)

    def run_floor():
        lp = x["log_prob"].clone().requires_grad_(True)
        floor_ppo(lp, x["old"], x["adv"], x["mask"]).backward()

    def runner(name, with_ref):
        def run():
            lp = x["log_prob"].clone().requires_grad_(True)
            loss, _ = policy_loss(
                name,
                log_prob=lp,
                old_log_prob=x["old"],
                advantages=x["adv"],
                response_mask=x["mask"],
                ref_log_prob=x["ref"] if with_ref else None,
                beta=1e-3,
            )
            loss.backward()

        return run

    def forward_only(fn_name, with_ref=False):
        lp = x["log_prob"].clone().requires_grad_(True)
        if fn_name == "floor":
            return lambda: floor_ppo(lp, x["old"], x["adv"], x["mask"])
        return lambda: policy_loss(
            fn_name,
            log_prob=lp,
            old_log_prob=x["old"],
            advantages=x["adv"],
            response_mask=x["mask"],
            ref_log_prob=x["ref"] if with_ref else None,
            beta=1e-3,
        )

    floor_time, _ = paired_times(run_floor, run_floor, args.repeat, args.device)
    floor_mem = saved_bytes(forward_only("floor"))
    print(
        f"policy losses, forward+backward on ({args.batch}, {args.length}) {x['log_prob'].dtype} tokens, "
        f"device {args.device}, {torch.get_num_threads()} threads, best of {args.repeat} alternating rounds"
    )
    print(f"floor (inline dual-clip PPO): {floor_time * 1e3:.2f} ms, saved for backward {floor_mem / 2**20:.1f} MiB")
    print(f"{'loss':<22}{'reference':<11}{'ms':>8}{'time x':>8}{'MiB':>8}{'mem x':>7}  target <= {TARGET}x")
    worst = 0.0
    for name in args.losses:
        for with_ref in (False, True):
            if with_ref and not name.startswith(("rpg", "grpo")):  # only the KL losses take a reference
                continue
            t, floor_t = paired_times(runner(name, with_ref), run_floor, args.repeat, args.device)
            mem = saved_bytes(forward_only(name, with_ref))
            ratio = t / floor_t
            if name.startswith("rpg"):
                worst = max(worst, ratio)
            print(
                f"{name:<22}{'pi_ref' if with_ref else 'pi_old':<11}{t * 1e3:8.2f}{ratio:8.2f}"
                f"{mem / 2**20:8.1f}{mem / floor_mem:7.2f}  {'ok' if ratio <= TARGET else 'SLOW'}"
            )
    if any(name.startswith("rpg") for name in args.losses):
        print(f"worst RPG loss: {worst:.2f}x the floor ({'PASS' if worst <= TARGET else 'FAIL'} vs {TARGET}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
