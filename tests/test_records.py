"""Run folders: round trip, resume after a kill, config guard, atomic files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import pyarrow as pa
import pyarrow.parquet as pq

from rnr_interp import records as rec
from rnr_interp.records import (
    RECORD_COLUMNS,
    RECORD_SCHEMA,
    MANIFEST,
    TASK_FILE,
    ConfigMismatchError,
    RunDir,
    RunFolderError,
    load_runs,
)

CONFIG = {
    "model": {"name": "smollm2", "dtype": "float32"},
    "task": {"name": "arithmetic", "n_questions": 5},
    "decoding": {"temperature": 0.7, "max_new_tokens": 32},
    "budget": {"k": 3},
    "seeds": [0, 1],
}
QUESTIONS = [f"q{i}" for i in range(5)]


def question_rows(qid: str, k: int = 3) -> list[dict]:
    """Deployed candidate plus k temperature samples for one question."""
    rows = []
    for probe, n in (("deployed", 1), ("temperature", k)):
        for i in range(n):
            answer = str((len(qid) + i) % 3)
            rows.append(
                {
                    "run_id": "r1",
                    "model": "smollm2",
                    "task": "arithmetic",
                    "question_id": qid,
                    "probe": probe,
                    "candidate": i,
                    "intervention": "" if probe == "deployed" else json.dumps({"seed": i}),
                    "seed": i,
                    "text": f"Answer: {answer}",
                    "extracted": None if i == 2 else answer,
                    "gold": "1",
                    "correct": answer == "1",
                    "correct_strict": answer == "1" and i != 0,
                    "correct_flexible": answer == "1",
                    "logprob": -1.5 * (i + 1),
                    "n_tokens": 3 + i,
                    "finish": "stop" if i else "length",
                }
            )
    return rows


def run_all(run: RunDir, qids: list[str]) -> None:
    """What the audit loop does: skip done questions, write one batch per question."""
    done = run.done_question_ids()
    for qid in qids:
        if qid not in done:
            run.write_question_batch(question_rows(qid))


def test_record_columns() -> None:
    assert RECORD_COLUMNS == (
        "run_id", "model", "task", "question_id", "probe", "candidate", "intervention", "seed",
        "text", "extracted", "gold", "correct", "logprob", "n_tokens", "finish", "correct_strict", "correct_flexible",
    )  # fmt: skip
    # the two grades are null only in what parts written before them read back as (test_strict_grading)
    assert [f.name for f in RECORD_SCHEMA if f.nullable] == ["extracted", "correct_strict", "correct_flexible"]


def test_round_trip(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", CONFIG)
    rows = question_rows("q1") + question_rows("q0")
    run.write_question_batch(rows)
    df = run.read_records()
    assert list(df.columns) == list(RECORD_COLUMNS)
    assert len(df) == 8
    # sorted by key: q0 before q1, deployed before temperature, candidates ascending
    assert list(df.question_id[:4]) == ["q0"] * 4
    assert list(df.probe[:4]) == ["deployed", "temperature", "temperature", "temperature"]
    expected = pd.DataFrame(rows)[list(RECORD_COLUMNS)]
    back = df.set_index(list(rec.RECORD_KEY)).sort_index()
    want = expected.set_index(list(rec.RECORD_KEY)).sort_index()
    assert back["text"].tolist() == want["text"].tolist()
    assert back["correct"].tolist() == want["correct"].tolist()
    assert back["extracted"].isna().tolist() == want["extracted"].isna().tolist()
    assert run.done_question_ids() == {"q0", "q1"}
    assert run.done_question_ids(["deployed", "temperature"]) == {"q0", "q1"}
    assert run.done_question_ids({"mcts"}) == set()
    temp = run.read_records(filters=[("probe", "==", "temperature")])
    assert set(temp.probe) == {"temperature"} and len(temp) == 6


def test_resume_after_kill_equals_uninterrupted_run(tmp_path: Path) -> None:
    clean = RunDir.create(tmp_path / "clean", CONFIG)
    run_all(clean, QUESTIONS)

    killed = RunDir.create(tmp_path / "killed", CONFIG)
    run_all(killed, QUESTIONS[:3])
    # The kill hit while part 3 was being written: a half-written temp file remains.
    stray = killed.records_dir / "part-00003.parquet.12345.tmp"
    stray.write_bytes(b"PAR1\x00garbage, not parquet")
    assert len(RunDir(killed.path).read_records()) == 12  # readers ignore it
    assert stray.exists()  # and do not delete it (the writer might be alive)

    resumed = RunDir.create(tmp_path / "killed", CONFIG)
    assert resumed.done_question_ids() == set(QUESTIONS[:3])
    assert not stray.exists()
    run_all(resumed, QUESTIONS)

    pd.testing.assert_frame_equal(resumed.read_records(), clean.read_records())
    assert len(resumed.parts()) == len(QUESTIONS)


def test_batch_must_not_split_a_stored_question(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", CONFIG)
    rows = question_rows("q0")
    run.write_question_batch(rows[:2])
    with pytest.raises(ValueError, match="already stored"):
        run.write_question_batch(rows[2:])
    # A new probe for a stored question is a new group, so it may come later.
    extra = [dict(r, probe="mcts") for r in question_rows("q0")[1:]]
    run.write_question_batch(extra)
    assert run.done_question_ids(["deployed", "mcts"]) == {"q0"}
    # Fresh readers see the same stored groups.
    with pytest.raises(ValueError, match="already stored"):
        RunDir(run.path).write_question_batch(extra)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda r: r.pop("gold"), r"missing columns \['gold'\]"),
        (lambda r: r.update(score=1.0), r"unknown columns \['score'\]"),
        (lambda r: r.update(candidate="first"), "RECORD_SCHEMA"),
        (lambda r: r.update(text=None), r"non-nullable columns \['text'\]"),
    ],
)
def test_bad_rows_refused(tmp_path: Path, change, match: str) -> None:
    run = RunDir.create(tmp_path / "run", CONFIG)
    rows = question_rows("q0")
    change(rows[1])
    with pytest.raises(ValueError, match=match):
        run.write_question_batch(rows)
    with pytest.raises(ValueError, match="repeats record keys"):
        run.write_question_batch(question_rows("q1") + question_rows("q1")[:1])
    assert run.parts() == []


def test_config_mismatch_names_the_key(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", CONFIG)
    run_all(run, QUESTIONS[:2])
    changed = json.loads(json.dumps(CONFIG))
    changed["decoding"]["temperature"] = 1.0
    changed["notes"] = "new key"
    with pytest.raises(ConfigMismatchError, match=r"decoding\.temperature: 0\.7 \(stored\) != 1\.0") as err:
        RunDir.create(tmp_path / "run", changed)
    assert err.value.keys == ["decoding.temperature", "notes"]
    assert len(RunDir(run.path).read_records()) == 8  # nothing deleted
    with pytest.raises(FileExistsError):
        RunDir.create(tmp_path / "run", CONFIG, resume=False)
    # Tuples and numpy scalars are the same config as their JSON forms.
    same = dict(CONFIG, seeds=(np.int64(0), 1))
    assert RunDir.create(tmp_path / "run", same).done_question_ids() == {"q0", "q1"}


def test_manifest(tmp_path: Path) -> None:
    m = RunDir.create(tmp_path / "run", CONFIG).manifest
    assert m["config"] == CONFIG
    assert m["config_hash"] == rec.config_hash(CONFIG)
    assert m["created"].endswith("+00:00")
    assert m["versions"]["python"] and "torch" in m["versions"] and "transformer_lens" in m["versions"]
    assert m["versions"]["rnr_interp"]
    with pytest.raises(FileNotFoundError):
        RunDir(tmp_path / "nothing")


def test_atomic_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunDir.create(tmp_path / "run", {**CONFIG, "kind": "audit"})
    interval = np.array([0.1, 0.9])
    run.write_summary({"n_questions": np.int64(3), "k": 2, "D": np.float64(0.5), "O_K": 0.6, "gap": 0.1,
                       "D_ci": interval, "O_K_ci": interval, "gap_ci": interval})
    written = run.read_summary()
    assert (written.D, written.n_questions, written.D_ci) == (0.5, 3, [0.1, 0.9])

    # A crash between writing the temp file and moving it leaves the old summary whole.
    def crash(src: str, dst: str) -> None:
        raise OSError("killed")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        run.write_summary(written.but(D=0.9))
    monkeypatch.undo()
    assert run.read_summary().D == 0.5
    assert list(run.path.glob("*.tmp")) == []

    # An unencodable object fails before the file is touched.
    with pytest.raises(TypeError):
        run.write_json("bad", {"x": object()})
    assert not (run.artefacts_dir / "bad.json").exists()


def test_named_artefacts(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", CONFIG)
    table = pd.DataFrame({"d": [True, False], "c": [3, 0]}, index=pd.Index(["q0", "q1"], name="question_id"))
    run.write_table("failure_set", table)
    pd.testing.assert_frame_equal(run.read_table("failure_set"), table)
    run.write_json("repair", {"layers": [3, 4]})
    assert run.read_json("repair") == {"layers": [3, 4]}
    with pytest.raises(FileNotFoundError, match="failure_set"):
        run.read_table("missing")
    with pytest.raises(ValueError):
        run.write_json("../escape", {})


def test_compact_keeps_records(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", CONFIG)
    run_all(run, QUESTIONS)
    before = run.read_records()
    run.compact()
    assert len(run.parts()) == 1
    pd.testing.assert_frame_equal(run.read_records(), before)
    run.write_question_batch(question_rows("q9"))
    assert run.done_question_ids() == set(QUESTIONS) | {"q9"}


def test_load_runs(tmp_path: Path) -> None:
    for name in ("b", "a", "nested/c"):
        RunDir.create(tmp_path / "sweep" / name, dict(CONFIG, name=name))
    (tmp_path / "sweep" / "not_a_run").mkdir()
    runs = load_runs(tmp_path / "sweep")
    assert [r.config["name"] for r in runs] == ["a", "b", "nested/c"]
    assert [r.path for r in load_runs(tmp_path / "sweep" / "a")] == [tmp_path / "sweep" / "a"]


def test_runs_are_told_apart_by_their_kind(tmp_path: Path) -> None:
    """`load_runs` keeps the kinds asked for; the registry's `finished_runs` those with a
    summary, and refuses a kind no analysis has; `require_kind` names the folder's own."""
    from rnr_interp.records import RunFolderError
    from rnr_interp.report.kinds import finished_runs

    for name, kind in (("a", "audit"), ("b", "route"), ("c", "audit")):
        RunDir.create(tmp_path / "sweep" / name, dict(CONFIG, name=name, kind=kind))
    assert [r.path.name for r in load_runs(tmp_path / "sweep", "audit")] == ["a", "c"]
    assert [r.path.name for r in load_runs(tmp_path / "sweep", "audit", "route")] == ["a", "b", "c"]
    (tmp_path / "sweep" / "c" / "summary.json").write_text("{}")  # finished (its content is not read here)
    assert [r.path.name for r in finished_runs(tmp_path / "sweep", "audit")] == ["c"]
    assert finished_runs(tmp_path / "absent", "audit") == []
    with pytest.raises(ValueError, match="no registered analysis of kind 'audits'"):
        finished_runs(tmp_path / "sweep", "audits")
    with pytest.raises(RunFolderError, match=r"sweep/a is not a route run \(its kind: 'audit'\): rerun it"):
        RunDir(tmp_path / "sweep" / "a").require_kind("route", "rerun it")


def test_duplicate_parts_are_dropped_with_a_warning(tmp_path: Path, monkeypatch) -> None:
    # What a crash inside compact() leaves: the merged part and the old parts all in place.
    run = RunDir.create(tmp_path / "run", CONFIG)
    run_all(run, QUESTIONS[:2])
    clean = run.read_records()

    def killed(self, *args, **kwargs):
        raise OSError("killed")

    monkeypatch.setattr(Path, "unlink", killed)
    with pytest.raises(OSError, match="killed"):
        run.compact()
    monkeypatch.undo()
    with pytest.warns(UserWarning, match="dropping .* duplicate"):
        pd.testing.assert_frame_equal(RunDir(run.path).read_records(), clean)


def test_a_part_copied_in_or_edited_is_refused_naming_it(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", CONFIG)
    run_all(run, QUESTIONS[:2])
    run.release()
    first = run.parts()[0]
    (run.records_dir / "part-00007.parquet").write_bytes(first.read_bytes())  # the same rows, the run's id: not written by it
    with pytest.raises(RunFolderError, match="part-00007.parquet: not a part this run wrote"):
        RunDir(run.path).read_records()
    (run.records_dir / "part-00007.parquet").unlink()
    table = pq.read_table(first)
    edited = table.set_column(table.schema.get_field_index("correct"), "correct", pa.array([not c for c in table["correct"].to_pylist()]))
    pq.write_table(edited, first)  # a hand edit of `correct`, run id kept
    with pytest.raises(RunFolderError, match="part-00000.parquet: its content does not match its checksum"):
        RunDir(run.path).read_records()


def test_records_feed_the_audit(tmp_path: Path) -> None:
    from rnr_interp.metrics import audit_summary

    run = RunDir.create(tmp_path / "run", {**CONFIG, "kind": "audit"})
    run_all(run, QUESTIONS)
    summary = audit_summary(run.read_records(), "temperature", k=2)
    run.write_summary(summary)
    assert {k: v for k, v in run.read_summary().to_json().items() if k in summary} == summary
    assert summary["n_questions"] == len(QUESTIONS) and summary["k"] == 2


def test_journal_drops_a_torn_last_line_and_refuses_a_corrupt_one(tmp_path):
    """A kill can tear the last line of the journal only: reading leaves it out (and
    leaves the file alone: a reader holds no lock), the writer's next append cuts it
    first, so the new entries start a line of their own; a bad whole line is not a
    kill's doing and is refused."""
    j = rec.Journal(tmp_path / "journal.jsonl")
    assert j.read() == []
    j.append([{"a": 1, "x": 0.1 + 0.2}, {"b": None}])
    j.append([])
    with open(j.path, "ab") as f:
        f.write(b'{"c": 3, "text": "half a li')
    torn = j.path.read_bytes()
    assert j.read() == [{"a": 1, "x": 0.1 + 0.2}, {"b": None}]
    assert j.path.read_bytes() == torn
    j.append([{"d": [1, 2]}])
    assert j.read() == [{"a": 1, "x": 0.1 + 0.2}, {"b": None}, {"d": [1, 2]}]
    assert j.path.read_bytes().endswith(b'{"d": [1, 2]}\n') and b"half" not in j.path.read_bytes()
    j.clear()
    assert not j.path.exists() and j.read() == []
    j.path.write_bytes(b'{"a": 1}\nnot json\n')
    with pytest.raises(rec.RunFolderError, match="line 2"):
        j.read()


def test_a_reader_opened_before_a_part_was_written_reads_it(tmp_path: Path) -> None:
    writer = RunDir.create(tmp_path / "run", CONFIG)
    reader = RunDir(tmp_path / "run")  # its manifest has no checksum of the part written next
    run_all(writer, QUESTIONS[:1])
    assert len(reader.read_records()) == len(writer.read_records()) > 0


def test_folders_of_earlier_versions_no_committed_run_needs_are_refused(tmp_path: Path) -> None:
    """Shapes an earlier 0.1 wrote that no run under experiments/runs has: one line each
    naming the problem and the remedy."""
    # a manifest hashed with task.questions_hash in (no comparable_hash): its config_hash is not config_hash(config)
    run = RunDir.create(tmp_path / "hashed", CONFIG)
    run.release()
    manifest = json.loads((run.path / MANIFEST).read_text())
    del manifest["comparable_hash"]
    manifest["config_hash"] = "0" * 64
    (run.path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(RunFolderError, match="does not match its config_hash .*questions_hash in: rerun it"):
        RunDir(run.path)
    # a comparison whose budget-control rows carry "budget_control" as their run id
    compare = RunDir.create(tmp_path / "compare", {**CONFIG, "kind": "compare"})
    run_all(compare, QUESTIONS[:1])
    compare.release()
    part = compare.parts()[0]
    table = pq.read_table(part)
    table = table.set_column(table.schema.get_field_index("run_id"), "run_id", pa.array(["budget_control"] * len(table)))
    pq.write_table(table, part)
    with pytest.raises(RunFolderError, match="budget-control rows written before .* rerun the comparison"):
        RunDir(compare.path).read_records()
    # an lm-eval run resumed without the questions runs now store beside it
    stored = {**CONFIG, "task": {"name": "t", "stored": {"questions": []}}}
    RunDir.create(tmp_path / "stored", stored).release()
    (tmp_path / "stored" / TASK_FILE).unlink()
    manifest = json.loads((tmp_path / "stored" / MANIFEST).read_text())
    del manifest["task_sha256"]
    (tmp_path / "stored" / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(RunFolderError, match="holds no task.json: written before runs stored their questions"):
        RunDir.create(tmp_path / "stored", stored)
