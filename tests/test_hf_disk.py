"""Benchmarks saved with `datasets`' save_to_disk load like the original files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rnr_interp.tasks import HFLoadError, load_task

datasets = pytest.importorskip("datasets")


def _arc_as_hf(shared_data: Path, n: int) -> list[dict]:
    """The first n ARC-Easy rows in the Hub's column layout (allenai/ai2_arc)."""
    rows = []
    with open(shared_data / "arc" / "ARC-Easy-Test.jsonl", encoding="utf-8") as f:
        for line, _ in zip(f, range(n)):
            obj = json.loads(line)
            ch = obj["question"]["choices"]
            rows.append({"id": obj["id"], "question": obj["question"]["stem"], "answerKey": obj["answerKey"],
                         "choices": {"text": [c["text"] for c in ch], "label": [c["label"] for c in ch]}})
    return rows


def test_saved_folder_and_arrow_file_read_like_the_file(shared_data: Path, tmp_path: Path) -> None:
    from_file = load_task("arc_easy", n=12)
    rows = _arc_as_hf(shared_data, 12)
    folder = tmp_path / "arc_dict"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(folder))
    for saved in (load_task("arc_easy", data=folder), load_task("arc_easy", data=folder, n=5)):
        assert saved.questions == from_file.questions[: len(saved)]
    single = tmp_path / "arc_one"
    datasets.Dataset.from_list(rows).save_to_disk(str(single))
    assert load_task("arc_easy", data=single).questions == from_file.questions
    arrow = next(single.glob("*.arrow"))
    assert load_task("arc_easy", data=arrow).questions == from_file.questions
    with pytest.raises(HFLoadError, match="no split 'test'.*splits: validation"):
        datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "v"))
        load_task("arc_easy", data=tmp_path / "v")


def test_unreadable_arrow_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "data.arrow"
    bad.write_bytes(b"this is not arrow")
    with pytest.raises(HFLoadError, match=r"data\.arrow: not an Arrow file datasets can read") as err:
        load_task("arc_easy", data=bad)
    assert "\n" not in str(err.value)
    with pytest.raises(HFLoadError, match="not a folder written by datasets' save_to_disk"):
        load_task("arc_easy", data=tmp_path)
    with pytest.raises(ValueError, match="reads its own file format"):
        load_task("jsonl", data=tmp_path)
    out = subprocess.run([sys.executable, "-m", "rnr_interp.cli", "audit", "--task", "arc_easy", "--data", str(bad),
                          "--model", "tiny-llama", "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "data.arrow: not an Arrow file" in out.stderr
    assert not (tmp_path / "run").exists()
