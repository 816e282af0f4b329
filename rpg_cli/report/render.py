"""The Last/Best table as text: Markdown, LaTeX (booktabs), CSV and JSON. The terminal table is the CLI's."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from rpg_cli import stats
from rpg_cli.report.tables import WHICH_TITLES, Cell, Table, cell_bounds, fmt


def column_title(bench: str, which: str) -> str:
    return f"{bench} {WHICH_TITLES[which]}"


def title(table: Table) -> str:
    return f"{table.sweep or 'all runs'}: {table.metric} in percent, {' / '.join(WHICH_TITLES[w] for w in table.which)}"


def group_title(group) -> str:
    return f"{group.model} · {group.context}" + (f" · {group.protocol}" if group.protocol else "")


def footer(table: Table) -> list[str]:
    """The lines under a table: what the intervals cover, then where the scores come from."""
    return [*table.notes, "Sources: " + "; ".join(table.sources) + "."]


def to_markdown(table: Table) -> str:
    """One Markdown table per model and context; best of each column **bold**, second <u>underlined</u>."""
    out = [f"## {title(table)}", ""]
    for group in table.groups:
        header = ["Method", "Seeds"]
        for bench, which in table.columns:
            header.append(column_title(bench, which))
            if table.compare_paper:
                header += ["paper", "Δ"]
        out += [
            f"### {group_title(group)}",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "|".join([":---", "---:"] + ["---:"] * (len(header) - 2)) + "|",
        ]
        for row in group.rows:
            line = [_md_escape(row.method), row.seeds_text]
            for column in table.columns:
                cell = row.cells[column]
                text = cell_bounds(cell)
                line.append(f"**{text}**" if cell.rank == 1 else f"<u>{text}</u>" if cell.rank == 2 else text)
                if table.compare_paper:
                    line += [fmt(cell.paper), fmt(cell.diff, signed=True)]
            out.append("| " + " | ".join(line) + " |")
        out.append("")
    out += [f"- {line}" for line in footer(table)]
    return "\n".join(out) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


_LATEX_SPECIAL = {
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def to_latex(table: Table) -> str:
    """A booktabs `table` environment: one row per method, a group header per model and context."""
    per_column = 3 if table.compare_paper else 1
    ncols = 2 + per_column * len(table.columns)
    spec = "lr" + "c" * (ncols - 2)
    lines = [
        "% needs \\usepackage{booktabs}",
        "\\begin{table}[t]",
        "\\centering",
        f"\\caption{{{latex_escape(title(table))}}}",
        f"\\begin{{tabular}}{{{spec}}}",
        "\\toprule",
    ]
    top = [" ", " "] + [
        f"\\multicolumn{{{len(table.which) * per_column}}}{{c}}{{{latex_escape(b)}}}" for b in table.benchmarks
    ]
    lines.append(" & ".join(top) + " \\\\")
    second = ["Method", "Seeds"]
    for _, which in table.columns:
        second.append(latex_escape(WHICH_TITLES[which]))
        if table.compare_paper:
            second += ["Paper", "$\\Delta$"]
    lines.append(" & ".join(second) + " \\\\")
    for group in table.groups:
        lines.append("\\midrule")
        lines.append(f"\\multicolumn{{{ncols}}}{{l}}{{\\textit{{{latex_escape(group_title(group))}}}}} \\\\")
        for row in group.rows:
            cells = [latex_escape(row.method), row.seeds_text]
            for column in table.columns:
                cell = row.cells[column]
                text = (
                    "--"
                    if cell.mean is None
                    else cell_bounds(cell).replace(" [", " {\\scriptsize [").replace("]", "]}")
                )
                cells.append(
                    f"\\textbf{{{text}}}" if cell.rank == 1 else f"\\underline{{{text}}}" if cell.rank == 2 else text
                )
                if table.compare_paper:
                    cells += [
                        fmt(cell.paper).replace("-", "--"),
                        "--" if cell.diff is None else f"${fmt(cell.diff, signed=True)}$",
                    ]
            lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    lines += [f"\\par\\footnotesize {latex_escape(line)}" for line in footer(table)]
    lines += ["\\end{table}"]
    return "\n".join(lines) + "\n"


def table_records(table: Table) -> list[dict[str, Any]]:
    """One flat dict per row: model, context, method, seeds (that finished), ran, runs (the finished ones),
    then per benchmark and Last/Best the estimate (mean), the 95% interval's bounds (low, high), seeds
    (n), problems, what the interval is about in words (covers: "new seeds and new problems" or "new
    seeds, these problems"), a caution where it covers less, rank (and paper, diff with
    --compare-paper), finished and ran, and not_finished: the runs that did not finish (name, seed,
    state, reason, step; a JSON list in CSV). Fractions in [0, 1]."""
    records = []
    for group in table.groups:
        for row in group.rows:
            rec: dict[str, Any] = {
                "model": group.model,
                "context": group.context,
                "method": row.method,
                "seeds": len(row.runs),
                "ran": len(row.runs) + len(row.not_finished),
                "runs": " ".join(row.runs),
            }
            for (bench, which), cell in row.cells.items():
                prefix = f"{bench}_{which}"
                for key in CELL_FIELDS:
                    rec[f"{prefix}_{key}"] = _field(cell, key)
            records.append(rec)
    return records


def to_csv(table: Table) -> str:
    return records_csv(table_records(table))


def records_csv(records: list[dict[str, Any]]) -> str:
    """Flat records as CSV, the first one's keys as the header: None empty, a list as JSON."""
    buf = io.StringIO()
    if records:
        writer = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
        writer.writeheader()
        for rec in records:
            writer.writerow(
                {k: "" if v is None else json.dumps(v) if isinstance(v, list) else v for k, v in rec.items()}
            )
    return buf.getvalue()


def to_json(table: Table) -> str:
    doc = {
        "sweep": table.sweep,
        "metric": table.metric,
        "benchmarks": table.benchmarks,
        "which": list(table.which),
        "select_on": table.select_on,
        "scale": "fractions in [0, 1]",
        "intervals_over": stats.THESE_PROBLEMS if table.fixed_problems else stats.SEEDS_AND_PROBLEMS,
        "notes": table.notes,
        "sources": table.sources,
        "groups": [
            {
                "model": g.model,
                "context": g.context,
                "protocol": g.protocol,
                "rows": [
                    {
                        "method": row.method,
                        "base": row.base,
                        "paper_method": row.paper_method,
                        "runs": row.runs,
                        "finished": len(row.runs),
                        "ran": len(row.runs) + len(row.not_finished),
                        "cells": {
                            bench: {
                                which: {k: _field(row.cells[(bench, which)], k) for k in CELL_FIELDS}
                                for which in table.which
                            }
                            for bench in table.benchmarks
                        },
                    }
                    for row in g.rows
                ],
            }
            for g in table.groups
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


def _field(cell: Cell, key: str) -> Any:
    """A cell's field as data: the runs that did not finish as dicts (name, seed, state, reason, step)."""
    value = getattr(cell, key)
    return [run.as_dict() for run in value] if key == "not_finished" else value


CELL_FIELDS = (
    "mean",
    "low",
    "high",
    "n",
    "problems",
    "covers",
    "caution",
    "rank",
    "paper",
    "diff",
    "finished",
    "ran",
    "not_finished",
)
RENDERERS = {"markdown": to_markdown, "latex": to_latex, "csv": to_csv, "json": to_json}
FORMAT_BY_SUFFIX = {".md": "markdown", ".markdown": "markdown", ".tex": "latex", ".csv": "csv", ".json": "json"}
