"""What a verl run's checkpoints take on disk (GB) under its spec's `checkpoints` setting, known before a GPU
is paid for: one full checkpoint by part, the steps verl saves at, what stays and the peak (`disk`). Pure Python."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rpg_cli.backends.verl.memory import ADAM_STATES, FP32
from rpg_cli.spec import Every

if TYPE_CHECKING:
    from rpg_cli.model_shape import ModelShape
    from rpg_cli.spec import ExperimentSpec

GB = 1e9  # disk in GB (what df and storage quotas count)


@dataclass(frozen=True)
class DiskEstimate:
    """What a run's checkpoints take (GB, 1e9 bytes) under its `checkpoints` setting."""

    full_parts: dict[str, float]  # one full checkpoint, by part
    weights_gb: float  # a checkpoint thinned to its Hugging Face weights (actor/huggingface/)
    saves: int  # checkpoints a run writes
    kept_full: int  # full checkpoints left at the end
    kept_weights: int  # weights-only checkpoints left at the end
    peak_gb: float  # the most on disk at once: the newest written before the oldest full one is thinned

    @property
    def full_gb(self) -> float:
        return sum(self.full_parts.values())

    @property
    def run_gb(self) -> float:
        """What the run leaves on disk."""
        return self.kept_full * self.full_gb + self.kept_weights * self.weights_gb

    @property
    def all_full_gb(self) -> float:
        """What it would leave keeping every checkpoint whole (checkpoints.keep: null)."""
        return self.saves * self.full_gb


def checkpoint_steps(steps: int, save_every: int) -> list[int]:
    """The steps verl saves at: every save_freq steps and the last one (trainer/ppo/v1/trainer_base.py fit:
    save_freq > 0 and (is_last_step or global_steps % save_freq == 0), steps counted from 1)."""
    saves = list(range(save_every, steps + 1, save_every))
    return saves if saves and saves[-1] == steps else [*saves, steps]


def disk(spec: ExperimentSpec, shape: ModelShape) -> DiskEstimate:
    """Bytes per checkpoint and per run (fp32 throughout, as verl saves: utils/checkpoint/fsdp_checkpoint_manager):
    model shards (4 P: the sharded state dict of the fp32 weights), optimizer (8 P: both moments), Hugging Face
    weights (4 P: the gathered fp32 state dict, save_contents hf_model, tied head saved once), and rpg's
    reference shards (4 P, reference.py save_reference: the fp32 reference engine's shards) when the reference
    is reset (`reference` an `Every`). Tokenizer, config, lr scheduler and data-loader state are megabytes and
    left out. `checkpoints.keep` full ones stay; with weights "all" the older are thinned to their HF weights,
    with "kept" deleted."""
    p = shape.params
    parts = {
        "model shards (fp32)": FP32 * p / GB,
        "optimizer (fp32 moments)": ADAM_STATES * FP32 * p / GB,
        "HF weights (fp32)": FP32 * p / GB,
    }
    if isinstance(spec.reference, Every):
        parts["reference shards (fp32)"] = FP32 * p / GB
    saves = len(checkpoint_steps(spec.steps, spec.save_every))
    keep = spec.checkpoints.keep
    weights = parts["HF weights (fp32)"]
    thin = spec.checkpoints.weights == "all"

    def left(count: int) -> tuple[int, int]:
        full = count if keep is None else min(keep, count)
        return full, (count - full) if thin else 0

    full, thinned = left(saves)
    before_full, before_thinned = left(saves - 1)
    full_gb = sum(parts.values())
    peak = (before_full + 1) * full_gb + before_thinned * weights
    return DiskEstimate(parts, weights, saves, full, thinned, max(peak, full * full_gb + thinned * weights))
