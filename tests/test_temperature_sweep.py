"""The selection gap against temperature: one audit per temperature, one row each."""

import pytest

from rnr_interp.models import load_model
from rnr_interp.records import RunDir
from rnr_interp.tasks import load_task
from rnr_interp.analyses.sweep import run_temperature_sweep


def test_temperature_sweep_rows_are_the_audits_gaps(tmp_path):
    lm, task = load_model("tiny-llama"), load_task("arithmetic", n=6)
    table = run_temperature_sweep(lm, task, tmp_path, [1.3, 0.7], k=4, progress=False)
    assert table.temperature.tolist() == [0.7, 1.3]
    for row in table.itertuples():
        s = RunDir(tmp_path / f"T={row.temperature:g}").read_summary()
        assert s.temperature == row.temperature and s.k == 4
        assert row.oracle_minus_greedy == pytest.approx(s.O_K - s.D)
        assert row.oracle_minus_majority == pytest.approx(s.O_K - s.majority["accuracy"])
        assert row.oracle_minus_majority_lo <= row.oracle_minus_majority <= row.oracle_minus_majority_hi
    assert RunDir(tmp_path).read_table("temperature_sweep").equals(table)
    with pytest.raises(ValueError, match="temperatures"):
        run_temperature_sweep(lm, task, tmp_path / "bad", [0.0], k=4, progress=False)
    from rnr_interp.report.registry import write_run_figures

    assert [p.stem for p in write_run_figures(RunDir(tmp_path))] == ["temperature_sweep"]
