"""The notebook API: `import rnr_interp as rnr; rnr.audit(model, task, k=...)` and its
siblings on the tiny models, in memory or kept, on objects or spec strings."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pandas as pd
import pytest

import rnr_interp as rnr
from rnr_interp.models import build_tiny
from rnr_interp.records import RunDir

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_python() -> str:
    """The README's Python section's code block."""
    section = README.read_text().split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """The folder temporary files go to, watched: an in-memory call must leave no run
    folder there (`left_behind`)."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def left_behind(scratch: Path) -> list[Path]:
    """Our temporary run folders still there (torch keeps caches of its own beside them)."""
    return [p for p in scratch.iterdir() if p.name.startswith("rnr-")]


def test_readme_python_section_runs_on_a_tiny_model(scratch):
    code = readme_python()
    assert 'rnr.load_model("smollm2")' in code and "k=32" in code
    namespace: dict = {}
    exec(compile(code.replace('"smollm2"', '"tiny-llama:4"'), "README.md", "exec"), namespace)
    assert isinstance(namespace["res"], rnr.Result) and isinstance(namespace["records"], pd.DataFrame)
    assert len(namespace["records"]) == 24 * (1 + 32)  # the deployed answer and K samples per question
    assert len(namespace["outs"]) == 4 and namespace["logits"].shape[-1] == namespace["model"].facts()["d_vocab"]
    heads = namespace["heads"]  # the head-patching sweep: one row per layer and head
    assert isinstance(heads, pd.DataFrame) and len(heads) == 4 * namespace["model"].bridge.cfg.n_heads
    assert left_behind(scratch) == []


def test_audit_in_memory_equals_the_kept_run_and_leaves_nothing(tmp_path, scratch):
    memory = rnr.audit("tiny-llama:2", "arithmetic", k=3, n=4, max_new_tokens=6, progress=False)
    assert memory.out is None and memory.kind == "audit" and left_behind(scratch) == []
    assert len(memory.records) == 4 * (1 + 3) and memory.summary.D is not None and memory.summary.O_K is not None
    kept = rnr.audit("tiny-llama:2", "arithmetic", k=3, n=4, max_new_tokens=6, progress=False, out=tmp_path / "run")
    stored = RunDir(kept.out).read_summary()
    assert kept.out == tmp_path / "run" and (stored.D, stored.O_K) == (kept.summary.D, kept.summary.O_K)
    columns = ["question_id", "probe", "candidate", "text", "correct"]
    assert memory.records[columns].equals(kept.records[columns])
    assert (memory.summary.D, memory.summary.O_K) == (kept.summary.D, kept.summary.O_K)
    again = rnr.audit("tiny-llama:2", "arithmetic", k=3, n=4, max_new_tokens=6, progress=False, out=tmp_path / "run")
    assert again.records[columns].equals(kept.records[columns])  # resumed, nothing redone differently


def test_objects_and_specs_give_the_same_records(scratch):
    model, tok = build_tiny("tiny-llama", n_layers=2)
    task = rnr.load_task("arithmetic", n=3)
    by_object = rnr.audit((model, tok), task, k=2, max_new_tokens=6, progress=False)
    by_spec = rnr.audit("tiny-llama:2", "arithmetic", n=3, k=2, max_new_tokens=6, progress=False)
    assert by_object.records["text"].tolist() == by_spec.records["text"].tolist()
    assert by_object.summary.model.startswith("object:")
    with pytest.raises(ValueError, match="n, data and task options go with a task spec string"):
        rnr.audit("tiny-llama:2", task, n=2, k=2)


def test_route_repair_steer_and_compare_return_results(tmp_path, scratch):
    routed = rnr.route("tiny-llama:2", "arithmetic", k=2, n=2, methods=("random",), progress=False)
    assert routed.kind == "route" and not routed.records.empty and "route_curves" in routed.tables
    repaired = rnr.repair("tiny-llama:2", "arithmetic_mc", n=6, progress=False, out=tmp_path / "repair")
    assert repaired.kind == "repair" and "repair" in repaired.tables
    steered = rnr.steer("tiny-llama:2", "arithmetic_mc", n=6, repair_run=repaired, progress=False)
    assert steered.kind == "steer" and steered.records.equals(steered.tables["steering"])
    compared = rnr.compare("tiny-llama:2", "tiny-qwen2:2", "arithmetic", k=2, n=3, progress=False,
                           audit_options={"max_new_tokens": 4})
    assert compared.kind == "compare" and len(compared.records) == 3 == compared.summary.n_questions
    assert left_behind(scratch) == []
    in_memory = rnr.Result("repair", {}, pd.DataFrame())
    with pytest.raises(ValueError, match="kept in memory only; run it with out=FOLDER"):
        rnr.steer("tiny-llama:2", "arithmetic_mc", n=6, repair_run=in_memory)
    with pytest.raises(ValueError, match="base: not an audit run folder"):
        rnr.compare("tiny-llama:2", "tiny-qwen2:2")


def test_all_lists_the_public_names_and_each_resolves():
    assert "audit" in rnr.__all__ and "Result" in rnr.__all__ and "load_model" in rnr.__all__
    assert [name for name in rnr.__all__ if not hasattr(rnr, name)] == []
    assert set(rnr.__all__) <= set(dir(rnr))
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        rnr.nonsense  # noqa: B018


def test_compare_of_kept_audits_and_of_models_kept_under_out(tmp_path, scratch):
    options = dict(k=2, n=3, max_new_tokens=4, progress=False)
    base = rnr.audit("tiny-llama:2", "arithmetic", out=tmp_path / "base", **options)
    trained = rnr.audit("tiny-qwen2:2", "arithmetic", out=tmp_path / "trained", **options)
    of_results = rnr.compare(base, trained, out=tmp_path / "of_results")
    of_folders = rnr.compare(str(base.out), trained.out)
    assert of_results.out == tmp_path / "of_results" / "compare" and of_folders.out is None
    assert of_results.records.equals(of_folders.records) and len(of_results.records) == 3
    of_models = rnr.compare("tiny-llama:2", "tiny-qwen2:2", "arithmetic", k=2, n=3, out=tmp_path / "of_models",
                            progress=False, audit_options={"max_new_tokens": 4})
    assert sorted(p.name for p in (tmp_path / "of_models").iterdir()) == ["base", "compare", "trained"]
    assert of_models.records["question_id"].tolist() == of_results.records["question_id"].tolist()
    assert of_models.summary.stats == of_results.summary.stats
    assert left_behind(scratch) == []
