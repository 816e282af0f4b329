"""What a run costs (rpg_cli.cost, MATH.md section 12): the devices' peaks and their lookup, the FLOPs of an update
and MFU against a hand count, and the local trainer's cost metrics (rpg_cli.metrics) under verl's names, its
timing_s/step without validation as verl's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import spec_dict

from rpg_cli import cost, metrics
from rpg_cli.model_shape import shape_from_config

# a 2-layer decoder small enough to count by hand: hidden 8, 2 query heads and 1 KV head of width 4, MLP 16
TOY_CONFIG = {
    "model_type": "llama",
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "intermediate_size": 16,
    "vocab_size": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
}


# ---------------------------------------------------------------- peaks


def test_every_peak_has_a_source_and_is_dense_bf16():
    for name, (peak, source) in cost.PEAK_FLOPS.items():
        assert 1e14 < peak < 1e16 and source.strip(), name
    assert cost.PEAK_FLOPS["H100 SXM"][0] == 989.4e12  # half the datasheet's 1,979 "with sparsity"
    assert cost.PEAK_FLOPS["H100 PCIe"][0] == 756e12


@pytest.mark.parametrize(
    "device_name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.4e12),  # the SXM part as torch names it
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA B200", 2250e12),
        ("NVIDIA GB200", None),  # not a B200: unknown, no MFU rather than a made-up one
        ("NVIDIA H100 NVL", None),  # a lower peak this table does not hold
        ("NVIDIA GeForce RTX 4090", None),
        ("cpu", None),
    ],
)
def test_a_device_name_finds_its_peak_or_none(device_name, peak):
    assert cost.device_peak(device_name) == peak


# ---------------------------------------------------------------- FLOPs and MFU against a hand count


def test_the_update_flops_and_mfu_of_a_toy_config_are_the_hand_count():
    shape = shape_from_config(TOY_CONFIG)
    # per layer: q 8x8, k and v 8x4 each, o 8x8, MLP 3 x 8x16 = 64 + 64 + 64 + 384 = 576; LM head 32x8 = 256
    assert cost.matmul_params(shape) == 2 * 576 + 256 == 1408
    assert cost.dense_flops_per_token(shape) == 6 * 1408
    # attention: 6 x (3^2 + 5^2) x head_dim 4 x heads 2 x layers 2
    assert cost.attention_flops(shape, [3, 5]) == 6 * 34 * 4 * 2 * 2 == 3264
    # two passes (ppo_epochs) over 8 tokens
    assert cost.update_flops(shape, [3, 5], passes=2) == 2 * (6 * 1408 * 8 + 3264) == 141_696
    assert cost.mfu(141_696, seconds=2.0, devices=1, peak=1e5) == pytest.approx(0.70848)
    assert cost.mfu(141_696, seconds=2.0, devices=2, peak=1e5) == pytest.approx(0.35424)


def test_matmul_params_are_the_linear_weights_transformers_builds():
    """N counts each weight a token multiplies through: every Linear of the model transformers builds from the
    config (q, k, v, o, gate, up, down, the head), none of its embedding or norms."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{k: v for k, v in TOY_CONFIG.items() if k != "model_type"})
    model = transformers.LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert cost.matmul_params(shape_from_config(TOY_CONFIG)) == linear


def test_the_flops_are_verls_count_less_the_input_embedding():
    """verl 0.9.1's `_estimate_qwen2_flops` counts vocab x hidden twice (embedding and head); rpg once (the
    embedding is a lookup): the two differ by exactly 6 x vocab x hidden per token."""
    flops_counter = pytest.importorskip("verl.utils.flops_counter")
    shape, seqlens = shape_from_config(TOY_CONFIG), [3, 5, 7]
    verl_tflops = flops_counter._estimate_qwen2_flops(SimpleNamespace(**TOY_CONFIG), sum(seqlens), seqlens, 1.0)
    ours = cost.update_flops(shape, seqlens)
    assert verl_tflops * 1e12 == pytest.approx(ours + 6 * 32 * 8 * sum(seqlens), rel=1e-12)


# ---------------------------------------------------------------- the local trainer's cost metrics


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The toy task with a random (not warmed-up) toy model: steps in seconds."""
    pytest.importorskip("transformers")
    from rpg_cli.datasets.pipeline import rows_to_batch, write_verl_parquet
    from rpg_cli.datasets.toy import ToyPaths, build_model, build_tokenizer, split, toy_row

    root = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer()
    build_model(tokenizer, seed=0).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    paths = ToyPaths(root / "model", root / "train.parquet", root / "val.parquet")
    for path, part in zip((paths.train, paths.val), split()):
        write_verl_parquet([rows_to_batch([toy_row(q, a, i) for i, (q, a) in enumerate(part)])], path)
    return paths


class FakeClock:
    """The trainer's time.perf_counter, advanced only by the test: each step's training takes TRAIN_S, each
    validation VALIDATE_S, everything else no time, so every timing is exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


TRAIN_S, VALIDATE_S = 3.0, 100.0


def test_a_local_runs_lines_carry_the_cost_metrics_and_its_step_time_leaves_validation_out(tiny, tmp_path, monkeypatch):
    from rpg_cli.backends.local import trainer
    from rpg_cli.spec import ExperimentSpec
    from rpg_cli.store.ingest import metrics_view

    clock = FakeClock()
    monkeypatch.setattr(trainer, "time", clock)
    train_step, validate = trainer.Trainer.train_step, trainer.Trainer.validate

    def timed_train_step(self, step):
        out = train_step(self, step)
        clock.now += TRAIN_S
        return out

    def timed_validate(self):
        out = validate(self)
        clock.now += VALIDATE_S
        return out

    monkeypatch.setattr(trainer.Trainer, "train_step", timed_train_step)
    monkeypatch.setattr(trainer.Trainer, "validate", timed_validate)
    spec = ExperimentSpec.model_validate(
        spec_dict(
            model=str(tiny.model),
            data={"train_files": [str(tiny.train)], "val_files": [str(tiny.val)]},
            train_batch_size=2,
            rollout_n=2,
            ppo_mini_batch_size=2,
            reference="frozen",  # a reference model runs: timing_s/ref
            steps=2,
            save_every=2,
            context={"prompt": 8, "response": 8},
            val={"n": 1, "every": 2, "temperature": 1.0, "top_p": 1.0},
            rollout={"temperature": 1.0, "top_p": 1.0, "engine": "hf"},
        )
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps(spec.canonical()))
    assert trainer.main(str(run_dir / "spec.json")) == 0
    lines = metrics_view((run_dir / "metrics.jsonl").read_text())
    assert sorted(lines) == [0, 1, 2]
    every_step = {metrics.STEP_TIME, metrics.THROUGHPUT, metrics.TOKENS, metrics.TIME_PER_STEP}
    every_step |= {metrics.GEN_TIME, metrics.OLD_LOG_PROB_TIME, metrics.UPDATE_TIME, metrics.REF_TIME}
    for step in (1, 2):
        data = lines[step]
        assert every_step <= set(data), sorted(every_step - set(data))
        assert data[metrics.STEP_TIME] == data[metrics.TIME_PER_STEP] == TRAIN_S  # validation apart
        assert data[metrics.THROUGHPUT] == data[metrics.TOKENS] / TRAIN_S  # one device: cost.devices == 1 on CPU
        # a CPU gives neither MFU nor peak memory (absent, not 0), and the local backend syncs no weights
        assert not {metrics.MFU, metrics.PEAK_MEMORY, metrics.WEIGHT_SYNC_TIME} & set(data)
    assert metrics.TESTING_TIME not in lines[1] and lines[2][metrics.TESTING_TIME] == VALIDATE_S
    assert cost.step_seconds(lines[2]) == TRAIN_S + VALIDATE_S  # a step's device time counts its validation


def test_the_cost_names_are_in_the_contract_and_every_step_both_backends_log_is_promised():
    phases = list(metrics.PHASES)
    assert phases == ["generation", "old log-prob", "reference", "update", "weight sync", "validation"]
    assert set(metrics.PHASES.values()) <= set(metrics.METRICS)
    assert {metrics.MFU, metrics.PEAK_MEMORY, metrics.TIME_PER_STEP} <= set(metrics.METRICS)
    promised = {metrics.STEP_TIME, metrics.GEN_TIME, metrics.OLD_LOG_PROB_TIME, metrics.UPDATE_TIME}
    promised |= {metrics.THROUGHPUT, metrics.TOKENS, metrics.TIME_PER_STEP}
    assert promised <= metrics.EMITTED_BY_BOTH
    # logged only where they apply: not every step on both backends
    conditional = {metrics.REF_TIME, metrics.WEIGHT_SYNC_TIME, metrics.TESTING_TIME, metrics.MFU, metrics.PEAK_MEMORY}
    assert not conditional & metrics.EMITTED_BY_BOTH


def test_a_runs_devices_and_device_hours():
    assert cost.devices({"resources": {"nodes": 2, "gpus_per_node": 8}}) == 16
    assert cost.devices({"resources": {"nodes": 1, "gpus_per_node": 0}}) == 1  # one CPU process
    assert cost.device_hours(16, 1800.0) == 8.0


def test_the_mfu_of_a_cuda_step_needs_a_known_peak(monkeypatch):
    """The local meter on a device torch names: a known one gives perf/mfu/actor for the update, an unknown one
    none (the model's shape is not even read)."""
    torch = pytest.importorskip("torch")
    from rpg_cli.backends.local import costs

    model = SimpleNamespace(config=SimpleNamespace(to_dict=lambda: dict(TOY_CONFIG)))
    spec = SimpleNamespace(canonical=lambda: {"resources": {"nodes": 1, "gpus_per_node": 1}})
    for name, expected in (("NVIDIA H100 80GB HBM3", 141_696 / 2 / (2.0 * 989.4e12)), ("NVIDIA L4", None)):
        monkeypatch.setattr(costs.torch.cuda, "get_device_name", lambda device, name=name: name)
        meter = costs.CostMeter(model, torch.device("cuda"), spec)
        got = meter.update([3, 5], passes=1, seconds=2.0)
        assert got == ({} if expected is None else {metrics.MFU: pytest.approx(expected)})


def test_the_cost_metric_names_are_verls():
    """The names verl 0.9.1 writes (its source, read where it is installed): marked_timer's phases and
    compute_throughout_metrics' perf/*, and the update's peak memory under actor/."""
    verl = pytest.importorskip("verl")
    root = Path(verl.__file__).parent
    trainer = (root / "trainer/ppo/v1/trainer_base.py").read_text() + (
        root / "trainer/ppo/v1/trainer_sync.py"
    ).read_text()
    for key in (*metrics.PHASES.values(), metrics.STEP_TIME):
        assert f'marked_timer("{key.removeprefix("timing_s/")}"' in trainer, key
    utils = (root / "trainer/ppo/metric_utils.py").read_text()
    assert all(f'"{key}"' in utils for key in (metrics.THROUGHPUT, metrics.TOKENS, metrics.TIME_PER_STEP))
    assert '"perf/mfu/actor"' in trainer and 'rename_dict(output["metrics"], "actor/")' in trainer
    assert '"perf/max_memory_allocated_gb"' in (root / "workers/engine_workers.py").read_text()
    assert metrics.PEAK_MEMORY == "actor/" + "perf/max_memory_allocated_gb"
