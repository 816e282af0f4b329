"""A researcher's own loss (MATH.md section 11): `custom_policy_loss` hands the function clean per-token tensors
and aggregates what it returns exactly as rpg's own losses; the target is found and hashed without running it,
imported with one-line errors; and a grid runs it beside grpo on the local backend through `rpg sweep`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from rpg_cli import custom_loss
from rpg_cli.custom_loss import load, module_root, parse_target, source_hash

torch = pytest.importorskip("torch")

from rpg_cli.algorithms import LOSS_AGG_MODES, policy_loss  # noqa: E402
from rpg_cli.algorithms.custom import custom_policy_loss  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
F64 = torch.float64


def padded_batch(seed: int = 0, per_token: bool = False):
    """(log_prob, old_log_prob, ref_log_prob, advantages, mask): ragged rows (one of length 1), float64."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 1, 7, 3])
    mask = torch.arange(8) < lengths[:, None]
    old = -torch.rand(4, 8, generator=g, dtype=F64) * 3
    log_prob = old + 0.3 * torch.randn(4, 8, generator=g, dtype=F64)
    ref = old + 0.3 * torch.randn(4, 8, generator=g, dtype=F64)
    adv = torch.randn(4, 8, generator=g, dtype=F64) if per_token else torch.randn(4, generator=g, dtype=F64)
    return log_prob, old, ref, adv, mask


def with_junk(tensor, mask, value):
    return torch.where(mask, tensor, torch.full_like(tensor, value)) if tensor.dim() == 2 else tensor


def reinforce(*, log_prob, old_log_prob, advantages, response_mask, settings, **_):
    """-w A per token: the unclipped PPO loss, which rpg's `policy_loss("ppo", clip=False)` also computes."""
    return -torch.exp(log_prob - old_log_prob) * advantages * settings.get("scale", 1.0)


def run(fn, log_prob, old, ref, adv, mask, **kwargs):
    x = log_prob.clone().requires_grad_(True)
    loss, metrics = custom_policy_loss(
        fn, log_prob=x, old_log_prob=old, ref_log_prob=ref, advantages=adv, response_mask=mask, **kwargs
    )
    loss.backward()
    return loss.detach(), x.grad, metrics


# ---------------------------------------------------------------- custom_policy_loss


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("per_token", [False, True])
def test_a_custom_loss_aggregates_and_reports_exactly_as_rpgs_own(agg, per_token):
    """-w A as a custom loss equals policy_loss("ppo", clip=False): value, gradient and the shared metrics."""
    log_prob, old, ref, adv, mask = padded_batch(1, per_token)
    loss, grad, metrics = run(reinforce, log_prob, old, ref, adv, mask, loss_agg_mode=agg)
    x = log_prob.clone().requires_grad_(True)
    expected, theirs = policy_loss(
        "ppo", log_prob=x, old_log_prob=old, advantages=adv, response_mask=mask, clip=False, loss_agg_mode=agg
    )
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    torch.testing.assert_close(grad, x.grad)
    assert set(metrics) == {"pg_loss", "ppo_kl", "ratio_mean"}
    for key in metrics:
        assert metrics[key] == pytest.approx(theirs[key], rel=1e-12)


def test_the_function_sees_clean_tensors_and_its_padding_junk_cannot_leak():
    """NaN/-inf in every input's padding: the function gets 0 there (per-sequence advantages broadcast to
    tokens), detached inputs, a bool mask and a copy of the settings; NaN it writes into its padding is dropped."""
    log_prob, old, ref, adv, mask = padded_batch(2)
    seen = {}

    def spy(*, log_prob, old_log_prob, ref_log_prob, advantages, response_mask, settings):
        seen.update(
            log_prob=log_prob, old=old_log_prob, ref=ref_log_prob, adv=advantages, mask=response_mask, settings=settings
        )
        settings["mutated"] = True
        per_token = -torch.exp(log_prob - old_log_prob) * advantages
        return torch.where(response_mask, per_token, torch.full_like(per_token, float("nan")))

    settings = {"clip": 2.0}
    dirty = [with_junk(log_prob, mask, float("nan")), with_junk(old, mask, -float("inf"))]
    dirty += [with_junk(ref, mask, float("inf")), adv]
    loss, grad, _ = run(spy, *dirty, mask, settings=settings)
    assert settings == {"clip": 2.0}  # the function's copy, not the spec's
    assert seen["mask"].dtype == torch.bool and seen["log_prob"].requires_grad
    assert not seen["old"].requires_grad and not seen["ref"].requires_grad
    assert seen["adv"].shape == mask.shape
    for key in ("log_prob", "old", "ref", "adv"):
        assert torch.isfinite(seen[key]).all() and (seen[key][~mask] == 0).all(), key
    assert torch.equal(seen["adv"][mask], adv[:, None].expand_as(mask)[mask])
    clean_loss, clean_grad, _ = run(reinforce, log_prob, old, ref, adv, mask)
    assert torch.isfinite(loss) and torch.isfinite(grad).all() and (grad[~mask] == 0).all()
    torch.testing.assert_close(loss, clean_loss)
    torch.testing.assert_close(grad, clean_grad)


def test_ref_log_prob_is_none_for_the_iterative_reference():
    log_prob, old, _, adv, mask = padded_batch(3)
    seen = []

    def spy(*, ref_log_prob, log_prob, **_):
        seen.append(ref_log_prob)
        return -log_prob

    run(spy, log_prob, old, None, adv, mask)
    assert seen == [None]


def test_weights_multiply_each_token_and_their_padding_does_not_leak():
    log_prob, old, ref, adv, mask = padded_batch(4)
    weights = torch.rand(mask.shape, generator=torch.Generator().manual_seed(9), dtype=F64) + 0.5

    def weighted(**kwargs):
        return reinforce(**kwargs) * torch.where(mask, weights, 0)

    loss, grad, _ = run(reinforce, log_prob, old, ref, adv, mask, weights=with_junk(weights, mask, float("nan")))
    expected_loss, expected_grad, _ = run(weighted, log_prob, old, ref, adv, mask)
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(grad, expected_grad)


def test_the_functions_metrics_are_logged_under_their_names_as_floats():
    log_prob, old, ref, adv, mask = padded_batch(5)

    def with_metrics(*, log_prob, advantages, response_mask, **_):
        share = (advantages > 0).to(log_prob.dtype)
        return -advantages * log_prob, {"positive_share": share[response_mask].mean(), "constant": 3}

    _, _, metrics = run(with_metrics, log_prob, old, ref, adv, mask)
    expected = float((adv[:, None].expand_as(mask)[mask] > 0).to(F64).mean())
    assert metrics["positive_share"] == pytest.approx(expected) and metrics["constant"] == 3.0
    assert all(type(v) is float for v in metrics.values())


@pytest.mark.parametrize(
    ("returned", "words"),
    [
        (lambda lp: lp.sum(-1), "returned shape (4,), expected (4, 8): one loss per token"),
        (lambda lp: lp.sum(), "returned shape (), expected (4, 8)"),
        (lambda lp: "loss", "returned str; return the per-token loss tensor"),
        (lambda lp: (-lp, {"pg_loss": 1.0}), "returned metric 'pg_loss', which rpg logs itself; rename it"),
        (lambda lp: (-lp, {"per_token": lp}), "returned metric 'per_token' of shape (4, 8)"),
        (lambda lp: (-lp, [1.0]), "returned metrics of type list; return a dict"),
        (lambda lp: lp > 0, "returned a torch.bool tensor"),
    ],
)
def test_what_the_function_returns_is_checked_in_one_line_naming_it(returned, words):
    log_prob, old, ref, adv, mask = padded_batch(6)

    def broken(*, log_prob, **_):
        return returned(log_prob)

    with pytest.raises(ValueError) as error:
        custom_policy_loss(broken, log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=mask)
    message = str(error.value)
    assert "\n" not in message and words in message
    assert message.startswith(f"loss function {__name__}:") and "broken" in message


def test_inputs_of_the_wrong_shape_are_refused_naming_the_tensor():
    log_prob, old, ref, adv, mask = padded_batch(7)
    with pytest.raises(ValueError, match=r"ref_log_prob has shape \(4, 7\), but log_prob has shape \(4, 8\)"):
        custom_policy_loss(
            reinforce, log_prob=log_prob, old_log_prob=old, ref_log_prob=ref[:, :7], advantages=adv, response_mask=mask
        )
    with pytest.raises(ValueError, match="advantages has shape"):
        custom_policy_loss(reinforce, log_prob=log_prob, old_log_prob=old, advantages=adv[:3], response_mask=mask)


# ---------------------------------------------------------------- the target: found, hashed, loaded


@pytest.mark.parametrize("text", ["pkg.mod", "pkg.mod:", ":fn", "pkg..mod:fn", "pkg.mod:fn:x", "pkg-a.mod:fn", "1x:f"])
def test_a_malformed_target_is_one_line_with_an_example(text):
    with pytest.raises(ValueError) as error:
        parse_target(text)
    assert "\n" not in str(error.value) and "is not package.module:function" in str(error.value)
    assert custom_loss.EXAMPLE in str(error.value)


def test_parse_target_splits_module_and_function():
    assert parse_target(" my_losses.reinforce:loss ") == ("my_losses.reinforce", "loss")
    assert parse_target("flat:fn") == ("flat", "fn")


@pytest.fixture
def package(tmp_path, monkeypatch):
    """tmp_path/lossy/{__init__,mod}.py on sys.path; importing either would write a marker file (and the
    package's __init__ raises): finding and hashing must do neither."""
    root = tmp_path / "src"
    (root / "lossy" / "sub").mkdir(parents=True)
    marker = tmp_path / "executed"
    run_it = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (root / "lossy" / "__init__.py").write_text(run_it + "raise RuntimeError('package imported')\n")
    (root / "lossy" / "mod.py").write_text(run_it + "def loss(**kw):\n    return -kw['log_prob']\n")
    (root / "lossy" / "sub" / "__init__.py").write_text(run_it + "def loss(**kw):\n    return kw['log_prob']\n")
    monkeypatch.syspath_prepend(str(root))
    yield root, marker
    for name in [m for m in sys.modules if m == "lossy" or m.startswith("lossy.")]:
        del sys.modules[name]


def test_source_hash_reads_the_file_without_running_any_of_it(package):
    root, marker = package
    first = source_hash("lossy.mod:loss")
    assert len(first) == 12 and int(first, 16) >= 0
    assert source_hash("lossy.sub:loss") != first  # a package's own __init__.py
    assert module_root("lossy.mod:loss") == module_root("lossy.sub:loss") == root.resolve()
    assert not marker.exists()  # neither lossy/__init__.py nor the modules ran
    (root / "lossy" / "mod.py").write_text((root / "lossy" / "mod.py").read_text() + "# tuned\n")
    assert source_hash("lossy.mod:loss") != first
    assert source_hash("lossy.mod:other_function") == source_hash("lossy.mod:loss")  # the file's, not the function's


def test_a_module_that_cannot_be_found_names_the_fix(package):
    for target, why in [
        ("lossy.nope:loss", "no lossy/nope.py on the path"),
        ("no_such_package_rpg.mod:loss", "no no_such_package_rpg.py on the path"),
        ("lossy.mod.deeper:loss", "lossy.mod is not a package"),
    ]:
        with pytest.raises(ValueError) as error:
            source_hash(target)
        message = str(error.value)
        assert "\n" not in message and why in message and "put its directory on PYTHONPATH" in message, message
    assert not package[1].exists()


def test_a_module_in_the_current_directory_is_found_as_python_m_would(tmp_path, monkeypatch):
    (tmp_path / "here_loss_rpg.py").write_text("def loss(**kw):\n    return -kw['log_prob']\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert module_root("here_loss_rpg:loss") == tmp_path.resolve()
    assert len(source_hash("here_loss_rpg:loss")) == 12


def test_load_imports_the_function_and_errors_are_one_line(tmp_path, monkeypatch):
    root = tmp_path / "src"
    (root / "loadable_rpg").mkdir(parents=True)
    (root / "loadable_rpg" / "good.py").write_text(
        "def loss(*, log_prob, old_log_prob, ref_log_prob, advantages, response_mask, settings):\n"
        "    return -log_prob\nNUMBER = 3\n"
        "def partial(*, log_prob, advantages):\n    return -log_prob\n"
    )
    (root / "loadable_rpg" / "bad.py").write_text("import no_such_dependency_rpg\n")
    monkeypatch.syspath_prepend(str(root))
    try:
        assert load("loadable_rpg.good:loss").__name__ == "loss"
        cases = [
            (
                "loadable_rpg.bad:loss",
                "importing loadable_rpg.bad for loss 'loadable_rpg.bad:loss' failed: "
                "ModuleNotFoundError: No module named 'no_such_dependency_rpg'; fix the module",
            ),
            ("loadable_rpg.good:missing", "has no 'missing'; define it, or fix the loss name"),
            ("loadable_rpg.good:NUMBER", "loadable_rpg.good:NUMBER is a int, not a function"),
            ("loadable_rpg.good:partial", "does not take old_log_prob, ref_log_prob, response_mask, settings"),
        ]
        for target, words in cases:
            with pytest.raises(ValueError) as error:
                load(target)
            assert "\n" not in str(error.value) and words in str(error.value), str(error.value)
    finally:
        for name in [m for m in sys.modules if m.startswith("loadable_rpg")]:
            del sys.modules[name]


def test_the_verl_plugin_is_named_as_the_verl_backend_names_it():
    from rpg_cli.backends.verl.launch import PLUGIN_MODULE

    assert custom_loss.VERL_PLUGIN == PLUGIN_MODULE


def test_the_worked_example_is_sound():
    """The README's example loss passes every check (`check` lists the failed ones), verl's where verl is here."""
    results = list(custom_loss.checks("examples.my_loss:capped_reinforce", {"clip": 2.0}))
    assert [r.name for r in results] == list(custom_loss.CHECKS)
    assert custom_loss.check("examples.my_loss:capped_reinforce", {"clip": 2.0}) == []


# ---------------------------------------------------------------- a grid: custom beside grpo, local backend

TOY_SWEEP = """\
name: custom-toy
base:
  model: data/toy/model
  context: 2k
  data: {train_files: [data/toy/train.parquet], val_files: [data/toy/val.parquet]}
  train_batch_size: 4
  rollout_n: 2
  ppo_mini_batch_size: 4
  steps: 2
  seed: 0
  optimizer: adamw
  lr: 5.0e-4
  beta: 0.0
  reference: iterative
  val: {n: 2, every: 2, temperature: 1.0, top_p: 1.0}
  rollout: {temperature: 1.0, top_p: 1.0, engine: hf}
  save_every: 1000
  backend: local
  resources: {nodes: 1, gpus_per_node: 0, cpus: 1}
grid:
  algorithm: [grpo]
include:
  - {algorithm: grpo, clip: {eps_low: 0.2, eps_high: 0.28, c: 10.0}}
  - {algorithm: custom, loss: "examples.my_loss:capped_reinforce", loss_settings: {clip: 2.0}}
"""


@pytest.mark.slow
@pytest.mark.cluster  # a real Ray head and a whole run: make test-cluster
def test_a_custom_loss_runs_beside_grpo_through_rpg_sweep_and_report(tmp_path, monkeypatch):
    """The worked example as a spec's `loss` (its module found from the sweep's directory, the job's PYTHONPATH
    set from it), two steps of each run on the toy task on a real local head, and both methods in the report."""
    pytest.importorskip("transformers")
    pytest.importorskip("ray.job_submission", reason="rpg sweep needs ray[default]")
    from typer.testing import CliRunner

    from rpg_cli.cli import app
    from rpg_cli.datasets import toy
    from rpg_cli.orchestration.head import stop_local_head

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(toy, "warm_up_format", lambda *args, **kwargs: 0.0)  # untrained: only the steps matter
    toy.write_toy(tmp_path / "data" / "toy")
    (tmp_path / "examples").mkdir()
    shutil.copy(REPO / "examples" / "my_loss.py", tmp_path / "examples" / "my_loss.py")
    Path("grid.yaml").write_text(TOY_SWEEP)
    runs, db = tmp_path / "runs", f"sqlite:///{tmp_path / 'results.db'}"
    common = ["--db", db, "--runs-dir", str(runs)]
    runner = CliRunner()
    try:
        result = runner.invoke(app, ["sweep", "grid.yaml", *common])
        assert result.exit_code == 0, result.output
        report = runner.invoke(app, ["report", "--sweep", "custom-toy", "--format", "json", "--db", db])
        assert report.exit_code == 0, report.output
    finally:
        stop_local_head(runs)
    methods = {row["method"] for group in json.loads(report.stdout)["groups"] for row in group["rows"]}
    assert methods == {"GRPO", "capped_reinforce"}  # the custom run is named after its function
    specs = [json.loads(p.read_text()) for p in runs.glob("custom-toy/*/spec.json")]
    (custom,) = [s for s in specs if s.get("algorithm") == "custom"]
    assert custom["loss_source"] == source_hash("examples.my_loss:capped_reinforce")
