"""A benchmark's one name: what `rpg eval` records, what training validation is stored under, and what
the report's columns say. verl names a validation set by its rows' data_source; the paper's files use
the data sources below, which the report has always shown under the paper's names. Standard library only.
"""

from __future__ import annotations

BENCHMARK_ALIASES = {
    "math_dapo": "aime24",  # DAPO's AIME 2024 file keeps the training set's data_source
    "aime2024": "aime24",
    "aime_2024": "aime24",
    "aime-2024": "aime24",
    "aime2025": "aime25",
    "aime_2025": "aime25",
    "aime-2025": "aime25",
    "amc_23": "amc23",
    "amc2023": "amc23",
    "amc-23": "amc23",
    "minerva": "minerva_math",  # Table 7's benchmarks: rpg prepare-data's data_source is the paper's name
    "olympiad_bench": "olympiadbench",
}


def benchmark_name(data_source: str) -> str:
    """The name of the benchmark whose rows carry `data_source` (the paper's name where it has one)."""
    return BENCHMARK_ALIASES.get(data_source, data_source)
