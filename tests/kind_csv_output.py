"""An output kind defined outside the toolkit, in one file with one registration: every
concluded run folder also gets ``requests.csv`` (its per-request table as CSV).
``tests/test_extending.py`` names it in a scenario's ``plugins``."""

from __future__ import annotations

from typing import ClassVar

import pandas as pd

from harness.outputs import OUTPUTS, Concluded, FolderOutput


@OUTPUTS.register
class RequestsCsv(FolderOutput):
    """``requests.csv`` beside ``requests.parquet`` (a plan's folder has none: nothing)."""

    kind: ClassVar[str] = "requests-csv"

    def write(self, done: Concluded) -> str | None:
        table = done.folder / "requests.parquet"
        if table.is_file():
            pd.read_parquet(table).to_csv(done.folder / "requests.csv", index=False)
        return None
