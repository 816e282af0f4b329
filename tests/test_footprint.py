"""The memory and disk estimates of a verl run (rpg_cli/backends/verl/footprint.py) and the model shape they
read (rpg_cli/model_shape.py), against hand computations written out here, real models' config.json values,
and the parameter counts transformers gives for the same configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_spec

from rpg_cli.backends.verl import footprint, launch
from rpg_cli.model_shape import ModelShape, model_shape, shape_from_config
from rpg_cli.spec import load_sweep

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30


# config.json of Qwen/Qwen2.5-7B-Instruct and Qwen/Qwen3-4B as published (the fields a shape reads, and some)
def memory_of(spec, shape, gpu_gib=80.0):
    """The estimate as launch asks for it: from the overrides verl gets for the run."""
    return footprint.gpu_memory(spec, shape, launch.overrides(spec, Path("run")), gpu_gib)


def settings_of(spec):
    return footprint.settings(spec, launch.overrides(spec, Path("run")))


QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 152064,
}
QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
P_7B, P_4B = 7_615_616_512, 4_022_468_096  # sum(p.numel()) of transformers' models for these configs


def verl_spec(**changes):
    """A paper-like verl run: one node of 8 GPUs, 400 steps, a checkpoint every 20."""
    base = dict(
        backend="verl",
        model="Qwen/Qwen3-4B",
        context="8k",
        train_batch_size=512,
        rollout_n=16,
        ppo_mini_batch_size=32,
        steps=400,
        save_every=20,
        resources={"nodes": 1, "gpus_per_node": 8, "cpus": 8.0},
    )
    return make_spec(**{**base, **changes})


# ------------------------------------------------------------------------------------------- parameter counts


def test_parameter_counts_of_the_paper_models_by_hand():
    q25 = shape_from_config(QWEN25_7B)
    h, i, layers, vocab, kv = 3584, 18944, 28, 152064, 4 * 128
    # q/k/v with Qwen2's biases, o, SwiGLU, two norms; then the final norm, embedding and untied head
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
    assert q25.layer_params == layer == 233_057_792
    assert q25.params == layers * layer + h + 2 * vocab * h == P_7B  # "7.62B"

    q3 = shape_from_config(QWEN3_4B)
    h, i, layers, vocab, q, kv = 2560, 9728, 36, 151936, 32 * 128, 8 * 128
    # head_dim 128 makes q 4096 wide, wider than hidden; q/k norms over head_dim; the head is tied
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * 128
    assert (q3.q_dim, q3.kv_dim, q3.layer_params) == (4096, 1024, layer)
    assert q3.params == layers * layer + h + vocab * h == P_4B  # "4.02B"


@pytest.mark.parametrize("config", [QWEN25_7B, QWEN3_4B], ids=["qwen2.5-7b", "qwen3-4b"])
def test_parameter_count_is_what_transformers_builds(config):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):  # no memory: shapes only
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert shape_from_config(config).params == sum(p.numel() for p in model.parameters())


def test_the_toy_model_counts_as_transformers_builds_it(tmp_path):
    pytest.importorskip("torch")
    from rpg_cli.datasets import toy

    model = toy.build_model(toy.build_tokenizer())
    model.config.save_pretrained(tmp_path)
    shape = model_shape(str(tmp_path))
    assert shape is not None and shape.tied_embeddings and shape.model_type == "llama"
    assert shape.params == sum(p.numel() for p in model.parameters())


def test_biases_norms_and_defaults_of_each_family():
    llama = {"hidden_size": 64, "num_hidden_layers": 1, "intermediate_size": 128, "vocab_size": 10}
    base = shape_from_config({**llama, "num_attention_heads": 4, "num_key_value_heads": 2})
    assert (base.head_dim, base.kv_dim, base.tied_embeddings) == (16, 32, False)
    plain = base.layer_params
    with_bias = shape_from_config({**llama, "num_attention_heads": 4, "num_key_value_heads": 2, "attention_bias": True})
    assert with_bias.layer_params == plain + 64 + 2 * 32 + 64  # q, k, v and o biases
    qwen2 = shape_from_config({**llama, "model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2})
    assert qwen2.layer_params == plain + 64 + 2 * 32  # q, k, v only
    qwen3 = shape_from_config({**llama, "model_type": "qwen3", "num_attention_heads": 4})  # head_dim defaults to 128
    assert qwen3.head_dim == 128 and qwen3.num_kv_heads == 4
    assert shape_from_config({**llama, "num_attention_heads": 4, "num_local_experts": 8}) is None  # MoE: not covered
    assert shape_from_config({"text_config": llama}) is None  # a multimodal wrapper: not covered


# ------------------------------------------------------------------------------------------- finding config.json


def test_model_shape_from_a_local_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B))
    assert model_shape(str(tmp_path)).params == P_4B
    empty = tmp_path / "empty"
    empty.mkdir()
    assert model_shape(str(empty)) is None  # a directory without config.json
    assert model_shape(str(tmp_path / "absent")) is None
    (empty / "config.json").write_text("{not json")
    assert model_shape(str(empty)) is None


def test_model_shape_from_the_hugging_face_cache_without_network(tmp_path, monkeypatch):
    commit = "a" * 40
    repo = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps(QWEN25_7B))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may be fetched
    shape = model_shape("Qwen/Qwen2.5-7B-Instruct")
    assert shape is not None and shape.params == P_7B and shape.max_positions == 32768
    assert model_shape("Qwen/Qwen3-4B") is None  # not in this cache: None, not a download
    assert model_shape("not/a/hub/id") is None


# ------------------------------------------------------------------------------------------- token budgets


def test_token_budgets_are_the_ones_launch_gives_verl(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = verl_spec(context="4k")
    budgets = footprint.token_budgets(spec)
    assert (budgets.ppo, budgets.log_prob, budgets.ref_log_prob, budgets.sequence) == (16384, 16384, 16384, 8192)
    generated = dict(arg.split("=", 1) for arg in launch.overrides(spec, tmp_path / "run"))
    assert int(generated["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]) == budgets.ppo
    # rpg sets no log-prob budget: verl's default follows the actor's, overridden or not
    assert not [key for key in generated if "log_prob_max_token_len" in key]
    site = ["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=9000"]
    moved = settings_of(
        verl_spec(
            context="4k", verl={"overrides": ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12000"], "site": site}
        )
    )
    assert (moved.budgets.ppo, moved.budgets.log_prob, moved.budgets.ref_log_prob) == (12000, 9000, 12000)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"reference": "frozen"},
        {"reference": {"every": 50}},
        {"algorithm": "grpo", "kl": "none", "reference": "frozen"},
        {"algorithm": "reinforce_pp", "kl": "none", "beta": 0.0, "kl_loss": {"estimator": "k1", "coef": 1e-4}},
        {"algorithm": "reinforce_pp", "kl": "none", "beta": 1e-3, "reference": "frozen"},
        {"algorithm": "dapo", "kl": "none", "beta": 0.0},
    ],
    ids=["iterative", "frozen", "every", "grpo", "rfpp-kl-loss", "rfpp-kl-in-reward", "dapo"],
)
def test_a_reference_model_is_counted_exactly_when_launch_makes_verl_load_one(changes, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = verl_spec(**changes)
    generated = dict(arg.lstrip("+").split("=", 1) for arg in launch.overrides(spec, tmp_path / "run"))
    # verl's need_reference_policy (trainer/ppo/utils.py): a KL in the reward or a KL loss
    loaded = "true" in (generated["algorithm.use_kl_in_reward"], generated["actor_rollout_ref.actor.use_kl_loss"])
    assert settings_of(spec).reference_loaded == loaded


# ------------------------------------------------------------------------------------------- memory


def test_a_7b_at_4k_on_8_gpus_by_hand():
    spec = verl_spec(model="Qwen/Qwen2.5-7B-Instruct", context="4k")
    memory = memory_of(spec, shape_from_config(QWEN25_7B))
    phases = {phase.name: phase.parts for phase in memory.phases}
    P, N, T, h, vocab, layers = P_7B, 8, 16384, 3584, 152064, 28
    layer = 233_057_792
    update = phases["update"]
    assert update["actor weights (fp32 shard)"] == pytest.approx(4 * P / N / GIB)  # 3.55 GiB
    assert update["optimizer states (fp32 shard)"] == pytest.approx(8 * P / N / GIB)  # 7.09
    assert update["gradients (fp32 shard)"] == pytest.approx(4 * P / N / GIB)
    root = 2 * (2 * vocab * h + h)  # bf16 embedding + head + final norm, and their gradient
    assert update["gathered bf16 root weights and gradient"] == pytest.approx(2 * root / GIB)  # 4.06
    assert update["checkpointed activations"] == pytest.approx(layers * T * h * 2 / GIB)  # 3.06
    # at 4k the backward peaks in a recomputed layer (5.4 GiB) rather than at the head (bf16 logits, 4.6 GiB)
    q, kv, i = 3584, 512, 18944
    assert update["recomputed layer"] == pytest.approx(T * (18 * h + 2 * (3 * q + 4 * kv) + 14 * i) / GIB)
    assert update["gathered layer weights and gradient"] == pytest.approx((2 * 2 + 2 + 4) * layer / GIB)
    assert "logits" not in update and T * vocab * 2 + T * h * 8 < T * (18 * h + 2 * (3 * q + 4 * kv) + 14 * i)
    # the log-prob pass: bf16 logits plus the compiled entropy's fp32 buffer, 6 bytes per logit
    assert phases["log-prob"]["logits"] == pytest.approx(T * vocab * 6 / GIB)  # 13.9
    assert "reference log-prob" not in phases  # iterative: no reference model
    # the peak: rollout, vLLM's half of the GPU beside the trainer's fp32 weights and Adam states
    rollout = (4 + 8) * P / N / GIB
    assert memory.phase == "rollout"
    assert memory.peak_gib == pytest.approx(rollout * 1.05 + 1.0 + 0.5 * 80)  # 52.2 GiB
    assert memory.fits and memory.fix is None


def test_the_4b_at_8k_on_8_gpus_by_hand():
    memory = memory_of(verl_spec(), shape_from_config(QWEN3_4B))
    phases = {phase.name: phase for phase in memory.phases}
    P, N, T, h, vocab = P_4B, 8, 32768, 2560, 151936
    update = phases["update"].parts
    # 32,768 tokens x 151,936 logits in bf16: 9.3 GiB (not 18.5 in fp32), the gradient written into them
    assert update["logits"] == pytest.approx(T * vocab * 2 / GIB)
    assert update["head activations"] == pytest.approx(T * h * 8 / GIB)
    assert update["checkpointed activations"] == pytest.approx(36 * T * h * 2 / GIB)  # 5.6
    assert update["gathered bf16 root weights and gradient"] == pytest.approx(2 * 2 * (vocab * h + h) / GIB)  # tied
    trainer = (16 * P / N + 2 * 2 * (vocab * h + h) + 36 * T * h * 2 + T * vocab * 2 + T * h * 8) / GIB
    assert phases["update"].total == pytest.approx(trainer * 1.05 + 1.0 + 1.0)  # 27.7 GiB
    logits = T * vocab * 6
    assert phases["log-prob"].parts["logits"] == pytest.approx(logits / GIB)  # 27.8 GiB
    assert phases["optimizer step"].total == pytest.approx(20 * P / N / GIB * 1.05 + 2.0)  # fp32 copy in the step
    assert memory.phase == "rollout" and memory.peak_gib == pytest.approx(12 * P / N / GIB * 1.05 + 1.0 + 40.0)
    assert memory.fits and "fits" in str(memory)


def test_a_reference_model_adds_its_pass_and_offload_takes_the_trainer_out_of_the_rollout():
    shape = shape_from_config(QWEN3_4B)
    frozen = memory_of(verl_spec(algorithm="grpo", kl="none", reference="frozen"), shape)
    ref = {p.name: p for p in frozen.phases}["reference log-prob"]
    assert ref.parts["logits"] == pytest.approx(32768 * 151936 * 2 / GIB)  # no entropy in the reference's pass
    offloaded = memory_of(
        verl_spec(
            verl={
                "site": [
                    "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                ]
            }
        ),
        shape,
    )
    rollout = {p.name: p for p in offloaded.phases}["rollout"]
    assert "actor weights (fp32 shard)" not in rollout.parts and rollout.total == pytest.approx(1.0 + 40.0)


@pytest.mark.parametrize(
    "changes, gpu_gib, knob, setting",
    [
        (  # vLLM asked for 95% of each GPU: the share that leaves the trainer room
            {"verl": {"site": ["actor_rollout_ref.rollout.gpu_memory_utilization=0.95"]}},
            80.0,
            "gpu_memory_utilization to 0.91",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.91",
        ),
        (  # 8k on 40 GiB cards: the log-prob pass's entropy, chunked
            {},
            40.0,
            "entropy_from_logits_with_chunking=true",
            "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
        ),
    ],
    ids=["vllm-share", "entropy-chunking"],
)
def test_a_plan_that_does_not_fit_names_the_knob_that_fixes_it(changes, gpu_gib, knob, setting):
    shape = shape_from_config(QWEN3_4B)
    memory = memory_of(verl_spec(**changes), shape, gpu_gib)
    assert not memory.fits and knob in memory.fix and "\n" not in memory.fix
    site = [item for item in changes.get("verl", {}).get("site", []) if item.split("=")[0] != setting.split("=")[0]]
    fixed = memory_of(verl_spec(verl={"site": [*site, setting]}), shape, gpu_gib)
    assert fixed.fits, fixed


def test_an_update_that_does_not_fit_lowers_the_actor_budget_and_a_hopeless_one_asks_for_gpus():
    shape = shape_from_config(QWEN25_7B)
    site = [
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
    ]
    long = verl_spec(model="m", context={"prompt": 8192, "response": 8192}, verl={"site": site})
    memory = memory_of(long, shape, 40.0)
    assert memory.phase == "update" and "ppo_max_token_len_per_gpu to " in memory.fix
    tokens = int(memory.fix.split(" to ")[1].split()[0])
    assert 16384 <= tokens < 32768 and tokens % 1024 == 0
    budget = f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={tokens}"
    lowered = verl_spec(
        model="m", context={"prompt": 8192, "response": 8192}, verl={"site": site, "overrides": [budget]}
    )
    assert memory_of(lowered, shape, 40.0).fits
    one_gpu = memory_of(verl_spec(model="m", resources={"nodes": 1, "gpus_per_node": 1, "cpus": 1.0}), shape)
    assert not one_gpu.fits and "more GPUs" in one_gpu.fix  # 16 bytes a parameter alone is 113 GiB


def test_a_non_numeric_override_is_a_one_line_spec_error():
    from rpg_cli.spec import SpecError

    spec = verl_spec(verl={"site": ["actor_rollout_ref.rollout.gpu_memory_utilization=lots"]})
    with pytest.raises(SpecError, match="gpu_memory_utilization='lots' is not a number"):
        memory_of(spec, shape_from_config(QWEN3_4B))


def test_every_paper_run_fits_80_gib_gpus_with_the_rollout_at_the_peak(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for grid, config in (("paper-qwen25-7b-instruct", QWEN25_7B), ("paper-qwen3-4b", QWEN3_4B)):
        for spec in load_sweep(REPO / "experiments" / f"{grid}.yaml").expand():
            memory = memory_of(spec, shape_from_config(config))
            assert memory.fits and memory.phase == "rollout", (spec.run_name, str(memory))


# ------------------------------------------------------------------------------------------- disk


def test_checkpoint_steps_are_every_save_freq_and_the_last():
    assert footprint.checkpoint_steps(400, 20) == list(range(20, 401, 20))
    assert footprint.checkpoint_steps(45, 20) == [20, 40, 45]
    assert footprint.checkpoint_steps(10, 20) == [10]


def test_disk_of_a_7b_run_under_each_checkpoints_setting():
    shape = shape_from_config(QWEN25_7B)
    full, weights = 16 * P_7B / 1e9, 4 * P_7B / 1e9  # model 4 + optimizer 8 + HF 4 bytes a parameter; HF alone
    default = footprint.disk(verl_spec(model="m"), shape)  # keep 1, weights "all"
    assert default.full_parts == pytest.approx(
        {
            "model shards (fp32)": 4 * P_7B / 1e9,
            "optimizer (fp32 moments)": 8 * P_7B / 1e9,
            "HF weights (fp32)": weights,
        }
    )
    assert (default.saves, default.kept_full, default.kept_weights) == (20, 1, 19)
    assert default.run_gb == pytest.approx(full + 19 * weights)  # 700.6 GB
    assert default.peak_gb == pytest.approx(2 * full + 18 * weights)  # the newest written before thinning
    everything = footprint.disk(verl_spec(model="m", checkpoints={"keep": None}), shape)
    assert everything.run_gb == pytest.approx(20 * full) == pytest.approx(default.all_full_gb)  # 2.44 TB
    kept = footprint.disk(verl_spec(model="m", checkpoints={"keep": 2, "weights": "kept"}), shape)
    assert (kept.kept_full, kept.kept_weights, kept.run_gb) == (2, 0, pytest.approx(2 * full))
    reset = footprint.disk(verl_spec(model="m", reference={"every": 50}), shape)
    assert reset.full_gb == pytest.approx(full + 4 * P_7B / 1e9)  # rpg's reference shards, fp32


def test_disk_matches_the_measured_386m_checkpoint():
    # 386M parameters on an H100: 1.5 GB model shards, 2.9 GB optimizer, 1.5 GB HF weights (du -h: GiB, rounded up)
    shape = ModelShape(1024, 22, 2816, 50304, 16, 16, 64, False)
    parts = footprint.disk(verl_spec(model="m"), shape).full_parts
    gib = {k: v * 1e9 / GIB for k, v in parts.items()}
    assert (round(gib["model shards (fp32)"], 1), round(gib["optimizer (fp32 moments)"], 1)) == (1.4, 2.9)
    assert round(gib["HF weights (fp32)"], 1) == 1.4
