"""What a run reads before it starts -- its data files, its model, its prompts -- checked before a GPU
is paid for: by `rpg sweep --dry-run`, before a real submission (each backend's `preflight`), and by
the local backend's job before it loads anything.

    check_run(spec) -> [Finding]    errors (the run would fail) and notes (what could not be checked)
    validation_cost(spec)           what a run's validation generates (count_problems: a file's problems)

Cheap by construction, so that the dry run stays fast: a parquet file's columns come from its footer;
a model is a local directory or an entry of the local Hugging Face cache (nothing is downloaded); prompts are counted with the `tokenizers` library on the model's
tokenizer.json (no torch, no transformers), only when that file is here, and exactly only where the
prompt's length in bytes could exceed the limit (a token of a byte-level or character tokenizer
covers at least one byte). A check that cannot be made cheaply is said, never skipped silently.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpg_cli.benchmarks import problem_key
from rpg_cli.file_facts import remembered

if TYPE_CHECKING:
    from rpg_cli.spec import ExperimentSpec

# The columns verl (and the local backend) read from a data file, as prepare-data writes them.
REQUIRED_COLUMNS = ("prompt", "reward_model.ground_truth", "data_source")
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")
_SLACK_TOKENS = 4  # a prefix space or a post-processor's tokens beyond the byte bound


@dataclass(frozen=True)
class Finding:
    field: str  # the spec field it is about: model, data.train_files, ...
    message: str  # one line: the problem and its fix, or what could not be checked
    error: bool  # True: the run would fail; False: a note

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def check_run(spec: ExperimentSpec) -> list[Finding]:
    """Every finding about the inputs of `spec`: its data files, its model, and its prompts' lengths
    against the context's prompt length and the model's positions."""
    files = [("data.train_files", f) for f in spec.data.train_files] + [
        ("data.val_files", f) for f in spec.data.val_files
    ]
    findings: list[Finding] = []
    readable = []
    for key, name in files:
        found = check_data_file(key, name)
        findings += found
        if not found:
            readable.append((key, name))
    train = [name for key, name in readable if key == "data.train_files"]
    if len(train) == len(spec.data.train_files):  # every training file is here and readable
        rows = training_rows(train)
        if rows is not None and spec.train_batch_size > rows:
            findings.append(
                Finding(
                    "train_batch_size",
                    f"{spec.train_batch_size} prompts per step, but the training files hold {rows} rows "
                    f"(a step's batch is drawn from them); allowed: at most {rows}, or more training data",
                    error=True,
                )
            )
    model_dir, model_finding = resolve_model(spec.model)
    findings += [model_finding] if model_finding else []
    if model_dir is not None and readable:
        findings += check_prompt_lengths(spec.model, model_dir, tuple(readable), spec.max_prompt_length)
    return findings


# ------------------------------------------------------------------------------------------ data


def check_data_file(key: str, name: str) -> list[Finding]:
    """The file exists and is a parquet file with the columns verl needs and at least one row."""
    if "://" in name:
        return [Finding(key, f"could not check {name}: only local files are checked", error=False)]
    path = Path(name).expanduser()
    if path.is_dir():
        return [Finding(key, f"{name} is a directory, not a parquet file; name the .parquet file in it", error=True)]
    if not path.is_file():
        how = "rpg prepare-data --toy" if "toy" in name else "rpg prepare-data"
        return [
            Finding(
                key,
                f"{name} does not exist (relative paths are taken from {Path.cwd()}); write it with `{how}`",
                error=True,
            )
        ]
    try:
        columns, rows, prompt_type = _parquet_schema(str(path.resolve()), *_stamp(path))
    except (OSError, ValueError) as exc:
        return [
            Finding(key, f"{name} is not a readable parquet file ({exc}); write it with `rpg prepare-data`", error=True)
        ]
    if rows == 0:  # before the columns: a file written from an empty table often has none
        return [Finding(key, f"{name} has no rows; write it with `rpg prepare-data`", error=True)]
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        return [
            Finding(
                key,
                f"{name} lacks the column(s) verl needs: {', '.join(missing)}; write it with `rpg prepare-data`",
                error=True,
            )
        ]
    if prompt_type is not None:
        return [
            Finding(
                key,
                f"{name}: its prompt column holds {prompt_type}, not chat messages (a list of "
                "{role, content}); write it with `rpg prepare-data`",
                error=True,
            )
        ]
    return []


def training_rows(files: list[str]) -> int | None:
    """The rows of the local training files together (from their footers); None where one cannot be read."""
    total = 0
    for name in files:
        path = Path(name).expanduser()
        try:
            total += _parquet_schema(str(path.resolve()), *_stamp(path))[1]
        except (OSError, ValueError):
            return None
    return total


def parquet_schema(path: str | Path) -> tuple[frozenset[str], int]:
    """The column paths of a parquet file (dotted; groups included: reward_model, reward_model.ground_truth)
    and its row count, from its footer alone. ValueError when it is not a parquet file."""
    return _parquet_schema(str(Path(path).resolve()), *_stamp(Path(path)))[:2]


@remembered(
    "parquet-schema",
    encode=lambda v: [sorted(v[0]), v[1], v[2]],
    decode=lambda v: (frozenset(v[0]), int(v[1]), v[2]),
)
def _parquet_schema(path: str, _mtime_ns: int, _size: int) -> tuple[frozenset[str], int, str | None]:
    """Columns, rows, and the type of the prompt column when it is not a list of {role, content} structs
    (file_facts: kept across processes, so a re-planned grid does not import pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except (
        pa.ArrowException,
        OSError,
    ) as exc:  # pyarrow's message ends in a hint at the cause; the first clause is enough
        raise ValueError(str(exc).split(". ")[0].rstrip(".")) from None
    columns: set[str] = set()

    def walk(field: pa.Field, prefix: str) -> None:
        columns.add(prefix + field.name)
        if pa.types.is_struct(field.type):
            for child in field.type:
                walk(child, prefix + field.name + ".")

    for field in schema:
        walk(field, "")
    prompt = schema.field("prompt").type if "prompt" in schema.names else None
    messages = (
        prompt is not None
        and (pa.types.is_list(prompt) or pa.types.is_large_list(prompt))
        and pa.types.is_struct(prompt.value_type)
        and prompt.value_type.get_field_index("content") >= 0
    )
    return frozenset(columns), meta.num_rows, None if prompt is None or messages else str(prompt)


def _stamp(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_mtime_ns, info.st_size


# ---------------------------------------------------------------------------------------------
# What validation costs (the dry run states it before a GPU is paid for)

# files above this size are not read at plan time (their problems stay uncounted)
MAX_COUNTED_FILE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class ProblemCount:
    rows: int
    problems: int  # distinct (prompt, ground truth) pairs: what `rpg eval` and the local backend sample


@dataclass(frozen=True)
class ValidationCost:
    samples_per_problem: int  # val.n
    validations: int  # per run: before training, every val.every steps, and at the last step
    problems: int | None  # distinct problems over data.val_files; None when a file cannot be counted here

    @property
    def generations(self) -> int | None:
        """Responses generated at each validation."""
        return None if self.problems is None else self.problems * self.samples_per_problem

    def as_dict(self) -> dict[str, int | None]:
        return {
            "problems": self.problems,
            "samples_per_problem": self.samples_per_problem,
            "generations_per_validation": self.generations,
            "validations_per_run": self.validations,
        }


def validation_cost(spec: ExperimentSpec | dict[str, Any]) -> ValidationCost | None:
    """What one run's validation generates (None: the run does not validate); `spec` may be canonical JSON.
    Problems are counted where the files are local and small; both backends sample val.n responses per
    distinct problem (verl refuses a file that repeats problems, the local backend and `rpg eval` group
    the copies)."""
    if isinstance(spec, dict):
        from rpg_cli.spec import ExperimentSpec

        spec = ExperimentSpec.model_validate(spec)
    if not spec.data.val_files:
        return None
    counts = [count_problems(f) for f in spec.data.val_files]
    problems = None if any(c is None for c in counts) else sum(c.problems for c in counts)
    validations = 1 + spec.steps // spec.val.every + (1 if spec.steps % spec.val.every else 0)
    return ValidationCost(spec.val.n, validations, problems)


def count_problems(path: str | Path) -> ProblemCount | None:
    """Rows and distinct problems of a local verl-format parquet; None for a file that is not there, not
    readable as one, or too big to read at plan time (pyarrow is imported only when there is a file)."""
    p = Path(path)
    try:
        stat = p.stat()
    except (OSError, ValueError):
        return None
    if "://" in str(path) or not p.is_file() or stat.st_size > MAX_COUNTED_FILE_BYTES:
        return None
    return _count_problems(str(p.resolve()), stat.st_mtime_ns, stat.st_size)


@remembered("problems", encode=lambda c: [c.rows, c.problems], decode=lambda v: ProblemCount(int(v[0]), int(v[1])))
def _count_problems(path: str, mtime_ns: int, size: int) -> ProblemCount | None:
    try:
        import pyarrow.parquet as pq

        with pq.ParquetFile(path) as parquet:  # read_table would import pandas (through pyarrow.dataset)
            table = parquet.read(columns=["prompt", "reward_model"])
        # one problem per prompt and ground truth, as the local trainer and `rpg eval` count them
        keys = {
            problem_key(row["prompt"], (row["reward_model"] or {}).get("ground_truth")) for row in table.to_pylist()
        }
    except Exception:  # not a verl parquet: the run's own checks say so; here it is just not counted
        return None
    return ProblemCount(table.num_rows, len(keys))


# ----------------------------------------------------------------------------------------- model


def resolve_model(model: str) -> tuple[Path | None, Finding | None]:
    """The model's local directory (a directory, or its snapshot in the Hugging Face cache), and a
    finding: an error when it cannot exist, a note when it could not be checked."""
    if "://" in model:
        return None, Finding("model", f"could not check {model}: only local directories and hub ids are", False)
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            return None, Finding(
                "model",
                f"{model} has no config.json; point it at an HF causal-LM directory "
                "(rpg prepare-data --toy writes data/toy/model)",
                error=True,
            )
        return path, None
    if model.count("/") == 1 and not model.startswith((".", "/", "~")):
        snapshot = cached_snapshot(model)
        if snapshot is not None and (snapshot / "config.json").is_file():
            return snapshot, None
        return None, Finding(
            "model",
            f"could not check {model}: it is not in the local Hugging Face cache "
            f"({hub_cache()}), and nothing is downloaded here (the job downloads it)",
            error=False,
        )
    return None, Finding(
        "model",
        f"{model} does not exist; point it at an HF causal-LM directory or a hub id "
        "(rpg prepare-data --toy writes data/toy/model)",
        error=True,
    )


def hub_cache() -> Path:
    """The Hugging Face hub cache, where huggingface_hub puts it ($HF_HUB_CACHE, $HF_HOME/hub, ...)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def cached_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot of a hub model (its main revision when recorded), or None."""
    root = hub_cache() / f"models--{repo_id.replace('/', '--')}"
    ref = root / "refs" / "main"
    if ref.is_file() and (root / "snapshots" / ref.read_text().strip()).is_dir():
        return root / "snapshots" / ref.read_text().strip()
    snapshots = sorted((root / "snapshots").glob("*")) if (root / "snapshots").is_dir() else []
    return snapshots[-1] if snapshots else None


def model_positions(model_dir: Path) -> int | None:
    """How many positions the model has (config.json's max_position_embeddings or its synonyms)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for scope in (config, config.get("text_config") or {}):
        for key in _POSITION_KEYS:
            if isinstance(scope.get(key), int) and scope[key] > 0:
                return scope[key]
    return None


# --------------------------------------------------------------------------------------- prompts


def check_prompt_lengths(
    model: str, model_dir: Path, files: tuple[tuple[str, str], ...], max_prompt_length: int
) -> list[Finding]:
    """Prompts (chat template applied, as both backends apply it) against the context's prompt length
    (longer ones are left out, as verl's filter_overlong_prompts does) and the model's positions (which
    must hold the longest prompt kept and at least one response token)."""
    stamps = tuple((key, name, *_stamp(Path(name))) for key, name in files)
    return list(_check_prompt_lengths(model, str(model_dir), stamps, max_prompt_length))


@functools.lru_cache(maxsize=64)
def _check_prompt_lengths(
    model: str, model_dir: str, stamps: tuple[tuple[str, str, int, int], ...], max_prompt_length: int
) -> tuple[Finding, ...]:
    try:
        counter = _PromptCounter(Path(model_dir))
    except _CannotCount as exc:
        return (Finding("data", f"could not count prompt tokens against {model}: {exc}", error=False),)
    positions = model_positions(Path(model_dir))
    threshold = min(max_prompt_length, positions - 1) if positions else max_prompt_length
    findings = []
    for key, name, *_ in stamps:
        try:
            lengths = counter.lengths(name, threshold)
        except _CannotCount as exc:
            findings.append(Finding(key, f"could not count the prompt tokens of {name}: {exc}", error=False))
            continue
        kept = [n for n in lengths if n <= max_prompt_length]
        if lengths and not kept:
            findings.append(
                Finding(
                    key,
                    f"{name}: no prompt fits in the context's {max_prompt_length} prompt tokens "
                    f"(the shortest has {min(lengths)}); use a longer context or shorter prompts",
                    error=True,
                )
            )
        elif positions is not None and kept and max(kept) >= positions:
            findings.append(
                Finding(
                    key,
                    f"{name}: the longest prompt is {max(kept)} tokens but {model} has {positions} "
                    "positions (max_position_embeddings), which must hold a prompt and its "
                    "response; use shorter prompts or a model with more positions",
                    error=True,
                )
            )
        elif len(kept) < len(lengths):
            findings.append(
                Finding(
                    key,
                    f"{name}: {len(lengths) - len(kept)} of {len(lengths)} prompts are longer than "
                    f"{max_prompt_length} tokens and are left out (verl's filter_overlong_prompts)",
                    error=False,
                )
            )
    return tuple(findings)


class _CannotCount(Exception):
    """A prompt check that cannot be made cheaply; the message says why."""


class _PromptCounter:
    """Token counts of prompts as the backends encode them: the tokenizer's chat template with the
    generation prompt, else the messages' text with the tokenizer's special tokens."""

    def __init__(self, model_dir: Path):
        if not (model_dir / "tokenizer.json").is_file():
            raise _CannotCount(
                f"{model_dir} has no tokenizer.json (only a fast tokenizer is read without transformers)"
            )
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise _CannotCount("the `tokenizers` package is not installed") from None
        try:
            self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own exception type for a file it cannot read
            raise _CannotCount(f"its tokenizer.json does not load ({str(exc).splitlines()[0][:120]})") from None
        config = _json_or_empty(model_dir / "tokenizer_config.json")
        self.template = _chat_template(model_dir, config)
        self.special = {k: _token_text(v) for k, v in config.items() if k.endswith("_token") and _token_text(v)}
        self._compiled = None
        self._overhead: dict[tuple[str, ...], int] = {}

    def lengths(self, name: str, threshold: int) -> list[int]:
        """Each prompt's token count, exact where it could exceed `threshold`, else an upper bound no
        larger than `threshold` (so the longest, and any count above it, are exact)."""
        try:
            import pyarrow.parquet as pq

            with pq.ParquetFile(name) as parquet:  # pq.read_table goes through pyarrow.dataset, which imports pandas
                prompts = parquet.read(columns=["prompt"]).column("prompt").to_pylist()
        except ImportError:
            raise _CannotCount("pyarrow is not installed") from None
        except Exception as exc:  # pyarrow raises several types for unreadable files
            raise _CannotCount(f"its prompt column does not read ({type(exc).__name__})") from None
        bounds = [self._bound(messages or []) for messages in prompts]
        close = [i for i, bound in enumerate(bounds) if bound > threshold]
        if close:
            exact = self._count([prompts[i] or [] for i in close])
            for i, n in zip(close, exact):
                bounds[i] = n
        return bounds

    def _bound(self, messages: list[dict]) -> int:
        roles = tuple(str(m.get("role")) for m in messages)
        if roles not in self._overhead:
            text = self._text([{**m, "content": ""} for m in messages])
            specials = len(self.tokenizer.encode("", add_special_tokens=self.template is None).ids)
            self._overhead[roles] = len(text.encode("utf-8")) + specials + _SLACK_TOKENS
        return self._overhead[roles] + sum(len(str(m.get("content") or "").encode("utf-8")) for m in messages)

    def _count(self, prompts: list[list[dict]]) -> list[int]:
        texts = [self._text(messages) for messages in prompts]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=self.template is None)
        return [len(e.ids) for e in encodings]

    def _text(self, messages: list[dict]) -> str:
        if self.template is None:
            return "".join(str(m.get("content") or "") for m in messages)
        try:
            return self._template().render(messages=messages, add_generation_prompt=True, **self.special)
        except _CannotCount:
            raise
        except Exception as exc:  # jinja2's errors, or the template's raise_exception
            raise _CannotCount(f"the chat template does not render here ({type(exc).__name__}: {exc})") from None

    def _template(self):
        """The chat template compiled as transformers compiles it (sandboxed, loop controls, tojson)."""
        if self._compiled is None:
            try:
                from datetime import datetime

                import jinja2
                import jinja2.ext
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ImportError:
                raise _CannotCount("jinja2 is not installed (the chat template needs it)") from None

            def raise_exception(message: str) -> None:
                raise jinja2.exceptions.TemplateError(message)

            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
            )
            env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._compiled = env.from_string(self.template)
        return self._compiled


def _chat_template(model_dir: Path, config: dict) -> str | None:
    """The tokenizer's chat template: chat_template.jinja (transformers 5), else tokenizer_config.json's."""
    if (model_dir / "chat_template.jinja").is_file():
        return (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) and template else None


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # a serialized AddedToken
        value = value.get("content")
    return value if isinstance(value, str) else None


def _json_or_empty(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
