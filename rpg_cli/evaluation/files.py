"""The files an evaluation keeps in a run directory, and their formats: under `<run_dir>/eval/step_N/`,
`<benchmark>.scored.jsonl` (`ScoredFile`: a problem's scored samples a line, the line format is
store/ingest.py's) and `<benchmark>.jsonl` (`ResponseCache`: a problem's generated responses a line).
Files only: what the evaluation job writes and reads back to resume; it never opens the store."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rpg_cli import rundir
from rpg_cli.evaluation.generation import Response
from rpg_cli.evaluation.plan import Sampling
from rpg_cli.store.ingest import SAMPLE_PROTOCOL, parse_lines, parse_sample_line, sample_line


class ScoredFile:
    """One (run, step, benchmark)'s scored-samples file (store/ingest.py): appended one problem a line,
    read back for the problems recorded under one scorer and protocol."""

    def __init__(self, path: Path, scorer: str, sampling: Sampling):
        self.path, self.scorer, self.sampling = Path(path), scorer, sampling

    def load(self) -> dict[str, list[tuple[str | None, bool]]]:
        """Problems recorded with all k samples under this scorer and protocol: problem -> [(extracted,
        correct)] (a problem recorded twice: its last line)."""
        data = rundir.read_owned(self.path)
        if data is None:
            return {}
        found: dict[str, list[tuple[str | None, bool]]] = {}
        protocol = self.sampling.protocol
        for line in parse_lines(data, parse_sample_line).events:
            if line["scorer"] == self.scorer and all(line["protocol"][n] == protocol[n] for n in SAMPLE_PROTOCOL):
                found[line["problem"]] = [(s.get("extracted"), s["correct"]) for s in line["samples"]]
        return found

    def append(self, problem: str, position: int, version: str, samples: list[tuple[str | None, bool, int]]) -> None:
        run_dir = rundir.make_run_dir(self.path.parent.parent.parent)
        rundir.make_dirs(self.path.parent.absolute(), run_dir)
        line = sample_line(problem, position, self.scorer, version, self.sampling.protocol, samples)
        rundir.append_line(self.path, line)


class ResponseCache:
    """Generated responses of one (run, step, benchmark): a JSON line per problem, appended as they come.

    A line counts only if it was sampled with the same settings (temperature, top-p, max tokens, seed)
    and holds at least k responses; a line cut short by a crash is skipped.
    """

    def __init__(self, path: Path, sampling: Sampling):
        self.path = Path(path)
        self.settings = {k: v for k, v in sampling.describe().items() if k != "k"}
        self.k = sampling.k

    def load(self) -> dict[str, list[Response]]:
        found: dict[str, list[Response]] = {}
        data = rundir.read_owned(self.path)
        if data is None:
            return found
        for line in data.decode("utf-8", errors="replace").splitlines():
            try:
                record: dict[str, Any] = json.loads(line)
                if record["sampling"] != self.settings or len(record["responses"]) < self.k:
                    continue
                found[record["problem"]] = [Response(r["text"], int(r["length"])) for r in record["responses"]]
            except (ValueError, KeyError, TypeError):
                continue
        return found

    def append(self, problem_key: str, responses: Sequence[Response]) -> None:
        run_dir = rundir.make_run_dir(self.path.parent.parent.parent)
        rundir.make_dirs(self.path.parent.absolute(), run_dir)
        line = json.dumps(
            {
                "problem": problem_key,
                "sampling": self.settings,
                "responses": [{"text": r.text, "length": r.length} for r in responses],
            },
            ensure_ascii=False,
        )
        rundir.append_line(self.path, line)
