"""Sweeps: grid expansion, the local runner, Ray (local instance) and kills midway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rnr_interp.records import load_runs
from rnr_interp.commands.sweep import sweep as sweep_command
from rnr_interp.analyses.sweep import INDEX, Cell, Grid, read_index, run_local

# 3 cells of 2-layer tiny-llama; n=4 in batches of 2 writes 2 record parts per cell.
GRID = {
    "models": ["tiny-llama:2"],
    "tasks": [{"name": "arithmetic", "n": 4}],
    "probes": [{"k": 2, "temperature": 1}],
    "interventions": [[], [{"kind": "Ablate", "component": "mlp", "layer": 0}], [{"kind": "Ablate", "component": "attn", "layer": 1}]],
    "batch_size": 2,
    "max_new_tokens": 6,
}


@pytest.fixture(scope="module")
def cells() -> list[Cell]:
    return Grid.from_dict(GRID).cells()


@pytest.fixture(scope="module")
def reference(cells, tmp_path_factory) -> Path:
    """An uninterrupted local sweep, the records every other runner must reproduce."""
    out = tmp_path_factory.mktemp("reference")
    statuses = run_local(cells, out)
    assert [s["status"] for s in statuses] == ["done"] * len(cells)
    return out


def assert_same_records(out: Path, reference: Path, cells: list[Cell]) -> None:
    from rnr_interp.records import RunDir

    for c in cells:
        got, want = RunDir(out / c.folder), RunDir(reference / c.folder)
        assert got.read_records().equals(want.read_records()), c.describe()
        assert got.read_summary() == want.read_summary(), c.describe()


def file_stamps(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()}


# -- grid and cells --------------------------------------------------------------------


def test_grid_expands_to_distinct_stable_cells(cells):
    assert len(cells) == 3
    assert len({c.cell_id for c in cells}) == 3 and len({c.folder for c in cells}) == 3
    c = cells[1]
    assert "ablate-mlp-0" in c.folder and c.folder.endswith(c.cell_id)
    # The id is the config: a JSON round trip keeps it, 1 and 1.0 are one temperature,
    # and every field that changes the records changes it.
    assert Cell.from_dict(json.loads(json.dumps(c.to_dict()))).cell_id == c.cell_id
    assert replace(c, probe=replace(c.probe, temperature=1.0)).cell_id == c.cell_id
    for changed in (replace(c, n=5), replace(c, batch_size=4), replace(c, probe=replace(c.probe, seed=1)),
                    replace(c, deployed_temperature=0.5), replace(c, model="tiny-qwen2:2")):
        assert changed.cell_id != c.cell_id
    big = Grid.from_dict({**GRID, "models": ["tiny-llama:2", "tiny-qwen2:2"], "probes": [{"k": 2}, {"k": 4}]})
    assert len(big.cells()) == 2 * 1 * 2 * 3


def test_grid_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown grid keys \\['modles'\\]"):
        Grid.from_dict({**GRID, "modles": []})
    with pytest.raises(ValueError, match="non-empty 'tasks'"):
        Grid.from_dict({**GRID, "tasks": []})
    with pytest.raises(ValueError, match="unknown intervention kind"):
        Grid.from_dict({**GRID, "interventions": [[{"kind": "Zap"}]]})


def test_vllm_backend_leaves_intervention_cells_on_transformer_lens():
    grid = Grid.from_dict(GRID)
    backends = [c.backend for c in grid.cells("vllm")]
    assert backends == ["vllm", "tl", "tl"] and grid.fallbacks("vllm") == 2 and grid.fallbacks("tl") == 0
    with pytest.raises(ValueError, match="interventions need hooks"):
        replace(grid.cells()[1], backend="vllm")


# -- local runner ----------------------------------------------------------------------


def test_local_sweep_writes_runs_and_an_index_and_skips_finished_cells(cells, reference):
    runs = load_runs(reference)
    assert sorted(r.path.name for r in runs) == sorted(c.folder for c in cells)
    for run in runs:
        assert run.read_summary().n_questions == 4
        assert len(run.read_records()) == 4 * (1 + 2)
    index = read_index(reference)
    assert index["counts"] == {"done": 3} and [e["cell"] for e in index["cells"]] == [c.to_dict() for c in cells]
    # The ablations reached the records: their intervention column names them.
    interventions = {r.read_records()["intervention"].iloc[0] for r in runs}
    assert interventions == {"", "ablate:mlp:0", "ablate:attn:1"}

    before = {c.folder: file_stamps(reference / c.folder) for c in cells}
    statuses = run_local(cells, reference)
    assert [s["status"] for s in statuses] == ["skipped"] * 3
    assert {c.folder: file_stamps(reference / c.folder) for c in cells} == before


def test_a_failing_cell_is_reported_and_the_others_run(cells, tmp_path):
    bad = replace(cells[0], interventions=json.dumps([{"kind": "Ablate", "component": "mlp", "layer": 9}]))
    statuses = run_local([bad, cells[0]], tmp_path)
    assert [s["status"] for s in statuses] == ["failed", "done"]
    assert "layer" in statuses[0]["error"]
    assert read_index(tmp_path)["counts"] == {"failed": 1, "done": 1}


KILL_LOCAL = """
import os, sys
from rnr_interp import records
from rnr_interp.analyses.sweep import Grid, run_local

writes = 0
original = records.RunDir.write_question_batch

def write_then_maybe_die(self, rows):
    global writes
    path = original(self, rows)
    writes += 1
    if writes == int(sys.argv[3]):
        os._exit(3)  # as a kill -9 would: no cleanup, no index update
    return path

records.RunDir.write_question_batch = write_then_maybe_die
run_local(Grid.from_dict(__import__("json").loads(sys.argv[1])).cells(), sys.argv[2])
"""


def test_killed_local_sweep_reruns_only_unfinished_cells(cells, reference, tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(textwrap.dedent(KILL_LOCAL))
    out = tmp_path / "sweep"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # Dies right after the 3rd records part: cell 0 finished (2 parts + summary), cell 1 half done.
    done = subprocess.run([sys.executable, str(script), json.dumps(GRID), str(out), "3"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    first, half = out / cells[0].folder, out / cells[1].folder
    assert (first / "summary.json").is_file() and not (half / "summary.json").exists()
    assert [p.name for p in (half / "records").iterdir()] == ["part-00000.parquet"]
    assert not (out / cells[2].folder).exists()
    assert read_index(out)["counts"] == {"done": 1, "pending": 2}
    finished, half_part = file_stamps(first), file_stamps(half / "records")

    statuses = run_local(cells, out)
    assert [s["status"] for s in statuses] == ["skipped", "done", "done"]
    assert file_stamps(first) == finished
    assert file_stamps(half / "records")["part-00000.parquet"] == half_part["part-00000.parquet"]
    assert sorted(p.name for p in (half / "records").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert_same_records(out, reference, cells)
    assert read_index(out)["counts"] == {"skipped": 1, "done": 2}


def test_sweep_command_runs_a_grid_and_says_when_cells_fall_back(tmp_path, monkeypatch):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({**GRID, "interventions": GRID["interventions"][:2]}))
    app = typer.Typer()
    app.command()(sweep_command)
    result = CliRunner().invoke(app, [str(grid), "--out", str(tmp_path / "out"), "-q"])
    assert result.exit_code == 0, result.output
    assert "2 done" in result.output and (tmp_path / "out" / INDEX).is_file()

    import rnr_interp.engine.vllm_backend as vb

    monkeypatch.setattr(vb, "vllm_available", lambda: False)
    result = CliRunner().invoke(app, [str(grid), "--out", str(tmp_path / "out2"), "--backend", "vllm"])
    assert "1 of 2 cells have interventions, which need hooks" in result.output
    assert result.exit_code == 2 and "needs the vllm package" in result.output


# -- Ray ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="ray not installed (pip install 'rnr_interp[scale]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()


def test_ray_sweep_gives_the_local_runner_records(ray_local, cells, reference, tmp_path):
    from rnr_interp.analyses.sweep import run_ray

    statuses = run_ray(cells, tmp_path)
    assert [s["status"] for s in statuses] == ["done"] * 3
    assert_same_records(tmp_path, reference, cells)
    index = read_index(tmp_path)
    assert index["runner"].startswith("ray") and index["counts"] == {"done": 3}
    assert [s["status"] for s in run_ray(cells, tmp_path)] == ["skipped"] * 3


def test_ray_worker_killed_midway_loses_no_finished_work(ray_local, cells, reference, tmp_path):
    from rnr_interp.analyses.sweep import _safe_run_cell, run_ray

    target, marker = cells[1], tmp_path / "killed"

    def die_once_in_target(cell, out_root):
        # Runs in the Ray worker: the first attempt at `target` exits its process right
        # after writing its first records part; Ray retries the cell in a new worker.
        if cell.cell_id == target.cell_id and not marker.exists():
            from rnr_interp import records

            original = records.RunDir.write_question_batch

            def write_then_die(self, rows):
                path = original(self, rows)
                marker.write_text(json.dumps({"part": path.name, "mtime_ns": path.stat().st_mtime_ns}))
                os._exit(1)

            records.RunDir.write_question_batch = write_then_die
        return _safe_run_cell(cell, out_root)

    statuses = run_ray(cells, tmp_path / "sweep", run=die_once_in_target, max_retries=1)
    assert [s["status"] for s in statuses] == ["done"] * 3
    killed = json.loads(marker.read_text())
    part = tmp_path / "sweep" / target.folder / "records" / killed["part"]
    assert part.stat().st_mtime_ns == killed["mtime_ns"], "the part written before the kill was redone"
    assert len(list(part.parent.iterdir())) == 2
    assert_same_records(tmp_path / "sweep", reference, cells)
