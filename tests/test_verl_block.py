"""The spec's `verl` block cannot change what a run computes outside its id, cannot send a run's outputs outside its
run directory, and carries no credential (issue 35, classes 4, 5 and 6).

`verl.site` is an allow-list (spec/models.py SITE_KEYS), keys compared as Hydra parses them; output keys and Ray's
runtime env (UNSETTABLE) are refused in both lists; credentials are refused by name and by value in every list.
Checked through the real CLI's dry run, verl's own composition of its config, spec.json, the store and the jobs
API of a real Ray head; the masker (store/url.py `redact`) and `rpg slurm`'s sbatch options too.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import yaml
from conftest import make_spec
from run_inputs import write_inputs
from typer.testing import CliRunner

from rpg_cli.cli import app
from rpg_cli.spec.verl_block import SITE_KEYS, SITE_VALUES, UNSETTABLE, credential_in, read_override, unsettable

SECRET = "S3cr3tPw9"  # every credential below holds it: it must never come out
ROLLOUT, ACTOR, MODEL = "actor_rollout_ref.rollout", "actor_rollout_ref.actor", "actor_rollout_ref.model"

# a verl cell on the e2e's tiny shapes: 1 GPU, 8 + 16 tokens, a local model directory
BASE = {
    "algorithm": "rpg_reinforce",
    "kl": "urkl",
    "beta": 0.05,
    "clip": {"eps_low": 0.2, "eps_high": 0.28},
    "optimizer": "adamw",
    "context": {"prompt": 8, "response": 16},
    "model": "model",
    "data": {"train_files": ["train.parquet"]},
    "train_batch_size": 4,
    "rollout_n": 2,
    "ppo_mini_batch_size": 2,
    "lr": 1e-3,
    "steps": 2,
    "seed": 0,
    "save_every": 2,
    "backend": "verl",
    "resources": {"nodes": 1, "gpus_per_node": 1, "cpus": 1},
}
# tests/e2e/conftest.py's site (sdpa, eager, no sleep mode, one worker each): what the CPU loop runs with
E2E_SITE = [
    f"+{MODEL}.override_config.attn_implementation=sdpa",
    f"{ROLLOUT}.enforce_eager=true",
    f"+{ROLLOUT}.enable_sleep_mode=false",
    f"{ROLLOUT}.free_cache_engine=false",
    f"{ROLLOUT}.agent.num_workers=1",
    "reward.num_workers=1",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "data.dataloader_num_workers=0",
]


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A working directory holding the cell's data and model directory."""
    monkeypatch.chdir(tmp_path)
    write_inputs(tmp_path, [make_spec(**BASE)])
    return tmp_path


def sweep_file(root: Path, verl: dict, name: str = "vb") -> Path:
    path = root / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump({"name": name, "base": {**copy.deepcopy(BASE), "verl": verl}, "grid": {"seed": [0]}})
    )
    return path


def dry_run(root: Path, verl: dict, *args: str):
    """`rpg sweep FILE --dry-run --format json` through the real CLI (in process)."""
    return CliRunner().invoke(app, ["sweep", str(sweep_file(root, verl)), "--dry-run", "--format", "json", *args])


def snapshot(root: Path) -> dict[str, int]:
    """Every file under `root` but the sweep files the tests write."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.suffix != ".yaml"}


def refused_in_one_line(result, *says: str) -> str:
    """The dry run's error: exit 2, one line on stderr saying each of `says`, no plan on stdout."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(s in lines[0] for s in says), result.stderr
    assert result.stdout == ""
    return lines[0]


# ----------------------------------------------------------------------- class 4: site changes nothing computed

COMPUTING_SITE = [  # what verl takes (see test_verl_composes_what_only_rpg_refuses) and changes what a run computes
    (f"{ACTOR}.optim={{lr:1.0}}", f"{ACTOR}.optim.lr"),  # a parent of a generated key, as a dict
    ("trainer.v1={rpg:{reference:frozen}}", "trainer.v1.rpg.reference"),
    ("+reward.custom_reward_function.reward_kwargs.scorers={toy:dapo}", "reward.custom_reward_function.reward_kwargs"),
    (f"{ACTOR}.optim.betas=[0.9,0.99]", f"{ACTOR}.optim.betas"),  # keys rpg does not generate
    ("algorithm.gamma=0.9", "algorithm.gamma"),
    (f"{ROLLOUT}.val_kwargs={{n:1}}", f"{ROLLOUT}.val_kwargs.n"),
    (f"+{MODEL}.override_config.rope_theta=1000", f"{MODEL}.override_config.rope_theta"),
    ("algorithm.kl_ctrl.kl_coef=0.5", "algorithm.kl_ctrl.kl_coef"),  # a generated key itself
    (f"{ACTOR}.loss_scale_factor=512", f"{ACTOR}.loss_scale_factor"),
    (f"{ACTOR}.fsdp_config.dtype=float16", f"{ACTOR}.fsdp_config.dtype"),
    (f"{ROLLOUT}={{gpu_memory_utilization:0.5,temperature:0.1}}", f"{ROLLOUT}.temperature"),  # one child of two
    (
        f"{ACTOR}.fsdp_config={{param_offload:true,wrap_policy:{{min_num_params:1}},seed:7}}",
        f"{ACTOR}.fsdp_config.seed",
    ),
]


@pytest.mark.parametrize("item, path", COMPUTING_SITE, ids=[p for _, p in COMPUTING_SITE])
def test_a_site_key_that_may_change_the_computation_is_refused_and_taken_in_overrides(workdir, item, path):
    before = snapshot(workdir)
    line = refused_in_one_line(dry_run(workdir, {"site": [item]}), "verl.site", path, "verl.overrides")
    assert "may change what a run computes" in line and snapshot(workdir) == before
    # in overrides it is part of the run id: the same cell, another id
    plain, moved = (json.loads(dry_run(workdir, verl).stdout)[0] for verl in ({}, {"overrides": [item]}))
    assert moved["id"] != plain["id"] and moved["entrypoint"][-1] == item


@pytest.mark.parametrize(
    "item, says",
    [
        (f"~{ROLLOUT}.gpu_memory_utilization", "site sets values and deletes none"),
        (f"{ROLLOUT}.gpu_memory_utilization=0.5,0.6", "a sweep"),
        (f"{ROLLOUT}.gpu_memory_utilization=range(1,3)", "a sweep"),
        ("data@data=legacy_data", "a config group"),
        ("actor@actor_rollout_ref.actor=dp_actor", "holds actor_rollout_ref.actor.profiler"),  # replaced whole
        # escaped: the YAML loader resolves ${...} itself; this one reaches verl as written
        (f"{ROLLOUT}.gpu_memory_utilization=\\${{oc.env:FRACTION}}", "an interpolation"),
        (f"{ROLLOUT}.gpu_memory_utilization={{x:1}}", "may change what a run computes"),  # a child of a leaf
        (f"+{MODEL}.override_config.attn_implementation=flex_attention", "allowed: flash_attention_2"),
        (f"{ROLLOUT}.gpu_memory_utilization={{", "not an override Hydra reads"),
    ],
)
def test_site_sets_plain_values_of_its_keys_only(workdir, item, says):
    refused_in_one_line(dry_run(workdir, {"site": [item]}), "verl.site", says)


def test_site_keys_keep_the_run_id_and_may_replace_a_generated_value_of_how_it_runs(workdir):
    plain = json.loads(dry_run(workdir, {}).stdout)[0]
    assert f"{ROLLOUT}.tensor_model_parallel_size=1" in plain["entrypoint"]  # rpg's, for 1 GPU
    site = [
        *E2E_SITE,
        f"{ROLLOUT}.tensor_model_parallel_size=2",  # generated by rpg: replaced, not given twice
        f"{ACTOR}.fsdp_config={{param_offload:true,optimizer_offload:true}}",  # a dict of site keys only
        f"{ROLLOUT}.log_prob_max_token_len_per_gpu=4096",
        f"{ACTOR}.ppo_max_token_len_per_gpu=64",  # generated too: the update's micro-batches only
        f"++{MODEL}.use_fused_kernels=true",
    ]
    result = dry_run(workdir, {"site": site, "env": {"NCCL_DEBUG": "INFO"}})
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)[0]
    assert run["id"] == plain["id"]  # not in the run id
    tensor_parallel = [a for a in run["entrypoint"] if a.startswith(f"{ROLLOUT}.tensor_model_parallel_size=")]
    assert tensor_parallel == [f"{ROLLOUT}.tensor_model_parallel_size=2"] and run["entrypoint"][-len(site) :] == site
    budget = [a for a in run["entrypoint"] if a.startswith(f"{ACTOR}.ppo_max_token_len_per_gpu=")]
    assert budget == [f"{ACTOR}.ppo_max_token_len_per_gpu=64"]


def test_every_setting_the_memory_estimate_suggests_for_site_is_a_site_key():
    """footprint._fix's "(verl.site)" advice passes the site check, the token budgets included (they split a
    batch only: verl normalizes the loss over the mini-batch)."""
    import inspect
    import re

    from rpg_cli.backends.verl import footprint

    source = inspect.getsource(footprint._fix)
    roles = {name: getattr(footprint, name) for name in ("ACTOR", "ROLLOUT", "REF", "MODEL")}
    keys = {f"{roles[role]}.{rest}" for role, rest in re.findall(r"\{([A-Z]+)\}\.([\w.]+\w)", source)}
    keys |= {f"{roles[role]}.log_prob_max_token_len_per_gpu" for role in ("ROLLOUT", "REF")}  # {key}.log_prob...
    assert len(keys) == 8 and f"{ACTOR}.ppo_max_token_len_per_gpu" in keys, keys
    assert keys <= set(SITE_KEYS), keys - set(SITE_KEYS)
    assert "verl.overrides" not in source and source.count("(verl.site") >= 6


def test_site_and_overrides_name_a_key_once():
    with pytest.raises(ValueError, match="given in both overrides and site"):
        make_spec(**BASE, verl={"overrides": [f"{ROLLOUT}.max_num_seqs=8"], "site": [f"++{ROLLOUT}.max_num_seqs=16"]})
    with pytest.raises(ValueError, match="given twice"):
        make_spec(**BASE, verl={"site": [f"{ROLLOUT}.max_num_seqs=8", f"+{ROLLOUT}.max_num_seqs=16"]})


# ---------------------------------------------------------------------- class 5: outputs stay in the run directory

OUTPUTS = [
    "trainer.default_local_dir=/etc/x",
    "trainer={default_local_dir:/etc/x}",
    "~trainer.default_local_dir",
    "~trainer",
    "++trainer.default_hdfs_dir=hdfs://nn/x",
    "trainer.rollout_data_dir=/elsewhere/r",
    "trainer.validation_data_dir=/elsewhere/v",
    "trainer.logger=[console,tensorboard]",
    "hydra.run.dir=/elsewhere/h",
    "hydra.sweep.dir=/elsewhere/h",
    "hydra.output_subdir=x",
    "hydra/job_logging=disabled",
    "global_profiler.save_path=/elsewhere/p",
    "global_profiler={tool:torch,finish_hook_cmd:'touch x'}",
    f"{ACTOR}.profiler={{enable:true,save_path:/elsewhere/p}}",
    "profiler@global_profiler=profiler",
    f"+{ROLLOUT}.prometheus.file=/elsewhere/prometheus.yml",
    "skip.rollout.dump_dir=/elsewhere/d",
    "ray_kwargs.timeline_json_file=/elsewhere/t.json",
    "+ray_kwargs.ray_init.runtime_env={working_dir:/elsewhere}",
    f"+{ACTOR}.megatron.router_replay.record_file=/elsewhere/r",  # a name that writes wherever it sits
    "+x@_global_=y",
]


@pytest.mark.parametrize("field", ["overrides", "site"])
@pytest.mark.parametrize("item", OUTPUTS)
def test_no_list_may_point_a_runs_outputs_or_rays_runtime_env_anywhere(workdir, field, item):
    line = refused_in_one_line(dry_run(workdir, {field: [item]}), f"verl.{field}", "allowed: any other key")
    assert "may change what a run computes" not in line  # the reason is where it writes, not the run id


def test_unsettable_keys_cover_every_output_of_verls_config_parents_included():
    """Every key of verl 0.9.1's composed config (and Hydra's) that names where something is written is refused,
    and so is every parent of one; the path-like keys left are things a run reads."""
    import re

    cfg, hydra_cfg = verl_config([], hydra=True)
    leaves = dict(flatten(cfg))
    assert {k for k in UNSETTABLE if k != "hydra"} <= {p for k in leaves for p in prefixes(k)}  # all of them exist
    hydra_keys = {f"hydra.{p}" for k in dict(flatten(hydra_cfg)) for p in prefixes(k)}
    assert {"hydra.run.dir", "hydra.sweep.dir", "hydra.output_subdir", "hydra.job.chdir"} <= hydra_keys
    assert all(unsettable(k) for k in hydra_keys)
    written = {k for k in leaves if re.search(r"(_dir|save_path|_json_file|record_file|_cmd|prometheus\.file)$", k)}
    assert written and all(unsettable(k) for k in written), sorted(k for k in written if not unsettable(k))
    for key in written:  # and their parents, up to the top: a dict or a deletion there would reach them
        assert all(unsettable(parent) for parent in prefixes(key)), key
    read = {k for k in leaves if re.search(r"(path|files?|url|address)$", k) and not unsettable(k)}
    assert all(re.search(r"(path|_files|config_file|url|address)$", k) for k in read), read
    assert f"{MODEL}.path" in read and "trainer.resume_from_path" in read  # inputs: part of the id in overrides


# ------------------------------------------------------------- verl's own composition: what it takes, what we keep


def test_verl_composes_every_site_key_and_the_e2e_site(tmp_path):
    """SITE_KEYS against verl 0.9.1's config: each is a key of it (or a field verl reads, given with `+`), and a
    spec setting every one to verl's own default composes and validates as main_ppo does."""
    pytest.importorskip("verl", reason="the verl extra is not installed")
    from omegaconf import OmegaConf
    from verl.workers.config import RolloutConfig

    from rpg_cli.backends.verl import launch

    cfg, _ = verl_config([])
    absent = {k for k in SITE_KEYS if OmegaConf.select(cfg, k, default="<absent>") == "<absent>"}
    assert absent == {f"{ROLLOUT}.enable_sleep_mode", f"{MODEL}.override_config.attn_implementation"}
    assert "enable_sleep_mode" in RolloutConfig.__dataclass_fields__  # verl reads it (workers/config/rollout.py)
    values = {k: SITE_VALUES.get(k, (False,))[0] if k in absent else OmegaConf.select(cfg, k) for k in SITE_KEYS}
    values[f"{ROLLOUT}.tensor_model_parallel_size"] = 1  # one GPU
    site = [f"{'+' if k in absent else ''}{k}={launch._hydra_value(v)}" for k, v in values.items()]
    for verl in ({"site": site}, {"site": E2E_SITE}):
        spec = make_spec(**BASE, verl=verl)
        composed, _ = verl_config(launch.overrides(spec, tmp_path / "run"), validate=True)
        assert OmegaConf.select(composed, f"{ROLLOUT}.tensor_model_parallel_size") == 1
        assert composed.trainer.default_local_dir == str(tmp_path / "run" / "checkpoints")


@pytest.mark.parametrize(
    "item, key, value",
    [
        (f"{ACTOR}.optim={{lr:1.0}}", f"{ACTOR}.optim.lr", 1.0),
        ("trainer.v1={rpg:{reference:frozen}}", "trainer.v1.rpg.reference", "frozen"),
        ("trainer.default_local_dir=/etc/x", "trainer.default_local_dir", "/etc/x"),
        (
            f"+ray_kwargs.ray_init.runtime_env={{env_vars:{{DB_PASS:{SECRET}}}}}",
            "ray_kwargs.ray_init.runtime_env",
            None,
        ),
    ],
)
def test_verl_composes_what_only_rpg_refuses(tmp_path, item, key, value):
    """The refused examples are real: verl's own config takes each (over rpg's generated overrides), so only the
    spec's check stands between them and a run under the unchanged cell's id."""
    pytest.importorskip("verl", reason="the verl extra is not installed")
    from omegaconf import OmegaConf

    from rpg_cli.backends.verl import launch

    composed, _ = verl_config([*launch.overrides(make_spec(**BASE), tmp_path / "run"), item], validate=True)
    got = OmegaConf.select(composed, key)
    assert got == value if value is not None else SECRET in json.dumps(OmegaConf.to_container(got))
    with pytest.raises(ValueError, match="verl.site|site"):
        make_spec(**BASE, verl={"site": [item]})


@pytest.mark.slow
def test_check_install_takes_a_spec_with_every_site_key(tmp_path):
    """The submit-time check (launch.check_install: verl's config composed in a fresh interpreter by
    diagnose.check_plugin_loads) takes the site table and the e2e's site."""
    pytest.importorskip("verl", reason="the verl extra is not installed")
    from rpg_cli.backends.verl import launch

    site = [f"{ROLLOUT}.gpu_memory_utilization=0.3", f"{ACTOR}.entropy_from_logits_with_chunking=true", *E2E_SITE]
    spec = make_spec(**BASE, verl={"site": site, "overrides": [f"{ACTOR}.optim.betas=[0.9,0.99]"]})
    launch.check_install({spec.run_name: launch.entrypoint(spec, tmp_path / "run")})


# --------------------------------------------------------------------------- class 6: no credential in the block

CREDENTIAL_ENV = [
    {"DB_PASS": SECRET},
    {"MYSQL_PWD": SECRET},
    {"PGPASSFILE": "/home/u/.pgpass"},
    {"GITHUB_PAT": SECRET},
    {"NETRC": "/home/u/.netrc"},
    {"AWS_SECRET_ACCESS_KEY": SECRET},
    {"MY_APP_AUTH": SECRET},
    {"DATABASE_URL": f"postgresql://u:{SECRET}@db.example/rpg"},
    {"RPG_DB": "postgresql://db.example/rpg"},  # the store's own variable, with or without a password
    {"STORE": "postgresql+psycopg://db.example/rpg"},  # a database server's URL: a job never opens one
    {"https_proxy": f"http://u:{SECRET}@proxy:3128"},
    {"MLFLOW_TRACKING_URI": f"http://u:{SECRET}@mlflow:5000"},
    {"REPO": f"https://{SECRET}@github.com/org/repo"},  # a token as the URL's user
    {"STORE_URL": f"postgresql://db.example/rpg?%70assword={SECRET}"},  # percent-encoded
    {"STORE_URL": f"postgresql://db.example/rpg?sslmode=require&%2570assword={SECRET}"},  # encoded twice
    {"CONNINFO": f"host=db.example password={SECRET}"},
    {"HUB": "hf_" + "a1B2" * 9},  # a token's shape, whatever its name
    {"GH": "ghp_" + "x9Y8" * 9},
    {"DB_PASS": 12345},  # refused by its name before the type check could print the value
]


@pytest.mark.parametrize("env", CREDENTIAL_ENV, ids=[next(iter(e)) for e in CREDENTIAL_ENV])
@pytest.mark.parametrize("output", ["json", "table"])
def test_a_credential_in_env_is_refused_whatever_its_name_and_never_printed(workdir, env, output):
    name, value = next(iter(env.items()))
    result = dry_run(workdir, {"env": env}, "--format", output)
    line = refused_in_one_line(result, "verl.env", name)
    assert str(value) not in result.output and SECRET not in line


CREDENTIAL_OVERRIDES = [
    f"+ray_kwargs.ray_init.runtime_env={{env_vars:{{DB_PASS:{SECRET}}}}}",  # the runtime-env channel
    f"++ray_kwargs.ray_init.runtime_env.env_vars.HARMLESS={SECRET}",
    f"data.custom_cls.path=https://u:{SECRET}@host/x.py",
    f"+reward.custom_reward_function.reward_kwargs={{api_key:{SECRET}}}",
    f"+reward.custom_reward_function.reward_kwargs.password={SECRET}",
    f"+reward.custom_reward_function.reward_kwargs.url='https://h/x?%74oken={SECRET}'",
    f"reward.sandbox_fusion.url=https://{SECRET}@sandbox",
]


@pytest.mark.parametrize("field", ["overrides", "site"])
@pytest.mark.parametrize("item", CREDENTIAL_OVERRIDES)
def test_a_credential_in_overrides_or_site_is_refused_and_never_printed(workdir, field, item):
    result = dry_run(workdir, {field: [item]})
    refused_in_one_line(result, f"verl.{field}")
    assert SECRET not in result.output


def test_settings_that_look_like_credentials_are_not():
    spec = make_spec(
        **BASE,
        verl={
            "env": {
                "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": "/opt/x",
                "http_proxy": "http://proxy:3128",
                "NCCL_SOCKET_IFNAME": "eth0",
                "PATH_PREFIX": "/opt",
            },
            "overrides": ["data.prompt_key=question", "data.train_files=[train.parquet]"],
        },
    )
    assert spec.verl.env["TOKENIZERS_PARALLELISM"] == "false"
    assert credential_in("git@github.com:org/repo.git") is None and credential_in("https://host/x?y=1") is None


def test_the_refused_block_reaches_no_spec_json_store_or_head(workdir):
    """`rpg sweep` (not a dry run) of a cell with a credential: one line, and nothing written: no run directory
    (spec.json), no store."""
    db = workdir / "results.db"
    path = sweep_file(workdir, {"env": {"DATABASE_URL": f"postgresql://u:{SECRET}@db/rpg"}})
    result = CliRunner().invoke(app, ["sweep", str(path), "--db", f"sqlite:///{db}", "--runs-dir", "runs"])
    assert result.exit_code == 2 and SECRET not in result.output
    assert not db.exists() and not (workdir / "runs").exists()


@pytest.mark.slow
def test_the_jobs_api_of_a_real_head_holds_no_credential(workdir):
    """Against rpg's own local head: a refused sweep submits nothing (the jobs API lists no new job and no job
    holds the secret), and an accepted block's job carries exactly launch.env's variables."""
    pytest.importorskip("ray.job_submission", reason="the Ray tests need ray[default]")
    from rpg_cli.backends.verl import launch
    from rpg_cli.orchestration.head import connect, local_head, stop_local_head
    from rpg_cli.orchestration.submit import submit

    runs = workdir / "runs"
    local_head(runs, num_cpus=2)
    try:
        client = connect(runs_dir=runs, start=False)
        spec = make_spec(**BASE, verl={"env": {"http_proxy": "http://proxy:3128", "NCCL_DEBUG": "INFO"}})
        env = launch.env(spec, runs / "vb" / spec.run_name)
        submit(client, [sys.executable, "-c", "print('ok')"], f"control-{spec.run_id}", env=env)
        info = client.get_job_info(f"control-{spec.run_id}")
        assert info.runtime_env["env_vars"] == env
        before = {j.submission_id for j in client.list_jobs()}
        for verl in (
            {"env": {"STORE": f"postgresql://u:{SECRET}@db/rpg"}},
            {"site": [f"+ray_kwargs.ray_init.runtime_env={{env_vars:{{X:{SECRET}}}}}"]},
            {"overrides": [f"data.custom_cls.path=https://{SECRET}@h/x.py"]},
        ):
            path = sweep_file(workdir, verl)
            result = CliRunner().invoke(app, ["sweep", str(path), "--runs-dir", str(runs), "--detach"])
            assert result.exit_code == 2 and SECRET not in result.output
        jobs = client.list_jobs()
        assert {j.submission_id for j in jobs} == before
        assert all(SECRET not in repr(job) for job in jobs)
        assert not (runs / "vb").exists()
    finally:
        assert stop_local_head(runs)


# ------------------------------------------------------------------------------------------- masking, sbatch


@pytest.mark.parametrize(
    "text",
    [
        f"postgresql://db/rpg?%70assword={SECRET}",
        f"postgresql://db/rpg?sslmode=require&%2570assword={SECRET}&user=a",
        f"postgresql://db/rpg?PASS%57ORD={SECRET}",
        f"postgresql://db/rpg?ssl%70assword={SECRET}",
        f"env DB_PASS={SECRET} NCCL_DEBUG=INFO",
        f"MYSQL_PWD={SECRET}",
        f"next=https://h/?password={SECRET}&x=1",
        f"RAY_AUTH_TOKEN={SECRET}",
    ],
)
def test_the_masker_decodes_a_parameters_name_before_judging_it(text):
    from rpg_cli.store.url import redact

    shown = redact(text)
    assert SECRET not in shown and "***" in shown, shown
    for kept in ("TOKENIZERS_PARALLELISM=false", "NCCL_DEBUG=INFO", "a=b=c", "bypass the cache"):
        assert redact(kept) == kept


def test_the_dry_runs_verl_line_is_masked_even_for_a_block_that_got_past_the_spec():
    from types import SimpleNamespace

    from rpg_cli.orchestration.dryrun import _verl_blocks

    plan = SimpleNamespace(spec={"verl": {"env": {"DB_PASS": SECRET}, "site": [f"x=postgresql://u:{SECRET}@h/d"]}})
    (line,) = _verl_blocks([plan])
    assert SECRET not in line and "DB_PASS=***" in line


@pytest.mark.parametrize(
    "arg",
    [
        f"--export=ALL,RPG_DB=postgresql://u:{SECRET}@db/rpg",
        f"--export=ALL,DB_PASS={SECRET}",
        f"--export=GITHUB_PAT={SECRET}",
        f"--export=ALL,STORE=postgresql://db/rpg?%70assword={SECRET}",
        f"--comment=https://u:{SECRET}@host",
        f"--export=HUB=hf_{'a1B2' * 9}",
    ],
)
def test_rpg_slurm_refuses_a_credential_in_an_sbatch_option(tmp_path, monkeypatch, arg):
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no Slurm here: the dry run is the same everywhere
    monkeypatch.chdir(tmp_path)
    path = sweep_file(tmp_path, {})
    write_inputs(tmp_path, path)
    result = CliRunner().invoke(app, ["slurm", str(path), "--dry-run", "--sbatch-arg", arg])
    assert result.exit_code == 2 and result.stdout == "", result.output  # no script printed
    assert SECRET not in result.output and "a1B2a1B2" not in result.output
    assert "--sbatch-arg" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    ok = CliRunner().invoke(
        app, ["slurm", str(path), "--dry-run", "--sbatch-arg", "--export=ALL,DB_PASS,NCCL_DEBUG=INFO"]
    )
    assert ok.exit_code == 0 and "#SBATCH --export=ALL,DB_PASS,NCCL_DEBUG=INFO" in ok.stdout, ok.output


# ------------------------------------------------------------------------------------------------ helpers


def verl_config(overrides: list[str], validate: bool = False, hydra: bool = False):
    """verl 0.9.1's ppo_trainer config composed with `overrides` (validated as main_ppo does when `validate`), and
    Hydra's own config when `hydra` (else None)."""
    pytest.importorskip("verl", reason="the verl extra is not installed")
    import verl
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
        full = compose(config_name="ppo_trainer", overrides=overrides, return_hydra_config=True) if hydra else None
    if validate:
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    return cfg, (full.hydra if hydra else None)


def flatten(cfg) -> list[tuple[str, object]]:
    """(dotted path, raw value) of every leaf of an OmegaConf config, interpolations unresolved."""
    from omegaconf import OmegaConf

    def walk(node, prefix):
        if isinstance(node, dict) and node:
            for k, v in node.items():
                yield from walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            yield prefix, node

    return list(walk(OmegaConf.to_container(cfg, resolve=False), ""))


def prefixes(key: str) -> list[str]:
    """`a.b.c` -> [a, a.b, a.b.c]."""
    parts = key.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def test_read_override_is_hydras_reading():
    parsed = read_override(f"++{ROLLOUT}={{gpu_memory_utilization:0.5,agent:{{num_workers:1}}}}")
    assert parsed.key == ROLLOUT and not parsed.delete and not parsed.group
    assert parsed.leaves == ((f"{ROLLOUT}.gpu_memory_utilization", 0.5), (f"{ROLLOUT}.agent.num_workers", 1))
    assert read_override("~trainer.logger").delete and read_override("hydra/output=default").group
