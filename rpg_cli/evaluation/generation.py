"""k samples per problem from one checkpoint: vLLM on a GPU when it is installed, else transformers.

Both engines tokenize prompts exactly as training does (the chat template, `encode_prompt` of the local
backend) and sample with the given temperature and top-p only (no top-k, no repetition penalty).
Each problem draws from its own seed (derived from the run's seed and the problem's content), so a
resumed evaluation samples what an uninterrupted one would have, whichever problems it does first.
"""

from __future__ import annotations

import importlib.util
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rpg_cli.evaluation.options import EvalError
from rpg_cli.evaluation.plan import Problem, Sampling


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
                "--engine vllm: vLLM is not installed; install the extra (pip install 'rpg-cli[vllm]') "
                "or use --engine hf"
            )
        return "vllm"
    return "vllm" if vllm_usable() else "hf"


def load_generator(model_dir: Path, engine: str) -> Generator:
    """A generator for the HF model in `model_dir`; EvalError (one line) when it cannot be loaded."""
    try:
        return VLLMGenerator(model_dir) if engine == "vllm" else HFGenerator(model_dir)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EvalError(
            f"cannot load the model in {model_dir} ({first}); it must be an HF causal-LM directory with its tokenizer"
        ) from None


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
    """vLLM offline inference over every visible GPU (tensor parallel); one request per problem with n = k."""

    def __init__(self, model_dir: Path, gpu_memory_utilization: float = 0.85):
        import torch
        from vllm import LLM

        self.llm = LLM(
            model=str(model_dir),
            tensor_parallel_size=max(1, torch.cuda.device_count()),
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
