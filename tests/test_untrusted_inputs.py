"""Untrusted input (docs/reliability.md, "What is trusted"): task configs, data files
and run folders handed to `rnr` run no code, are bounded before work, and readers never
re-render a task config or rewrite a run they do not hold. A sibling of
test_hostile_inputs.py, for the classes of issue #45."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rnr_interp.cli import app
from rnr_interp.tasks import load_task
from rnr_interp.tasks.base import DataFormatError

jinja2_meta = pytest.importorskip("jinja2.meta")
lm_eval_utils = pytest.importorskip("lm_eval.utils", reason="the parity checks compare with the installed lm-eval")


def _data(tmp_path: Path, n: int = 3) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"q": f"what is {i}", "a": str(i)}) + "\n" for i in range(n)))
    return path


def _config(tmp_path: Path, doc_to_text: str, extra: str = "") -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(f"task: mine\noutput_type: generate_until\ndoc_to_target: '{{{{a}}}}'\n"
                    f"doc_to_text: {json.dumps(doc_to_text)}\n{extra}")
    return path


def _children_growth_mb() -> int:
    """How far the largest child's peak resident memory went past this process's own peak:
    a forked child starts with its parent's pages, so its own use is what it added."""
    children, own = (resource.getrusage(who).ru_maxrss // 1024 for who in (resource.RUSAGE_CHILDREN, resource.RUSAGE_SELF))
    return children - own


# -- templates in a sandbox ------------------------------------------------------------

ESCAPES = [
    "{{ lipsum.__globals__.os.popen('touch MARK').read() }}",
    "{{ cycler.__init__.__globals__.os.popen('touch MARK').read() }}",
    "{{ joiner.__init__.__globals__['os'].system('touch MARK') }}",
    "{{ namespace.__init__.__globals__.os.environ }}",
    "{{ [].__class__.__mro__[1].__subclasses__() }}",
    "{{ q.__class__.__base__.__subclasses__() }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os }}",
    "{{ range.__self__ }}",
    "{{ q|attr('__class__') }}",
    "{{ ''['__class__'] }}",
    "{{ os.environ.HOME }}{{ environ }}",
]


@pytest.mark.parametrize("template", ESCAPES)
def test_a_template_reaches_no_python_internals_and_runs_nothing(tmp_path, monkeypatch, template):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataFormatError) as refused:
        load_task("x", task_config=_config(tmp_path, "Q: {{q}} " + template), data=_data(tmp_path))
    assert not (tmp_path / "MARK").exists()
    message = str(refused.value)
    assert "doc_to_text" in message and "\n" not in message
    assert "/home" not in message and "<class" not in message and "subclasses" not in message.split(": ")[-1]


def test_a_refused_template_is_one_line_exit_2_nothing_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, "{{ lipsum.__globals__.os.popen('touch MARK').read() }}")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["audit", "--model", "tiny-llama:1", "--task-config", str(config), "--data",
                                      str(_data(tmp_path)), "--k", "1", "--out", str(out), "-q"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "doc_to_text" in lines[0]
    assert not out.exists() and not (tmp_path / "MARK").exists()


BOMBS = {
    "loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
    "multiply": "{{ 'x' * 4000000000 }}",
    "power": "{{ (10 ** 10) ** (10 ** 10) }}",
    "doubling": "{% set a = 'xxxxxxxxxxxxxxxx' %}" + "{% set a = a ~ a %}" * 40 + "{{ a }}",
    "output": "{% for i in range(100000) %}{{ q }}{{ q }}{{ q }}{% endfor %}",
}


@pytest.mark.parametrize("name", BOMBS)
def test_a_template_bomb_is_refused_within_seconds_and_1_gb(tmp_path, name):
    started = time.monotonic()
    with pytest.raises(DataFormatError, match="doc_to_text|rendering") as refused:
        load_task("x", task_config=_config(tmp_path, BOMBS[name]), data=_data(tmp_path))
    assert time.monotonic() - started < 60  # 2 s of CPU; the wall clock of a shared machine is slower
    assert "\n" not in str(refused.value)
    assert _children_growth_mb() < 1024  # the rendering child's own memory: within its limit


def test_templates_still_render_rows_and_columns(tmp_path):
    task = load_task("x", task_config=_config(tmp_path, "Q: {{ q|upper }} {{ q|regex_replace('is', 'was') }}\n"),
                     data=_data(tmp_path))
    assert task.questions[1].text == "Q: WHAT IS 1 what was 1\n" and task.questions[1].answer == "1"


# -- lm-eval's own YAMLs render as lm-eval renders them --------------------------------


class _Column(str):
    """A column value every template can read: text, with any named field or key."""

    def __new__(cls, value: str = "alpha beta 1"):
        return super().__new__(cls, value)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return _Column()

    def __getitem__(self, key):
        return _Column() if isinstance(key, str) else str.__getitem__(self, key)


def _docs(names):
    """Rows of a few shapes; a template is checked on the first lm-eval renders."""
    yield {n: _Column() for n in names}
    yield {n: [_Column("first"), _Column("second"), _Column("third")] for n in names}
    yield {n: 1 for n in names}
    yield {n: {"text": [_Column("a"), _Column("b")], "label": ["A", "B"]} for n in names}


FIELDS = ("doc_to_text", "doc_to_target", "doc_to_choice", "description", "gen_prefix")


def _parity(yamls) -> tuple[int, int, list[str]]:
    """(YAMLs whose every template lm-eval renders on a synthetic row, of them those the
    sandbox renders identically, the first differences)."""
    from rnr_interp.tasks.lmeval import read_yaml
    from rnr_interp.tasks.templates import render

    rendered, same, differ = 0, 0, []
    for path in yamls:
        raw = read_yaml(path)
        outcomes = []
        for field in FIELDS:
            template = raw.get(field)
            if not (isinstance(template, str) and ("{{" in template or "{%" in template)):
                continue
            names = jinja2_meta.find_undeclared_variables(lm_eval_utils.env.parse(template))
            for doc in _docs(names):
                try:
                    want = lm_eval_utils.apply_template(template, doc)
                except Exception:  # noqa: BLE001 - this row shape does not fit the template
                    continue
                try:
                    got = render(template, doc, field)
                except Exception as e:  # noqa: BLE001
                    got = f"refused: {e}"
                outcomes.append(got == want)
                if got != want:
                    differ.append(f"{path.name} {field}: {want[:60]!r} -> {got[:60]!r}")
                break
            else:
                outcomes.append(None)  # renders on none of the synthetic rows, under lm-eval either
        if outcomes and None not in outcomes:
            rendered += 1
            same += all(outcomes)
    return rendered, same, differ


def test_a_sample_of_installed_lm_eval_yamls_renders_identically():
    from rnr_interp.tasks.lmeval import _installed_yamls

    rendered, same, differ = _parity(_installed_yamls()[::40])
    assert rendered > 200 and same == rendered, differ[:5]


@pytest.mark.slow
def test_every_installed_lm_eval_yaml_that_renders_renders_identically():
    """All of them (about two and a half minutes). lm-eval 0.4.13 ships 13,986 YAMLs; the
    10,825 with templates that all render on one of the synthetic rows render identically
    (1,858 distinct templates; the rest have no template, a !function, or a template no
    synthetic row fits)."""
    from rnr_interp.tasks.lmeval import _installed_yamls

    yamls = _installed_yamls()
    rendered, same, differ = _parity(yamls)
    print(f"{rendered} of {len(yamls)} installed lm-eval YAMLs render; {same} identically")
    assert rendered > 10_000 and same == rendered, differ[:5]


# -- readers never execute, and respect the writer -------------------------------------

MARKER_TEMPLATE = "{{ lipsum.__globals__.os.popen('touch MARK').read() }}"


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _one_line_refusal(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture
def lm_eval_run(tmp_path, monkeypatch) -> Path:
    """A finished audit of a task config of one's own (3 questions, one part each)."""
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, "Q: {{ q }}\nA:", "filter_list:\n  - name: flexible-extract\n    filter:\n"
                     "      - function: regex\n        regex_pattern: '(\\d+)'\n      - function: take_first\n")
    run = tmp_path / "run"
    _data(tmp_path)
    result = _cli(*_audit_args(tmp_path, config))
    assert result.exit_code == 0, result.output
    return run


def _audit_args(tmp_path: Path, config: Path) -> list[str]:
    return ["audit", "--model", "tiny-llama:1", "--task-config", str(config), "--data", str(tmp_path / "rows.jsonl"),
            "--k", "2", "--batch-size", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "run"), "-q"]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_readers_of_a_run_never_render_its_task_config_again(lm_eval_run, tmp_path):
    (tmp_path / "mine.yaml").write_text(f"task: mine\ndoc_to_target: '{{{{a}}}}'\ndoc_to_text: {json.dumps(MARKER_TEMPLATE)}\n")
    assert (lm_eval_run / "task.json").is_file()
    summary = json.loads((lm_eval_run / "summary.json").read_text())
    for args in (["pass-at-k", str(lm_eval_run)], ["regrade", str(lm_eval_run), "-q"], ["report", str(lm_eval_run)]):
        result = _cli(*args)
        assert result.exit_code == 0, (args, result.output)
        assert "cannot be reloaded" not in result.output
    assert not (tmp_path / "MARK").exists()
    again = json.loads((lm_eval_run / "summary.json").read_text())
    assert again["D"] == summary["D"] and again["O_K"] == summary["O_K"] and "unfinished" not in again
    assert "Q: what is 1" in (lm_eval_run / "report.html").read_text()  # the stored question, shown


def test_a_run_whose_stored_questions_were_edited_or_removed_is_refused_or_says_so(lm_eval_run, tmp_path):
    stored = lm_eval_run / "task.json"
    text = stored.read_text()
    stored.write_text(text.replace("what is 1", "what is 7"))
    line = _one_line_refusal(_cli("regrade", str(lm_eval_run), "-q"))
    assert "task.json" in line and "checksum" in line
    stored.unlink()  # a run from before runs stored their questions: its YAML is not rendered again
    line = _one_line_refusal(_cli("regrade", str(lm_eval_run), "-q"))
    assert "stored no questions" in line and not (tmp_path / "MARK").exists()
    assert _cli("report", str(lm_eval_run)).exit_code == 0  # written from the records, saying why the texts are missing
    assert "stored no questions" in (lm_eval_run / "report.html").read_text() and not (tmp_path / "MARK").exists()


def test_regrade_of_a_run_being_written_is_refused_and_changes_nothing(lm_eval_run):
    import subprocess
    import sys

    before = _files(lm_eval_run)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom rnr_interp.records import writer_lock\n"
                               f"lock = writer_lock(__import__('pathlib').Path({str(lm_eval_run)!r}))\n"
                               "print('held', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        line = _one_line_refusal(_cli("regrade", str(lm_eval_run), "-q"))
        assert "is being written by pid" in line
        line = _one_line_refusal(_cli("report", str(lm_eval_run)))
        assert "is being written by pid" in line
    finally:
        holder.kill()
        holder.wait()
    after = _files(lm_eval_run)
    after.pop(".lock", None)
    before.pop(".lock", None)
    assert after == before


def test_a_summary_from_an_unfinished_run_says_so_in_the_file_and_on_the_page(lm_eval_run):
    parts = sorted((lm_eval_run / "records").glob("part-*.parquet"))
    assert len(parts) == 3
    parts[-1].unlink()  # as if the run had been stopped after two questions
    result = _cli("regrade", str(lm_eval_run), "-q")
    assert result.exit_code == 0 and "unfinished run: 2 of 3 questions" in result.output
    summary = json.loads((lm_eval_run / "summary.json").read_text())
    assert summary["unfinished"] == {"questions_done": 2, "questions": 3}
    assert _cli("report", str(lm_eval_run)).exit_code == 0
    assert "unfinished run: 2 of 3 questions" in (lm_eval_run / "report.html").read_text()


def test_an_edited_records_part_is_refused_naming_it(lm_eval_run):
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = sorted((lm_eval_run / "records").glob("part-*.parquet"))[0]
    table = pq.read_table(part)
    flipped = pa.array([not c for c in table["correct"].to_pylist()])
    pq.write_table(table.set_column(table.schema.get_field_index("correct"), "correct", flipped), part)
    for args in (["pass-at-k", str(lm_eval_run)], ["regrade", str(lm_eval_run), "-q"]):
        line = _one_line_refusal(_cli(*args))
        assert part.name in line and "checksum" in line


def test_nothing_is_written_through_a_link_out_of_the_run(lm_eval_run, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    records = lm_eval_run / "records"
    (records / "part-00002.parquet").unlink()  # a stopped run, its last question to do
    for part in records.iterdir():
        part.rename(outside / part.name)
    records.rmdir()
    records.symlink_to(outside)
    line = _one_line_refusal(_cli(*_audit_args(tmp_path, tmp_path / "mine.yaml")))  # the resume
    assert "outside the run folder" in line
    assert sorted(p.name for p in outside.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    summary = lm_eval_run / "summary.json"
    target = tmp_path / "victim.txt"
    target.write_text('{"mine": 1}')
    summary.unlink()
    summary.symlink_to(target)
    (lm_eval_run / "report.html").unlink(missing_ok=True)
    (lm_eval_run / "report.html").symlink_to(target)
    for args in (["regrade", str(lm_eval_run), "-q"], ["report", str(lm_eval_run)]):
        result = _cli(*args)
        assert result.exit_code == 0, result.output
    assert target.read_text() == '{"mine": 1}' and not summary.is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]


# -- bounds on input, before work ------------------------------------------------------


def _refused_quickly(load, match: str) -> str:
    started = time.monotonic()
    with pytest.raises((DataFormatError, ValueError), match=match) as refused:
        load()
    assert time.monotonic() - started < 30
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_config_bombs_are_refused_before_they_are_parsed(tmp_path):
    data = _data(tmp_path)
    big = _config(tmp_path, "Q: {{q}}", "description: " + "x" * (2 << 20) + "\n")
    _refused_quickly(lambda: load_task("x", task_config=big, data=data), r"bytes: a task config holds at most 1,048,576")
    deep = tmp_path / "deep.yaml"
    deep.write_text("task: " + "[" * 100_000 + "]" * 100_000 + "\n")
    _refused_quickly(lambda: load_task("x", task_config=deep, data=data), "nested too deep")
    chain = tmp_path / "chain"
    chain.mkdir()
    for i in range(1500):
        (chain / f"c{i}.yaml").write_text(f"include: c{i + 1}.yaml\n" if i < 1499 else "task: mine\n")
    line = _refused_quickly(lambda: load_task("x", task_config=chain / "c0.yaml", data=data), "more than 16 files deep")
    assert "c0.yaml" in line


def test_data_that_is_not_a_bounded_regular_file_is_refused(tmp_path, monkeypatch):
    config = _config(tmp_path, "Q: {{q}}")
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    _refused_quickly(lambda: load_task("x", task_config=config, data=zero), "not a regular file")
    _refused_quickly(lambda: load_task("gsm8k", data=zero), "not a regular file")
    big = tmp_path / "big.jsonl"
    row = json.dumps({"q": "what", "a": "1"}) + "\n"
    big.write_text(row * (2 * (1 << 20) // len(row) + 1))
    monkeypatch.setenv("RNR_MAX_DATA_MB", "1")
    _refused_quickly(lambda: load_task("x", task_config=config, data=big), r"more than the 1 MB .* \(set RNR_MAX_DATA_MB")
    import bz2

    bomb = tmp_path / "bomb.txt.bz2"
    bomb.write_bytes(bz2.compress(b"\n" * (4 << 20)))  # 4 MB of newlines in a few hundred bytes
    _refused_quickly(lambda: load_task("logiqa", data=bomb), "decompresses to more than the 1 MB")
    monkeypatch.delenv("RNR_MAX_DATA_MB")
    from rnr_interp.tasks import _io

    monkeypatch.setattr(_io, "MAX_LINE_BYTES", 1000)
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"q": "w" * 2000, "a": "1"}) + "\n")
    _refused_quickly(lambda: load_task("x", task_config=config, data=long), r"long.jsonl:1: a line of 2,0\d\d bytes")


def test_json_handed_over_that_is_a_device_a_pipe_or_too_large_is_refused_before_reading(tmp_path, monkeypatch):
    """A sweep grid, an organism's planted.json and an SAE's cfg.json come from other
    people: /dev/zero, a pipe nobody writes to, or a file over the limit is refused in one
    line naming it, not read into memory or waited on."""
    import os

    from rnr_interp.analyses.organisms import read_planted
    from rnr_interp.analyses.sweep import Grid
    from rnr_interp.records import files
    from rnr_interp.sae import load_sae

    _refused_quickly(lambda: Grid.load("/dev/zero"), "/dev/zero: not a regular file")
    organism = tmp_path / "organism"
    organism.mkdir()
    os.mkfifo(organism / "planted.json")
    _refused_quickly(lambda: read_planted(organism), "planted.json: not a regular file")
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"models": ["tiny-llama"], "tasks": ["arithmetic"], "n": 2}) + " " * 100)
    assert Grid.load(grid).tasks[0].n == 2  # within the limit: read as before
    sae = tmp_path / "sae"
    sae.mkdir()
    (sae / "cfg.json").write_text(json.dumps({"metadata": {"hook_name": "blocks.0.hook_resid_pre", "note": "x" * 200}}))
    (sae / "sae_weights.safetensors").write_bytes(b"")
    monkeypatch.setattr(files, "MAX_JSON_BYTES", 100)
    _refused_quickly(lambda: Grid.load(grid), r"grid.json: more than the 100 bytes a JSON file may hold")
    _refused_quickly(lambda: load_sae(sae), r"cfg.json: more than the 100 bytes a JSON file may hold")


CHAT_BOMBS = {
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}": "more than 2 s of CPU",
    "{{ 'x' * 10 ** 20 }}": "OverflowError",
    "{{ ''.__class__.__mro__ }}": "SecurityError",
    "{% for i in range(20000) %}{{ messages[0]['content'] }}{% endfor %}": "characters for one prompt",
}


@pytest.mark.parametrize("template", CHAT_BOMBS)
def test_a_checkpoint_chat_template_is_bounded_and_refused_in_one_line(template):
    from rnr_interp.engine.sampling import check_prompts_fit
    from rnr_interp.models import load_model

    lm = load_model("tiny-llama:1")
    assert lm.chat
    lm.tokenizer.chat_template = template
    task = load_task("arithmetic", n=2)
    line = _refused_quickly(lambda: check_prompts_fit(lm, task, 4), "the chat template of tiny-llama:1")
    assert CHAT_BOMBS[template] in line
    assert _children_growth_mb() < 1024


def test_temperature_sweep_refuses_nan_before_making_its_folder(tmp_path):
    out = tmp_path / "sweep"
    line = _one_line_refusal(_cli("temperature-sweep", "--model", "tiny-llama:1", "--task", "arithmetic", "--n", "2",
                                  "--k", "1", "--temperatures", "nan,1", "--out", str(out), "-q"))
    assert "--temperatures must be finite numbers > 0" in line and not out.exists()


def test_a_lock_or_journal_planted_as_a_link_is_never_written_through(tmp_path):
    from rnr_interp.records import Journal, RunDir

    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    run = RunDir.create(tmp_path / "run", {"kind": "audit", "task": load_task("arithmetic", n=2).run_description()})
    run.release()
    (tmp_path / "run" / ".lock").symlink_to(victim)
    with pytest.raises(ValueError, match=r"\.lock: cannot be opened as the run's lock"):
        RunDir.create(tmp_path / "run", {"kind": "audit", "task": load_task("arithmetic", n=2).run_description()})
    journal = tmp_path / "run" / "journal.jsonl"
    journal.symlink_to(victim)
    with pytest.raises(OSError):
        Journal(journal, "id").append([{"done": 1}])
    assert victim.read_text() == "mine"
