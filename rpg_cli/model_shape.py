"""A decoder's shape and exact parameter count, read from its config.json before a GPU is paid for.

    shape = model_shape("Qwen/Qwen3-4B")   # a local directory, or a hub id in the local Hugging Face cache
    shape.params                            # 4,022,468,096: what transformers builds from that config

Pure Python: config.json is read as JSON (no transformers, no torch), and a hub id is looked up in the
cache with huggingface_hub's `try_to_load_from_cache`, which never downloads. Covers the dense decoders rpg
trains -- Llama (and Mistral), Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMSNorm) -- layer by layer as
transformers 5 builds them (models/{llama,qwen2,qwen3}/modeling_*.py); a config this does not cover
(mixture of experts, a multimodal wrapper) gives None, as an absent one does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QKV_BIAS_FAMILIES = ("qwen2",)  # Qwen2Attention: q/k/v bias=True, o_proj bias=False, whatever the config says
QK_NORM_FAMILIES = ("qwen3",)  # Qwen3Attention: q_norm and k_norm, RMSNorm over head_dim
# config.json keys without which the shape is unknown (absent keys have transformers' class defaults)
_REQUIRED = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "num_attention_heads")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


@dataclass(frozen=True)
class ModelShape:
    """What the memory and disk estimates need of a dense decoder (rpg_cli.backends.verl.footprint)."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied_embeddings: bool  # lm_head shares the input embedding (counted, sharded and saved once)
    max_positions: int | None = None
    model_type: str = "llama"
    attention_bias: bool = False  # Llama/Qwen3's attention_bias: a bias on q, k, v and o (Qwen2 ignores it)
    mlp_bias: bool = False  # Llama's mlp_bias: a bias on gate, up and down

    @property
    def q_dim(self) -> int:
        """Width of the query projection: heads x head_dim (Qwen3-4B: 4096, more than its hidden 2560)."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: KV heads x head_dim (grouped-query attention)."""
        return self.num_kv_heads * self.head_dim

    @property
    def embedding_params(self) -> int:
        """The input embedding and, when untied, the output head: the vocab-sized weights."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def layer_params(self) -> int:
        """One decoder layer: attention (q, k, v, o and their biases, Qwen3's q/k norms), the SwiGLU MLP
        (gate, up, down) and the two RMSNorms around them."""
        h, q, kv, inter = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        attention = h * q + 2 * h * kv + q * h
        if self.model_type in QKV_BIAS_FAMILIES:
            attention += q + 2 * kv
        elif self.attention_bias:
            attention += q + 2 * kv + h
        if self.model_type in QK_NORM_FAMILIES:
            attention += 2 * self.head_dim
        mlp = 3 * h * inter + (2 * inter + h if self.mlp_bias else 0)
        return attention + mlp + 2 * h

    @property
    def params(self) -> int:
        """Every parameter once (a tied head is the embedding): what `sum(p.numel() for p in
        model.parameters())` gives for the model transformers builds from the same config."""
        return self.num_layers * self.layer_params + self.hidden_size + self.embedding_params


def shape_from_config(config: dict[str, Any]) -> ModelShape | None:
    """The shape a config.json describes, with transformers' defaults for the keys it leaves out; None
    for one this does not cover (no decoder sizes at top level, or experts)."""
    if any(not isinstance(config.get(key), int) for key in _REQUIRED) or any(k in config for k in _EXPERT_KEYS):
        return None
    model_type = str(config.get("model_type") or "llama")
    heads = config["num_attention_heads"]
    # Qwen3Config defaults head_dim to 128; Llama and Qwen2 derive it from hidden_size
    head_dim = config.get("head_dim") or (128 if model_type in QK_NORM_FAMILIES else config["hidden_size"] // heads)
    positions = config.get("max_position_embeddings")
    return ModelShape(
        hidden_size=config["hidden_size"],
        num_layers=config["num_hidden_layers"],
        intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),  # False: Llama/Qwen2/Qwen3 configs' default
        max_positions=positions if isinstance(positions, int) else None,
        model_type=model_type,
        attention_bias=bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
    )


def model_shape(model: str) -> ModelShape | None:
    """The shape of `model` (a local model directory, or a hub id such as Qwen/Qwen3-4B) from its config.json,
    without the network: a hub id is read from the local Hugging Face cache only. None when there is no
    config.json here (not downloaded yet) or it describes a model this does not cover."""
    path = _config_path(model)
    if path is None:
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return shape_from_config(config) if isinstance(config, dict) else None


def _config_path(model: str) -> Path | None:
    """config.json of a local directory, or the cached one of a hub id (nothing is downloaded)."""
    local = Path(model).expanduser()
    if local.is_dir():
        return local / "config.json" if (local / "config.json").is_file() else None
    if "://" in model or model.count("/") != 1 or model.startswith((".", "/", "~")):
        return None  # neither a directory here nor a hub id
    from rpg_cli.inputs import cached_snapshot  # the hub's cache read directly: importing huggingface_hub costs 0.3 s

    snapshot = cached_snapshot(model)
    config = None if snapshot is None else snapshot / "config.json"
    return config if config is not None and config.is_file() else None
