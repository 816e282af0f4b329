"""Sources and the prompt template for `rpg prepare-data`: raw math problems -> verl parquet.

    specs = resolve_sources(["aime24=aime24.jsonl"], out_dir=Path("data"))
    reports = prepare(specs)            # data/aime-2024.parquet, one row per problem (30)

`template` holds the paper's prompt and row format, `readers` the file and hub readers,
`sources` the presets (dapo-math-17k, aime24, aime25, amc23, minerva_math, olympiadbench), `clean` the English and duplicate
filters, `pipeline` the steps from source to file and the atomic writer.
"""

from rpg_cli.datasets.pipeline import PrepareError, SourceReport, prepare
from rpg_cli.datasets.readers import HubDataset, LocalFile, SourceError
from rpg_cli.datasets.sources import PRESETS, Preset, SourceOptions, SourceSpec, resolve_sources
from rpg_cli.datasets.template import VERL_SCHEMA, make_prompt, unwrap_prompt, verl_row

__all__ = [
    "PRESETS",
    "VERL_SCHEMA",
    "HubDataset",
    "LocalFile",
    "PrepareError",
    "Preset",
    "SourceError",
    "SourceOptions",
    "SourceReport",
    "SourceSpec",
    "make_prompt",
    "prepare",
    "resolve_sources",
    "unwrap_prompt",
    "verl_row",
]
