"""k samples per problem from one checkpoint: vLLM on a GPU when it is installed, else transformers.

Both engines tokenize prompts exactly as training does (the chat template, `encode_prompt` of the local
backend) and sample with the given temperature and top-p only (no top-k, no repetition penalty).
Each problem draws from its own seed (derived from the run's seed and the problem's content), so a
resumed evaluation samples what an uninterrupted one would have, whichever problems it does first.
"""

from __future__ import annotations

import importlib.util
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rpg_cli.evaluation.options import EvalError
from rpg_cli.evaluation.plan import Problem, Sampling, Target


@dataclass(frozen=True)
class Response:
    text: str
    length: int  # response tokens, the end-of-sequence token included when it was reached


class Generator(Protocol):
    def generate(self, problems: Sequence[Problem], seeds: Sequence[int], sampling: Sampling) -> list[list[Response]]:
        """`sampling.k` responses for each problem, problem i sampled from seeds[i]."""
        ...

    def close(self) -> None: ...


def problems_per_call(engine: str, k: int) -> int:
    """transformers samples one problem's k responses per call; vLLM schedules ~2k sequences at once."""
    return 1 if engine == "hf" else max(1, 2048 // k)


def problem_seed(seed: int, step: int, benchmark: str, problem: Problem) -> int:
    """A seed per (run seed, checkpoint step, benchmark, problem content), stable across processes."""
    return zlib.crc32(f"{seed}/{step}/{benchmark}/{problem.key}".encode()) & 0x7FFFFFFF


def vllm_usable() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pick_engine(engine: str) -> str:
    """'vllm' or 'hf' for the requested engine ('auto': vLLM when installed and a GPU is present)."""
    if engine == "hf":
        return "hf"
    if engine == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise EvalError(
                "--engine vllm: vLLM is not installed; install it (a GPU node's set: pip install -r requirements/gpu.txt) "
                "or use --engine hf"
            )
        return "vllm"
    return "vllm" if vllm_usable() else "hf"


def load_generator(model_dir: Path, engine: str, tp: int | None = None) -> Generator:
    """A generator for the HF model in `model_dir` (vLLM with tensor parallel size `tp`, default: the
    largest the model and the visible GPUs allow); EvalError (one line) when it cannot be loaded."""
    try:
        return VLLMGenerator(model_dir, tp=tp) if engine == "vllm" else HFGenerator(model_dir)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EvalError(
            f"cannot load the model in {model_dir} ({first}); it must be an HF causal-LM directory with its tokenizer"
        ) from None


# ------------------------------------------------------------------------------ tensor parallelism

# vLLM 0.24 pads the vocabulary to a multiple of this before splitting it across ranks
# (vllm/model_executor/layers/vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE, pad_vocab_size).
VOCAB_PADDING = 64
# config.json keys of the KV-head count, in the order vLLM 0.24 tries them (ModelArchConfigConvertorBase
# .get_total_num_kv_heads); none of them: as many KV heads as attention heads (no grouped-query attention).
_KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
# a mixture of experts splits its expert MLPs otherwise: no dense `intermediate_size` rule for it
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


@dataclass(frozen=True)
class TPShape:
    """What vLLM splits across tensor-parallel ranks, from the model's config.json."""

    name: str  # for messages
    heads: int  # attention (query) heads
    kv_heads: int
    vocab: int = 0  # 0: unknown
    intermediate: int = 0  # the dense MLP's width; 0: unknown, or a mixture of experts

    def describe(self) -> str:
        return f"{self.heads} attention heads, {self.kv_heads} KV heads"


def tp_shape(model_dir: Path, name: str | None = None) -> TPShape:
    """The shape of the HF model in `model_dir` (its config.json; a multimodal model's `text_config`,
    as vLLM reads it); EvalError (one line) when the file is missing or names no attention heads."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise EvalError(f"{path}: cannot read the model's config ({e}); it must be an HF model directory") from None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config

    def number(*keys: str) -> int:
        value = next((text[k] for k in keys if text.get(k) is not None), 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    heads = number("num_attention_heads")
    if heads < 1:
        raise EvalError(f"{path} names no num_attention_heads; vLLM cannot split this model across GPUs")
    label = name or (config.get("_name_or_path") if isinstance(config.get("_name_or_path"), str) else "")
    experts = number(*_EXPERT_KEYS)
    return TPShape(
        name=label or str(model_dir),
        heads=heads,
        kv_heads=number(*_KV_HEAD_KEYS) or heads,
        vocab=number("vocab_size"),
        intermediate=0 if experts else number("intermediate_size"),
    )


def tp_problem(shape: TPShape, tp: int) -> str | None:
    """Why vLLM 0.24 cannot split `shape` over `tp` GPUs ("28 attention heads, not divisible by 8"), None
    when it can. Its rules: the attention heads divide evenly (ModelConfig.verify_with_parallel_config);
    the KV heads divide evenly, or, when there are fewer of them than GPUs, are replicated, so `tp` must
    be a multiple of them (QKVParallelLinear); the vocabulary, padded to a multiple of 64, divides evenly
    (VocabParallelEmbedding); so does a dense MLP's width (MergedColumnParallelLinear, RowParallelLinear)."""
    if shape.heads % tp:
        return f"{shape.heads} attention heads, not divisible by {tp}"
    if shape.kv_heads >= tp and shape.kv_heads % tp:
        return f"{shape.kv_heads} KV heads, not divisible by {tp}"
    if shape.kv_heads < tp and tp % shape.kv_heads:  # fewer KV heads than GPUs: each is copied tp/kv times
        return f"{shape.kv_heads} KV heads, which vLLM copies over {tp} GPUs only if {tp} is a multiple of them"
    padded = -(-shape.vocab // VOCAB_PADDING) * VOCAB_PADDING
    if padded % tp:
        return f"a vocabulary of {shape.vocab} tokens ({padded} padded), not divisible by {tp}"
    if shape.intermediate % tp:
        return f"an MLP width of {shape.intermediate}, not divisible by {tp}"
    return None


def choose_tp(shape: TPShape, gpus: int, requested: int | None = None, where: str = "visible") -> int:
    """The tensor parallel size vLLM gets: `requested` (--tp) if vLLM accepts it for `shape` and it fits
    the `gpus` (`where`: "visible", or how the job got them), else the largest size vLLM accepts within
    the GPUs. EvalError (one line) for no GPU, or a requested size that does not fit."""
    if gpus < 1:
        raise EvalError(f"vLLM needs a GPU and none is {where}; give it GPUs, or sample on the CPU with --engine hf")
    allowed = [tp for tp in range(1, gpus + 1) if tp_problem(shape, tp) is None]  # 1 always fits
    sizes = ", ".join(map(str, allowed))
    if requested is None:
        return allowed[-1]
    if requested > gpus:
        raise EvalError(f"--tp {requested}: only {gpus} GPU(s) {where}; allowed: {sizes}")
    problem = tp_problem(shape, requested)
    if problem:
        raise EvalError(f"--tp {requested}: {shape.name} has {problem}; allowed: {sizes}")
    return requested


def visible_gpus() -> int:
    """CUDA GPUs this process sees (0 without torch or CUDA)."""
    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _vllm_on_cpu() -> bool:
    """Whether vLLM runs on its CPU build (vllm.platforms.current_platform, resolved when asked)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def check_tp(targets: Sequence[Target], tp: int, gpus: int, where: str) -> None:
    """--tp against every checkpoint of `targets`, before anything is loaded or submitted: EvalError
    (one line, naming the run's model) when vLLM would refuse it or it exceeds the `gpus`."""
    for target in targets:
        name = str((target.spec or {}).get("model") or "") or None
        for path in dict.fromkeys(c.path for c in target.checkpoints):
            choose_tp(tp_shape(path, name), gpus, tp, where)


class HFGenerator:
    """transformers' `generate`, left-padded batches of the k samples of one problem (CPU or one GPU)."""

    def __init__(self, model_dir: Path, chunk: int = 64):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # rpg shows its own progress
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(self.device).eval()
        from rpg_cli.backends.local.rollout import eos_ids

        self.eos_ids = eos_ids(self.model, self.tokenizer)
        self.chunk = chunk  # sequences per `generate` call
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)

    def generate(self, problems: Sequence[Problem], seeds: Sequence[int], sampling: Sampling) -> list[list[Response]]:
        import torch

        from rpg_cli.backends.local.rollout import Problem as Prompt
        from rpg_cli.backends.local.rollout import encode_prompt
        from rpg_cli.backends.local.rollout import generate as sample

        out = []
        for problem, seed in zip(problems, seeds):
            ids = encode_prompt(self.tokenizer, list(problem.messages), sampling.chat_template_kwargs)
            budget = sampling.max_tokens
            if self.max_positions:
                budget = max(1, min(budget, self.max_positions - len(ids)))
            torch.manual_seed(seed)
            rollouts = sample(
                self.model,
                self.tokenizer,
                [Prompt(ids, problem.ground_truth, problem.data_source)],
                sampling.k,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_new_tokens=budget,
                eos_ids=self.eos_ids,
                device=self.device,
                chunk=self.chunk,
            )
            lengths = rollouts.response_mask.sum(-1).tolist()
            out.append([Response(text, int(n)) for text, n in zip(rollouts.texts, lengths)])
        return out

    def close(self) -> None:
        import torch

        del self.model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class VLLMGenerator:
    """vLLM offline inference, tensor parallel over the visible GPUs: `tp` of them, default the most the
    model can be split over (`choose_tp`: 4 of 8 for 28 attention heads); one request per problem, n = k."""

    def __init__(self, model_dir: Path, tp: int | None = None, gpu_memory_utilization: float = 0.85):
        gpus, shape = visible_gpus(), tp_shape(model_dir)
        if gpus == 0 and _vllm_on_cpu():  # vLLM's CPU build (`make e2e`): one device, nothing to split
            size, devices = choose_tp(shape, 1, tp, "(vLLM's CPU build: one device)"), "vLLM's CPU build"
        else:
            size, devices = choose_tp(shape, gpus, tp), f"{gpus} visible GPU(s)"
        print(f"rpg eval: vLLM tensor parallel size {size} on {devices} ({shape.describe()})", flush=True)
        from vllm import LLM

        self.llm = LLM(
            model=str(model_dir),
            tensor_parallel_size=size,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=True,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = getattr(getattr(self.llm.llm_engine, "model_config", None), "max_model_len", None)

    def generate(self, problems: Sequence[Problem], seeds: Sequence[int], sampling: Sampling) -> list[list[Response]]:
        from vllm import SamplingParams

        from rpg_cli.backends.local.rollout import encode_prompt

        prompts, params = [], []
        for problem, seed in zip(problems, seeds):
            ids = encode_prompt(self.tokenizer, list(problem.messages), sampling.chat_template_kwargs)
            budget = sampling.max_tokens
            if self.max_model_len:
                budget = max(1, min(budget, self.max_model_len - len(ids)))
            prompts.append({"prompt_token_ids": ids})
            params.append(
                SamplingParams(
                    n=sampling.k, temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=budget, seed=seed
                )
            )
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[Response(o.text, len(o.token_ids)) for o in out.outputs] for out in outputs]

    def close(self) -> None:
        import gc

        import torch

        del self.llm
        gc.collect()
        torch.cuda.empty_cache()
