"""The self-verification scores of the committed GSM8K route run (experiments/runs/gsm8k40).

That run predates stored scores, so its summary's self-verification selector needs the
model to score every question's distinct answers under the temperature probe and each
space's random routes: 1868 prompts, 20 minutes on two threads. They were scored
once by this code and kept in `STORED` (`python tests/gsm8k40_verify.py` scores them
again), so the regrade test reads them, and a slow test checks a sample of them against
the model.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
GSM8K40 = REPO / "experiments" / "runs" / "gsm8k40"
STORED = Path(__file__).parent / "fixtures" / "gsm8k40_verify.csv"
#: what `verify_rows` returns that `summarize_routes` reads back
COLUMNS = ["probe", "question_id", "extracted", "logprob"]


def stored_rows() -> list[dict]:
    """The scores as `verify_rows` returned them, in its order."""
    return pd.read_csv(STORED, dtype={"question_id": str, "extracted": str}, keep_default_na=False).to_dict("records")


def regrade_gsm8k40(out: Path, verify_rows) -> None:
    """`rnr regrade` of the committed run into `out` (flexibly, its own grading), with
    `verify_rows` in place of the summary's."""
    import pytest
    from typer.testing import CliRunner

    from rnr_interp.cli import app

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("rnr_interp.analyses.routing.summary.verify_rows", verify_rows)
        result = CliRunner().invoke(app, ["regrade", str(GSM8K40), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output


def score_now(out: Path) -> pd.DataFrame:
    """Score every prompt with SmolLM2 through `rnr regrade`, keeping what `verify_rows` returns."""
    from rnr_interp.analyses.routing.summary import verify_rows

    kept: list[dict] = []

    def keeping(*args, **kwargs):
        rows = verify_rows(*args, **kwargs)
        kept.extend({c: row[c] for c in COLUMNS} for row in rows)
        return rows

    regrade_gsm8k40(out, keeping)
    return pd.DataFrame(kept, columns=COLUMNS)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        score_now(Path(tmp) / "re").to_csv(STORED, index=False)
    print(f"wrote {STORED}")
