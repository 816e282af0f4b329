"""A toy verifiable task and a tiny model for it, built locally (no download): `rpg prepare-data --toy`.

The task: "47+1=" -> "Answer: 48", a two-digit a = 10t + u (t in 1..9, u in 0..8, so adding never
carries) plus b in 0..1: 162 problems, scored by the paper's "Answer:" rule like any math set. No answer
is right for more than 2 of them, so a policy cannot score by ignoring the question. The problems whose
digits sum to 9 (18, 27, ..., 90, each with b = 0 and b = 1: 18 problems) are held out as `val.parquet`;
training sees the other 144. Every tens digit and every units digit, with either b, is in both splits,
so a policy that learned to add 1 to the units digit scores on problems it never trained on, and one that
memorized its training problems does not.

The model: a Llama-architecture causal LM of ~80k parameters over a 20-token character vocabulary (a
`tokenizers` WordLevel tokenizer with "Answer" as one token), saved as an ordinary HF directory that
`AutoModelForCausalLM`/`AutoTokenizer` load.

A model with random weights emits a random token string and almost never the "Answer: N" form, so
no algorithm would get a learning signal. The weights are therefore random-initialised and then briefly
warmed up (a "pre-training" of a few seconds, on the training questions only) on the answer form and on
reading the question, never on adding: where b = 0 the target is "Answer: a" (a copy of the first number)
half of the time, and otherwise (always where b = 1) a's tens digit followed by a uniformly random digit.
Where b = 1 the pre-training never shows a's units digit (a copy would teach the policy to ignore b, which
RL would then have to unlearn) nor its successor. The starting policy answers in
the right form, is right where b = 0 about 60% of the time and guesses the units digit where b = 1
(accuracy about 0.33 on either split); RL has to learn to add b, which it does on the held-out problems too.

    paths = write_toy(Path("data/toy"))   # data/toy/{model/, train.parquet, val.parquet}
"""

from __future__ import annotations

import random
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_SOURCE = "toy_add"
EOS, PAD, UNK = "<|endoftext|>", "<|pad|>", "<|unk|>"
# "Answer" is one token so that the answer form is short; everything else is one character.
TOKENS = ["Answer", ":", " ", "+", "=", "\n", *"0123456789"]
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# head_dim = 64 / 2 = 32: vLLM's CPU attention takes head sizes 32, 64, 80, ... (16 is refused), so the verl
# end-to-end test rolls this model out with a real vLLM engine
MODEL_SHAPE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
)
# The position limit also caps the response budget (the trainer stays within it): an answer takes 6
# tokens, so a policy that forgets to stop costs a few dozen tokens, not the spec's 2048.
MAX_POSITIONS = 32
WARMUP_STEPS = 800


@dataclass(frozen=True)
class ToyPaths:
    model: Path
    train: Path
    val: Path


def problems() -> list[tuple[str, str]]:
    """Every (question, answer) of the task: "a+b=" with a = 10t + u (t in 1..9, u in 0..8), b in 0..1, in a fixed order."""
    return [(f"{10 * t + u}+{b}=", str(10 * t + u + b)) for t in range(1, 10) for u in range(9) for b in range(2)]


def held_out(question: str) -> bool:
    """Whether a problem is in the validation split: the digits of its a sum to 9 (one a per tens and units digit)."""
    return int(question[0]) + int(question[1]) == 9


def split() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, val): the 144 problems training sees and the 18 held out."""
    every = problems()
    return [p for p in every if not held_out(p[0])], [p for p in every if held_out(p[0])]


def toy_row(question: str, answer: str, index: int) -> dict[str, Any]:
    """A row in verl's format (the columns prepare-data writes); the prompt is the bare question."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"content": question, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {"index": index, "raw_problem": question, "split": None},
    }


def build_tokenizer():
    """A fast HF tokenizer over `TOKENS` (+ eos, pad, unk), left padding, a plain-concatenation chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *TOKENS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("Answer|."), behavior="isolated")
    core.decoder = decoders.Fuse()  # concatenate tokens back without separators
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        model_max_length=MAX_POSITIONS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer, seed: int = 0):
    """A Llama causal LM with random weights sized for the toy vocabulary.

    Llama rather than Qwen2: transformers 5 loads any qwen2 directory with its own Qwen2Tokenizer,
    which would rebuild (and break) this custom vocabulary.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **MODEL_SHAPE,
    )
    return LlamaForCausalLM(config)


def warm_up_format(model, tokenizer, seed: int = 0, steps: int = WARMUP_STEPS) -> float:
    """Teach the answer form and to read the question, not to add (see the module doc); returns the last loss.

    On the training questions only, targets are "Answer: a" (the first number) half of the time where b = 0
    and "Answer: <a's tens digit><random digit>" otherwise. WARMUP_STEPS is where the loss has settled: with
    fewer, the policy has not yet learned that b changes the answer and copies far less than half the time.
    """
    import torch

    rng = random.Random(seed)
    questions = [q for q, _ in split()[0]]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        batch = [
            (q, f"Answer: {q[:2] if q[3] == '0' and rng.random() < 0.5 else q[0] + str(rng.randrange(10))}")
            for q in rng.choices(questions, k=64)
        ]
        prompt = tokenizer([q for q, _ in batch], add_special_tokens=False)["input_ids"]
        target = tokenizer([t for _, t in batch], add_special_tokens=False)["input_ids"]
        ids = torch.tensor([p + t + [tokenizer.eos_token_id] for p, t in zip(prompt, target)])
        labels = ids.clone()
        labels[:, : len(prompt[0])] = -100  # every toy question has the same length: learn the response only
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


def write_toy(out_dir: Path, seed: int = 0) -> ToyPaths:
    """Write `<out_dir>/model` (HF dir), `train.parquet` and `val.parquet`; each replaced atomically."""
    from rpg_cli.datasets.pipeline import rows_to_batch, write_verl_parquet

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    warm_up_format(model, tokenizer, seed)
    paths = ToyPaths(out_dir / "model", out_dir / "train.parquet", out_dir / "val.parquet")
    staging = out_dir / f".model.{uuid.uuid4().hex[:8]}.tmp"
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Writing model shards" for a one-file model is noise
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if paths.model.exists():
            shutil.rmtree(paths.model)
        staging.rename(paths.model)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for path, part in zip((paths.train, paths.val), split()):
        write_verl_parquet([rows_to_batch([toy_row(q, a, i) for i, (q, a) in enumerate(part)])], path)
    return paths
