"""Tables and plots from the results store: the paper's Last/Best tables, training curves, run summaries.

    names    methods, models, contexts and benchmarks as the paper writes them; the rows' order
    scores   where each run's Last/Best comes from (`rpg eval`, else its logged validation)
    evidence per-problem scores (`rpg eval` samples) or benchmark means behind each interval
    tables   the Last/Best table as data: rows per method, score and 95% interval, ranks, paper numbers
    compare  `rpg compare A B`: two groups of runs, the paired difference and a verdict (at a step, or at a budget)
    costs    `rpg report --cost`: device-hours, phases, throughput and MFU per cell; device-hours per step
    options  what a user asks of a table, the plots, a comparison, with the defaults
    render   the table as Markdown, LaTeX, CSV, JSON (the terminal table is the CLI's)
    plots    training dynamics (matplotlib, imported only when drawing)
    summary  `rpg runs`: one row per run, filtered by sweep, state and spec

The queries themselves live in the store (rpg_cli.store.queries).
"""

from rpg_cli.report.compare import compare_groups
from rpg_cli.report.costs import COST_RENDERERS, CostTable, build_cost_table
from rpg_cli.report.names import method_base, method_labels
from rpg_cli.report.options import DEFAULT_PLOT_METRICS, CompareOptions, PlotOptions, TableOptions
from rpg_cli.report.plots import X_AXES, plot_training, save_figure, smooth
from rpg_cli.report.render import (
    FORMAT_BY_SUFFIX,
    RENDERERS,
    column_title,
    footer,
    group_title,
    to_csv,
    to_json,
    to_latex,
    to_markdown,
)
from rpg_cli.report.scores import ReportError, scores
from rpg_cli.report.summary import runs_summary, summary_csv, wall_text
from rpg_cli.report.tables import Table, build_table, cell_text, fmt, paper_results

__all__ = [
    "COST_RENDERERS",
    "DEFAULT_PLOT_METRICS",
    "X_AXES",
    "CompareOptions",
    "CostTable",
    "FORMAT_BY_SUFFIX",
    "RENDERERS",
    "PlotOptions",
    "ReportError",
    "Table",
    "TableOptions",
    "build_cost_table",
    "build_table",
    "cell_text",
    "column_title",
    "compare_groups",
    "fmt",
    "footer",
    "group_title",
    "method_base",
    "method_labels",
    "paper_results",
    "plot_training",
    "runs_summary",
    "save_figure",
    "scores",
    "smooth",
    "summary_csv",
    "to_csv",
    "to_json",
    "to_latex",
    "to_markdown",
    "wall_text",
]
