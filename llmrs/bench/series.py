"""The time-series CSVs a bench writes beside its results (NAME.telemetry.csv, NAME.metrics.csv), read back."""

from __future__ import annotations

import csv
from pathlib import Path


def read_rows(path: Path) -> list[dict]:
    """The CSV's rows with numbers as floats (None where a value was not given); [] where the file is not there."""
    try:
        with open(path, newline="") as f:
            return [{k: (float(v) if v not in ("", None) else None) for k, v in row.items()} for row in csv.DictReader(f)]
    except FileNotFoundError:
        return []
