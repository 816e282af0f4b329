"""rpg_cli/inputs.py: what a run reads, checked cheaply: the columns and rows of parquet files from
their footers, hub models are found in the local cache only, and prompts are counted as transformers
encodes them (chat template, special tokens), exactly wherever a count could matter."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rpg_cli.datasets import VERL_SCHEMA, verl_row
from rpg_cli.inputs import _PromptCounter, check_data_file, parquet_schema, resolve_model

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RPG_SHARED_DATA") or REPO.parent / "shared" / "data")


def test_data_files_are_checked_for_the_columns_and_rows_verl_reads(tmp_path):
    ours = tmp_path / "rows.parquet"
    pq.write_table(
        pa.Table.from_pylist([verl_row(f"{i}+1?", str(i + 1), "toy", i) for i in range(300)], schema=VERL_SCHEMA),
        ours,
        row_group_size=100,
    )
    columns, rows = parquet_schema(ours)
    assert rows == 300 and {"prompt", "reward_model", "reward_model.ground_truth", "data_source"} <= columns
    assert check_data_file("data.train_files", str(ours)) == []
    odd = tmp_path / "odd.parquet"
    pq.write_table(pa.table({"question": ["q"] * 3, "nested": [{"a": {"b": 1}}] * 3, "tags": [["x"]] * 3}), odd)
    assert parquet_schema(odd) == (frozenset({"question", "nested", "nested.a", "nested.a.b", "tags"}), 3)
    [lacking] = check_data_file("data.train_files", str(odd))
    assert (
        lacking.error
        and "lacks the column(s) verl needs: prompt, reward_model.ground_truth, data_source" in lacking.message
    )
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=VERL_SCHEMA), empty)
    [no_rows] = check_data_file("data.val_files", str(empty))
    assert no_rows.error and "has no rows" in no_rows.message
    (tmp_path / "not.parquet").write_text("question,answer\n")
    [broken] = check_data_file("data.val_files", str(tmp_path / "not.parquet"))
    assert broken.error and "is not a readable parquet file (Parquet magic bytes not found in footer)" in broken.message
    for path in sorted(SHARED_DATA.glob("*.parquet")) if SHARED_DATA.is_dir() else []:  # the reference data passes
        assert check_data_file("data.val_files", str(path)) == [], path


def test_hub_models_are_looked_up_in_the_local_cache_and_never_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    directory, note = resolve_model("Owner/Model")
    assert directory is None and not note.error and "not in the local Hugging Face cache" in note.message
    snapshot = tmp_path / "hub" / "models--Owner--Model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--Owner--Model" / "refs").mkdir()
    (tmp_path / "hub" / "models--Owner--Model" / "refs" / "main").write_text("abc123")
    assert resolve_model("Owner/Model") == (snapshot, None)
    directory, error = resolve_model("runs/nothing/here")
    assert directory is None and error.error and "does not exist" in error.message


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A byte-level BPE tokenizer with special tokens and a Qwen-style chat template, as transformers
    saves it, and a config of 64 positions."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    corpus = ["Solve the problem. Answer: 42", "What is 3+4? Think step by step.", "Écrivez la réponse. 数学"] * 50
    core.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|im_end|>")
    tokenizer.chat_template = (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim }}"
        "{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    out = tmp_path_factory.mktemp("chat") / "model"
    tokenizer.save_pretrained(out)
    (out / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    return out, tokenizer


def test_prompt_counts_match_transformers_chat_template_exactly_where_they_matter(chat_model, tmp_path):
    model_dir, tokenizer = chat_model
    prompts = [[{"role": "user", "content": "What is 3+4? " * n}] for n in (1, 5, 9, 12, 20, 40)] + [
        [{"role": "system", "content": "Think step by step."}, {"role": "user", "content": "Écrivez 数学 " * 7}]
    ]
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": prompts}), path)
    exact = [
        len(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)["input_ids"]) for m in prompts
    ]
    counter = _PromptCounter(model_dir)
    assert counter.lengths(str(path), threshold=0) == exact  # every count exact
    for threshold in (20, 40, 63, 1000):
        counts = counter.lengths(str(path), threshold)
        for count, true in zip(counts, exact):
            assert count == true if count > threshold else true <= count <= threshold  # bounds only below it
