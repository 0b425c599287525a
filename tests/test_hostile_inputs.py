"""Hostile input through the `rnr` command line: every case is generated here and checked
the same way. A refused command exits 2 with exactly one line on stderr (`error: ...`)
naming the problem, shows no traceback, leaves no new folder behind and changes no byte
of a run folder that was already there.

The cases: every analysis command's bad option values, bad `--out` paths, malformed
model specs, data files with bad bytes, bad compression or ambiguous gold, damaged run
folders (Parquet parts, manifests, summaries), a probe a run does not have, a prompt
longer than the model's context, a second writer on a run folder (refused, naming the
holder), a killed writer's lock (taken over), two audits racing for one folder, and data
edited between a run and its resume or comparison (refused) or moved (accepted).
"""

from __future__ import annotations

import bz2
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rnr_interp.cli import app
from rnr_interp.records import LOCK, RunDir

TINY = ["--model", "tiny-llama", "--quiet"]
AUDIT = ["audit", *TINY, "--task", "arithmetic", "--n", "3", "--k", "2", "--max-new-tokens", "4", "--batch-size", "2"]
JSONL_ROWS = [{"id": f"q{i}", "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(3)]


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` by relative path, with its content's sha256."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(*args: str, absent: tuple[Path, ...] = (), intact: tuple[Path, ...] = (), says: tuple[str, ...] = ()) -> str:
    """Run the command, expect the one-line refusal; `absent` paths must not exist after
    it, `intact` folders must be byte-identical, and the line must contain `says`."""
    before = {folder: tree(folder) for folder in intact}
    res = invoke(*args)
    err = res.stderr.strip()
    assert res.exit_code == 2, f"exit {res.exit_code} for {args}: {res.output}"
    assert len(err.splitlines()) == 1 and err.startswith("error: "), f"not one line for {args}: {err!r}"
    assert "Traceback" not in res.output and res.stdout == "", res.output
    for path in absent:
        assert not path.exists(), f"{path} left behind by {args}"
    for folder, files in before.items():
        assert tree(folder) == files, f"{folder} changed by {args}"
    for text in says:
        assert text in err, f"{text!r} not in {err!r}"
    return err


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished tiny audit (two record parts), copied by the tests that damage it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    res = invoke(*AUDIT, "--out", out)
    assert res.exit_code == 0, res.output
    assert len(RunDir(out).parts()) == 2 and not (out / LOCK).exists()
    return out


@pytest.fixture
def run_copy(finished, tmp_path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "copy"))


# -- option values: refused before anything is created ----------------------------------

AUDIT_BAD = [
    ("--top-p", "0"), ("--top-p", "2"), ("--top-p", "nan"), ("--batch-size", "0"), ("--batch-size", "-3"),
    ("--k", "0"), ("--k", "-1"), ("--k", "abc"), ("--temperature", "nan"), ("--temperature", "0"),
    ("--temperature", "-1"), ("--temperature", "inf"), ("--deployed-temperature", "-0.5"),
    ("--deployed-temperature", "nan"), ("--max-new-tokens", "0"), ("--max-new-tokens", "-4"), ("--n", "-1"),
    ("--n", "0"), ("--ci", "bayes"), ("--seed", "x"), ("--bogus", "1"),
]


@pytest.mark.parametrize("option, value", AUDIT_BAD)
def test_audit_refuses_bad_option_before_creating_anything(tmp_path, option, value):
    out = tmp_path / "out"
    err = refused(*AUDIT, option, value, "--out", out, absent=(out,))
    assert option.lstrip("-").replace("-", "_") in err.replace("-", "_") or "No such option" in err


ROUTE = ["route", *TINY, "--task", "arithmetic", "--n", "2", "--k", "2", "--methods", "random"]
ROUTE_BAD = [
    ("--k", "0"), ("--batch-size", "0"), ("--min-len", "-1"), ("--max-len", "0"), ("--min-len", "5", "--max-len", "3"),
    ("--space", "diagonal"), ("--methods", "beam"), ("--collapse", "nan"), ("--temperature", "nan"), ("--n", "-2"),
    ("--proposals", "0"), ("--methods", "random,random_matched"),
]


@pytest.mark.parametrize("bad", ROUTE_BAD, ids=lambda b: " ".join(b))
def test_route_refuses_bad_option_before_creating_anything(tmp_path, bad):
    out = tmp_path / "out"
    refused(*ROUTE, *bad, "--out", out, absent=(out,))


MC = ["--task", "arithmetic_mc", "--n", "4"]
LOCALISE_BAD = [
    ("failures", "--panel", "0"), ("failures", "--batch-size", "0"), ("failures", "--max-new-tokens", "0"),
    ("failures", "--readout", "vibes"), ("failures", "--n", "-1"),
    ("repair", "--layers", "-1"), ("repair", "--layers", "abc"), ("repair", "--layers", "0-99"),
    ("repair", "--panel", "-2"), ("repair", "--batch-size", "0"),
    ("steer", "--layer", "-1"), ("steer", "--layer", "7"), ("steer", "--alphas", "x"), ("steer", "--alphas", "nan"),
    ("steer", "--component", "head"), ("steer", "--alpha-unit", "parsecs"),
    ("units", "--ks", "0"), ("units", "--ks", "abc"), ("units", "--layer", "-3"),
    ("failures", "--circular", "--readout", "letter"), ("repair", "--circular", "--readout", "letter"),
]


@pytest.mark.parametrize("bad", LOCALISE_BAD, ids=lambda b: " ".join(b))
def test_localisation_refuses_bad_option_before_creating_anything(tmp_path, bad):
    command, *option = bad
    out = tmp_path / "out"
    refused(command, *TINY, *MC, *option, "--out", out, absent=(out,))


@pytest.mark.parametrize("command,option,says", [
    ("repair", "--permute-control", "not option letters"), ("steer", "--permute-control", "not option letters"),
    ("units", "--permute-control", "not option letters"), ("failures", "--circular", "shifts lettered options"),
    ("repair", "--circular", "shifts lettered options"),
])
def test_letter_controls_refuse_options_that_are_not_lettered(tmp_path, command, option, says):
    # BoolQ's options are the words yes/no: rotating them moves nothing that is graded
    data = write_jsonl(tmp_path / "boolq.jsonl", [{"question": "is it", "passage": "It is.", "answer": True},
                                                  {"question": "is it not", "passage": "It is.", "answer": False}])
    out = tmp_path / "out"
    refused(command, *TINY, "--task", "boolq", "--data", data, "--n", "2", option, "--out", out,
            absent=(out,), says=(says,))


def test_failures_refuses_a_free_form_task_without_distractors(tmp_path):
    out, data = tmp_path / "out", tmp_path / "words.jsonl"
    data.write_text('{"prompt": "Say a colour.", "answer": "red"}\n')
    refused("failures", *TINY, "--task", "jsonl", "--data", data, "--out", out, absent=(out,), says=("no distractors",))


@pytest.mark.parametrize("bins", ["0,0.5,0.5,1", "abc", "1", "0.5,0.1", "nan,1", ""])
def test_compare_refuses_bad_bins_before_creating_anything(finished, tmp_path, bins):
    out = tmp_path / "cmp"
    refused("compare", finished, finished, "--bins", bins, "--out", out, absent=(out,), intact=(finished,), says=("--bins",))


@pytest.mark.parametrize("option, value", [("--factor", "0"), ("--batch-size", "0")])
def test_compare_refuses_bad_control_options(finished, tmp_path, option, value):
    out = tmp_path / "cmp"
    refused("compare", finished, finished, option, value, "--out", out, absent=(out,), intact=(finished,))


def test_sweep_refuses_a_bad_grid(tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text('{"models": ["tiny-llama"], "tasks": [{"name": "arithmetic", "n": 2}], "probes": [{"k": 0}]}')
    out = tmp_path / "sweep"
    refused("sweep", grid, "--out", out, absent=(out,))


# -- output folders ------------------------------------------------------------------------


def out_cases(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    return {"is a file": a_file, "under a file": a_file / "run", "cannot be created": Path("/proc/rnr-test/run")}


@pytest.mark.parametrize("case", ["is a file", "under a file", "cannot be created"])
def test_audit_out_that_cannot_be_a_folder(tmp_path, case):
    out = out_cases(tmp_path)[case]
    before = tree(tmp_path)
    refused(*AUDIT, "--out", out, says=(str(out),))
    assert tree(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_audit_out_in_a_read_only_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        refused(*AUDIT, "--out", locked / "run", absent=(locked / "run",), says=("not writable",))
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize("command", ["route", "failures", "repair", "steer", "units", "compare", "report", "sweep"])
def test_every_command_refuses_an_out_that_is_a_file(finished, tmp_path, command):
    a_file = out_cases(tmp_path)["is a file"]
    grid = tmp_path / "grid.json"
    grid.write_text('{"models": ["tiny-llama"], "tasks": [{"name": "arithmetic", "n": 2}], "probes": [{"k": 1}]}')
    args = {"route": ROUTE, "compare": ["compare", finished, finished], "report": ["report", finished],
            "sweep": ["sweep", grid]}.get(command, [command, *TINY, *MC])
    refused(*args, "--out", a_file, intact=(finished,), says=(str(a_file),))
    assert a_file.read_text() == "not a folder"


# -- model specs ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["tiny-llama:abc", "tiny-llama:0", "tiny-llama:-1", "tiny-llama:", "tiny-gpt2:100000",
                                  "tiny-llama:2:3", "missing.gguf", "./no-such-folder", "", "smollm2:3"])
def test_malformed_model_spec(tmp_path, spec):
    refused("model-info", spec)
    out = tmp_path / "out"
    refused("audit", "--model", spec, "--task", "arithmetic", "--n", "1", "--k", "1", "--out", out, absent=(out,))


def test_checkpoint_folder_without_config(tmp_path):
    (tmp_path / "ckpt").mkdir()
    refused("model-info", tmp_path / "ckpt", says=("config.json",))


# -- data files ---------------------------------------------------------------------------------


def bad_data(tmp_path: Path) -> dict[str, tuple[str, Path, str]]:
    """name -> (task, file, text the error must contain)."""
    d = tmp_path / "data"
    d.mkdir()
    (d / "latin1.jsonl").write_bytes(b'{"prompt": "ok", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    (d / "nan.jsonl").write_bytes(b'{"prompt": "x", "answer": NaN}\n')
    (d / "inf.jsonl").write_bytes(b'{"prompt": "x", "answer": Infinity}\n')
    write_jsonl(d / "twin.jsonl", [{"prompt": "x", "choices": ["a", "b", " a"], "answer": "A"}])
    write_jsonl(d / "arc.jsonl", [{"id": "a1", "question": {"stem": "s", "choices": [
        {"text": "x", "label": "A"}, {"text": "y", "label": "A"}]}, "answerKey": "A"}])
    (d / "garbage.txt.bz2").write_bytes(b"this is not bzip2")
    (d / "cut.txt.bz2").write_bytes(bz2.compress(b"ctx\n0\na\nb\nc\nd\n" * 40)[:-25])
    (d / "empty.jsonl").write_bytes(b"")
    (d / "binary.jsonl").write_bytes(bytes(range(256)))
    return {
        "latin1": ("jsonl", d / "latin1.jsonl", "latin1.jsonl:2: not UTF-8"),
        "nan": ("jsonl", d / "nan.jsonl", "nan.jsonl:1"),
        "inf": ("jsonl", d / "inf.jsonl", "inf.jsonl:1"),
        "twin gold": ("jsonl", d / "twin.jsonl", "ambiguous gold"),
        "twin label": ("arc", d / "arc.jsonl", "ambiguous gold"),
        "garbage bz2": ("hellaswag", d / "garbage.txt.bz2", "bzip2"),
        "truncated bz2": ("hellaswag", d / "cut.txt.bz2", "bzip2"),
        "empty": ("jsonl", d / "empty.jsonl", "no rows"),
        "binary": ("jsonl", d / "binary.jsonl", "binary.jsonl:2: not UTF-8"),
        "missing": ("jsonl", d / "nowhere.jsonl", "nowhere.jsonl"),
        "a folder": ("jsonl", d, str(d)),
    }


@pytest.mark.parametrize("case", ["latin1", "nan", "inf", "twin gold", "twin label", "garbage bz2", "truncated bz2",
                                  "empty", "binary", "missing", "a folder"])
def test_bad_data_file(tmp_path, case):
    task, path, text = bad_data(tmp_path)[case]
    out = tmp_path / "out"
    refused("audit", *TINY, "--task", task, "--data", path, "--k", "1", "--out", out, absent=(out,), says=(text,))


def test_byte_order_marks_are_stripped(tmp_path):
    from rnr_interp.tasks import load_task

    first = json.dumps({"id": "a", "prompt": "1+1=", "answer": "2"}).encode()
    second = json.dumps({"id": "b", "prompt": "2+2=", "answer": "4"}).encode()
    # one at the start of the file, one where a second file was appended
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + first + b"\n\xef\xbb\xbf" + second + b"\n")
    task = load_task("jsonl", data=tmp_path / "bom.jsonl")
    assert [q.text for q in task.questions] == ["1+1=", "2+2="]
    (tmp_path / "q.txt").write_bytes(b"\xef\xbb\xbf\nb\nctx\nquestion?\nA. w\nB. x\nC. y\nD. z\n")
    logiqa = load_task("logiqa", data=tmp_path / "q.txt")
    assert logiqa.questions[0].answer == "B" and "\ufeff" not in repr(logiqa.questions[0])


def test_prompt_longer_than_the_context(tmp_path):
    data = write_jsonl(tmp_path / "long.jsonl", [JSONL_ROWS[0], {"id": "long", "prompt": "x" * 700, "answer": "1"}])
    out = tmp_path / "out"
    for spec in ("tiny-llama", "tiny-gpt2", "tiny-gemma"):
        refused("audit", "--model", spec, "--quiet", "--task", "jsonl", "--data", data, "--k", "1", "--out", out,
                absent=(out,), says=("'long'", "context of 512"))


# -- damaged run folders --------------------------------------------------------------------


def damage(run: Path, case: str) -> Path:
    """Damage one file of a copied run folder; returns the file."""
    part = run / "records" / "part-00001.parquet"
    data = part.read_bytes()
    if case == "garbage part":
        part.write_bytes(b"PAR1 this is not parquet PAR1")
    elif case == "truncated part":
        part.write_bytes(data[: len(data) // 2])
    elif case == "empty part":
        part.write_bytes(b"")
    elif case == "foreign part":
        pq.write_table(pa.table({"question_id": ["q0"], "score": [1.0]}), part)
    elif case == "mistyped part":
        table = pq.read_table(part)
        pq.write_table(table.set_column(table.schema.get_field_index("candidate"), "candidate",
                                        pa.array([str(x) for x in table["candidate"].to_pylist()])), part)
    else:
        target, text = {
            "garbage manifest": ("manifest.json", "{not json"),
            "empty manifest": ("manifest.json", "{}"),
            "list manifest": ("manifest.json", "[1, 2]"),
            "binary manifest": ("manifest.json", "\udcff"),
            "garbage summary": ("summary.json", "]]"),
            "empty summary": ("summary.json", "{}"),
        }[case]
        path = run / target
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        return path
    return part


RUN_DAMAGE = ["garbage part", "truncated part", "empty part", "foreign part", "mistyped part", "garbage manifest",
              "empty manifest", "list manifest", "binary manifest", "garbage summary", "empty summary"]


# pass-at-k reads the records, not the summary
@pytest.mark.parametrize("command, case", [("report", case) for case in RUN_DAMAGE]
                         + [("pass-at-k", case) for case in RUN_DAMAGE if "summary" not in case])
def test_damaged_run_folder(run_copy, case, command):
    path = damage(run_copy, case)
    refused(command, run_copy, intact=(run_copy,), absent=(run_copy / "report.html",), says=(path.name,))


@pytest.mark.parametrize("case", ["garbage part", "garbage manifest", "empty manifest"])
def test_damaged_run_is_not_resumed(run_copy, case):
    path = damage(run_copy, case)
    refused(*AUDIT, "--out", run_copy, intact=(run_copy,), says=(path.name,))


def test_missing_manifest(run_copy, tmp_path):
    (run_copy / "manifest.json").unlink()
    refused("pass-at-k", run_copy, intact=(run_copy,), says=("manifest.json",))
    refused("report", run_copy, intact=(run_copy,))
    refused(*AUDIT, "--out", run_copy, intact=(run_copy,), says=("no manifest.json",))
    refused("compare", run_copy, run_copy, "--out", tmp_path / "cmp", absent=(tmp_path / "cmp",))


def test_pass_at_k_of_a_probe_the_run_lacks(finished):
    refused("pass-at-k", finished, "--probe", "random_route", intact=(finished,), says=("random_route", "temperature"))


def test_compare_with_a_damaged_run(run_copy, finished, tmp_path):
    damage(run_copy, "truncated part")
    out = tmp_path / "cmp"
    refused("compare", finished, run_copy, "--out", out, absent=(out,), intact=(finished, run_copy),
            says=("part-00001.parquet",))


# -- one writer per run folder ------------------------------------------------------------

HOLD = ("import sys, time\nfrom rnr_interp.records import RunDir\nrun = RunDir(sys.argv[1])\n"
        "held = RunDir.create(sys.argv[1], run.config)\nprint('holding', flush=True)\ntime.sleep(120)\n")


def python(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def test_second_writer_refused_and_killed_writers_lock_taken_over(run_copy):
    holder = python("-c", HOLD, str(run_copy))
    try:
        assert holder.stdout.readline().strip() == "holding"
        records = tree(run_copy / "records")
        refused(*AUDIT, "--out", run_copy, says=(f"pid {holder.pid}", "being written"))
        assert tree(run_copy / "records") == records
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert (run_copy / LOCK).exists()  # a killed writer leaves its lock file
    res = invoke(*AUDIT, "--out", run_copy)
    assert res.exit_code == 0, res.output
    assert tree(run_copy / "records") == records  # resumed with nothing to redo
    assert not (run_copy / LOCK).exists()


def test_lock_holder_named_when_its_details_land_just_after_the_flock(tmp_path):
    """The window CI once hit: the holder has the flock but has not yet written who it
    is. The refused writer waits for the details instead of saying there are none."""
    import fcntl
    import threading

    from rnr_interp.records import RunLockedError, writer_lock

    tmp_path.mkdir(exist_ok=True)
    fd = os.open(tmp_path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    details = json.dumps({"pid": 4242, "host": "h", "started": "t", "command": "rnr audit"}).encode()
    late = threading.Timer(0.3, os.pwrite, (fd, details, 0))
    late.start()
    try:
        with pytest.raises(RunLockedError, match="being written by pid 4242 on h"):
            writer_lock(tmp_path)
    finally:
        late.join()
        os.close(fd)


def test_two_audits_racing_for_one_folder(tmp_path):
    out = tmp_path / "race"
    procs = [python("-m", "rnr_interp.cli", *AUDIT, "--out", str(out)) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    for code, err in results:
        if code == 2:
            assert err.count("\n") == 1 and "being written by pid" in err, err
    records = RunDir(out).read_records()
    assert not records.duplicated(["question_id", "probe", "candidate", "intervention"]).any()
    assert len(records) == 3 * (1 + 2)


# -- data edited or moved between runs ---------------------------------------------------------


def jsonl_audit(data: Path, out: Path, seed: str = "0") -> list[str]:
    return ["audit", *TINY, "--task", "jsonl", "--data", str(data), "--k", "2", "--max-new-tokens", "3",
            "--seed", seed, "--out", str(out)]


@pytest.fixture
def jsonl_run(tmp_path) -> tuple[Path, Path]:
    data = write_jsonl(tmp_path / "qs.jsonl", JSONL_ROWS)
    out = tmp_path / "run"
    assert invoke(*jsonl_audit(data, out)).exit_code == 0
    return data, out


def test_edited_data_is_not_resumed(jsonl_run):
    data, out = jsonl_run
    write_jsonl(data, [*JSONL_ROWS[:2], {**JSONL_ROWS[2], "answer": "99"}])  # same path, same ids, new gold
    refused(*jsonl_audit(data, out), intact=(out,), says=("task.questions_hash",))


def test_same_data_at_another_path_resumes(jsonl_run, tmp_path):
    data, out = jsonl_run
    moved = Path(shutil.copy(data, tmp_path / "elsewhere.jsonl"))
    records = tree(out / "records")
    res = invoke(*jsonl_audit(moved, out))
    assert res.exit_code == 0, res.output
    assert tree(out / "records") == records


def test_compare_uses_content_not_paths(jsonl_run, tmp_path):
    data, base = jsonl_run
    moved = Path(shutil.copy(data, tmp_path / "moved.jsonl"))
    same = tmp_path / "same"
    assert invoke(*jsonl_audit(moved, same, seed="1")).exit_code == 0
    res = invoke("compare", base, same, "--out", tmp_path / "cmp")
    assert res.exit_code == 0, res.output
    edited = write_jsonl(tmp_path / "edited.jsonl", [*JSONL_ROWS[:2], {**JSONL_ROWS[2], "answer": "99"}])
    other = tmp_path / "other"
    assert invoke(*jsonl_audit(edited, other, seed="1")).exit_code == 0
    out = tmp_path / "cmp2"
    refused("compare", base, other, "--out", out, absent=(out,), intact=(base, other), says=("task.questions_hash",))


def test_debug_shows_the_traceback():
    res = invoke("--debug", "model-info", "tiny-llama:abc")
    assert res.exit_code != 0 and "ModelSpecError" in repr(res.exception)


# -- checkpoints never run code of their own ----------------------------------------------------


def tiny_checkpoint(folder: Path) -> Path:
    from rnr_interp.models import build_tiny

    model, tok = build_tiny("tiny-llama", n_layers=2)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("config_file", ["config.json", "tokenizer_config.json"])
def test_checkpoint_that_needs_its_own_code_is_refused_without_a_prompt(tmp_path, config_file):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "code-ran"
    (ckpt / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((ckpt / config_file).read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel", "AutoConfig": "evil.EvilConfig"}
    (ckpt / config_file).write_text(json.dumps(config))
    out = tmp_path / "out"
    before = tree(ckpt)
    # whatever answer a prompt would get, none is asked and nothing runs
    res = CliRunner().invoke(app, ["model-info", str(ckpt)], input="y\ny\n")
    assert res.exit_code == 2 and res.stdout == "" and "[y/N]" not in res.output, res.output
    assert "code of its own" in res.stderr and config_file in res.stderr and len(res.stderr.splitlines()) == 1
    refused("audit", "--model", ckpt, "--quiet", "--task", "arithmetic", "--n", "1", "--k", "1", "--out", out,
            absent=(out,), says=("code of its own",))
    assert not marker.exists() and tree(ckpt) == before


def test_weights_pickle_that_holds_code_is_one_line(tmp_path):
    import torch

    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "code-ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (ckpt / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": Payload()}, ckpt / "pytorch_model.bin")
    refused("model-info", ckpt, says=("more than tensors",))
    assert not marker.exists()


def test_checkpoint_declaring_a_million_layers_is_refused_before_allocating(tmp_path):
    """Its shape is counted from config.json on the meta device: refused in one line with
    the limit and how to raise it, by a process that stays under 1 GiB."""
    import re

    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    config["num_hidden_layers"] = 1_000_000
    config.pop("layer_types", None)
    (ckpt / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    err = refused("audit", "--model", ckpt, "--quiet", "--task", "arithmetic", "--n", "1", "--k", "1", "--out", out,
                  absent=(out,), says=("GiB in float32", "RNR_MODEL_MEMORY_GB"))
    declared = int(re.search(r"declares ([\d,]+) parameters", err).group(1).replace(",", ""))
    assert declared > 1_000_000 * 4 * 64 * 64  # at least every layer's four attention projections
    # VmHWM is this process's own peak: getrusage's ru_maxrss also carries the peak of the
    # (forked) test process it was started from, which a full suite grows past 1 GiB
    load = ("import re\nfrom rnr_interp.models import ModelSpecError, load_model\ntry:\n"
            f"    load_model({str(ckpt)!r})\nexcept ModelSpecError:\n"
            "    hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)\n"
            "    print('refused', hwm)")
    done = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    said, peak_kib = done.stdout.split()
    assert said == "refused" and int(peak_kib) < 2**20, done.stdout + done.stderr  # under 1 GiB


def test_model_memory_limit_is_set_by_its_variable_and_checked(tmp_path, monkeypatch):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    monkeypatch.setenv("RNR_MODEL_MEMORY_GB", "0.0001")  # 105 kB: under the tiny model's 0.5 MB of float32
    refused("model-info", ckpt, says=("more than the 0.0 GiB a model may take here",))
    monkeypatch.setenv("RNR_MODEL_MEMORY_GB", "lots")
    refused("model-info", ckpt, says=("RNR_MODEL_MEMORY_GB must be a positive number of GiB, got 'lots'",))
    monkeypatch.setenv("RNR_MODEL_MEMORY_GB", "1")
    res = invoke("model-info", ckpt)
    assert res.exit_code == 0 and json.loads(res.stdout)["n_layers"] == 2


@pytest.mark.parametrize("device", ["meta", "cuda:99", "xla", "mps"])
def test_unusable_device_is_refused_before_a_run_folder_exists(tmp_path, monkeypatch, device):
    import torch

    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    if device == "cuda:99" and not torch.cuda.is_available():
        device = "cuda:0"  # no CUDA at all: the same refusal for every index
    out = tmp_path / "out"
    refused("--device", device, *AUDIT, "--out", out, absent=(out,), says=(repr(device),))
    monkeypatch.setenv("RNR_DEVICE", device)
    refused(*AUDIT, "--out", out, absent=(out,), says=(repr(device),))


def test_every_transformers_load_refuses_remote_code():
    """Each from_pretrained (and vLLM's engine) is told trust_remote_code=False, so the
    library can never ask whether to run a checkpoint's code."""
    import re

    package = Path(__file__).resolve().parents[1] / "rnr_interp"
    calls = []
    for path in package.rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"\.from_pretrained\(|\bLLM\(", text):
            depth, end = 0, m.end() - 1
            for end in range(m.end() - 1, len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            calls.append((path.name, text[m.start():end + 1]))
    assert len(calls) >= 8
    assert [c for c in calls if "trust_remote_code" not in c[1]] == []


# -- every part and journal line belongs to its run ------------------------------------------------


@pytest.fixture(scope="module")
def seeds_run(tmp_path_factory) -> tuple[Path, Path]:
    """Two finished tiny audits that differ only in their seed."""
    root = tmp_path_factory.mktemp("seeds")
    runs = root / "seed0", root / "seed1"
    for seed, out in enumerate(runs):
        res = invoke(*AUDIT, "--seed", str(seed), "--out", out)
        assert res.exit_code == 0, res.output
    return runs


def test_a_part_copied_from_another_run_is_refused(seeds_run, tmp_path):
    mine, other = (Path(shutil.copytree(run, tmp_path / run.name)) for run in seeds_run)
    foreign = mine / "records" / "part-00007.parquet"
    shutil.copy(other / "records" / "part-00000.parquet", foreign)
    for command in (["pass-at-k", mine], ["report", mine], [*AUDIT, "--out", mine]):
        refused(*command, intact=(mine,), absent=(mine / "report.html",), says=("part-00007.parquet", "another run"))


def test_a_part_whose_rows_were_made_under_another_config(seeds_run, tmp_path):
    """A part carried over with its run id rewritten to this run's is still caught when
    the config itself was edited (the run id is the config's hash)."""
    mine = Path(shutil.copytree(seeds_run[0], tmp_path / "mine"))
    manifest = json.loads((mine / "manifest.json").read_text())
    manifest["config"]["probe"]["k"] = 3  # hand-edited: 2 -> 3
    (mine / "manifest.json").write_text(json.dumps(manifest))
    for command in (["pass-at-k", mine], ["report", mine], [*AUDIT, "--k", "3", "--out", mine], [*AUDIT, "--out", mine]):
        refused(*command, intact=(mine,), says=("manifest.json", "edited after the run started"))
    # the hashes recomputed to match: the records now carry another run's id
    from rnr_interp.records import comparable_hash, config_hash

    manifest["config_hash"] = config_hash(manifest["config"])
    manifest["comparable_hash"] = comparable_hash(manifest["config"])
    (mine / "manifest.json").write_text(json.dumps(manifest))
    for command in (["pass-at-k", mine], [*AUDIT, "--k", "3", "--out", mine]):
        refused(*command, intact=(mine,), says=("part-00000.parquet", "another run"))


def test_where_the_data_lives_may_be_edited_in_the_manifest(seeds_run, tmp_path):
    mine = Path(shutil.copytree(seeds_run[0], tmp_path / "mine"))
    manifest = json.loads((mine / "manifest.json").read_text())
    manifest["config"]["task"]["source"] = "/data/moved/elsewhere.jsonl"  # provenance, not content
    (mine / "manifest.json").write_text(json.dumps(manifest))
    res = invoke("pass-at-k", mine)
    assert res.exit_code == 0, res.output


def test_a_run_made_before_these_checks_still_reads():
    """The committed GSM8K routing folder: parts written before any of this, as they are."""
    run = Path(__file__).resolve().parents[1] / "experiments" / "runs" / "gsm8k40"
    if not run.is_dir():
        pytest.skip("no committed run folder here")
    before = tree(run)
    res = invoke("pass-at-k", run)
    assert res.exit_code == 0 and res.stdout.startswith("D (deployed"), res.output
    assert len(RunDir(run).read_records()) == 28200 and tree(run) == before


def test_report_does_not_show_the_questions_of_an_edited_data_file(jsonl_run, tmp_path):
    data, out = jsonl_run
    write_jsonl(data, [{**row, "prompt": f"EDITED {row['prompt']}"} for row in JSONL_ROWS])
    res = invoke("report", out, "--out", tmp_path / "page")
    assert res.exit_code == 0, res.output
    page = (tmp_path / "page" / "report.html").read_text()
    assert "EDITED" not in page and "no longer holds the run" in page


ROUTE_RUN = ["route", *TINY, "--task", "arithmetic", "--n", "2", "--k", "2", "--methods", "random"]


def killed_route_run(out: Path, seed: int) -> Path:
    """A route run (the CLI's ROUTE_RUN config) stopped inside its only chunk: its
    journal holds the chunk's samples and some route evaluations, no part is written."""
    import rnr_interp.analyses.routing.run as audit
    from rnr_interp.analyses.routing.config import RouteConfig
    import rnr_interp.engine.rows as row_runner
    from rnr_interp.models import load_model
    from rnr_interp.tasks import load_task

    original, calls = row_runner.generate, []

    def dies_on_the_second_batch(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return original(*a, **kw)

    cfg = RouteConfig(samples=2, budget=2, methods=("random",), seed=seed)
    row_runner.generate = dies_on_the_second_batch
    try:
        with pytest.raises(KeyboardInterrupt):
            audit.run_route_audit(load_model("tiny-llama"), load_task("arithmetic", n=2), out, cfg, progress=False)
    finally:
        row_runner.generate = original
    assert RunDir(out).parts() == [] and (out / "journal.jsonl").is_file()
    return out


@pytest.fixture(scope="module")
def route_runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("route")
    clean = root / "clean"
    res = invoke(*ROUTE_RUN, "--out", clean)
    assert res.exit_code == 0, res.output
    return {"clean": clean, "killed0": killed_route_run(root / "killed0", 0), "killed1": killed_route_run(root / "killed1", 1)}


def same_records(a: Path, b: Path) -> None:
    import numpy as np
    import pandas as pd

    x, y = RunDir(a).read_records(), RunDir(b).read_records()
    exact = [c for c in x.columns if c != "logprob"]
    pd.testing.assert_frame_equal(x[exact], y[exact])
    assert np.allclose(x["logprob"], y["logprob"], atol=1e-5)


def test_a_killed_route_run_resumes_to_the_uninterrupted_records(route_runs, tmp_path):
    run = Path(shutil.copytree(route_runs["killed0"], tmp_path / "run"))
    assert all(json.loads(line)["run_id"] == RunDir(run).run_id for line in (run / "journal.jsonl").read_text().splitlines())
    res = invoke(*ROUTE_RUN, "--out", run)
    assert res.exit_code == 0, res.output
    same_records(run, route_runs["clean"])
    assert not (run / "journal.jsonl").exists()


def strip_run_ids(journal: Path) -> None:
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    journal.write_text("".join(json.dumps({k: v for k, v in e.items() if k != "run_id"}) + "\n" for e in lines))


@pytest.mark.parametrize("case", ["another run's", "another run's, old format", "this run's without its id", "null line", "list line",
                                  "entry without fields", "route entry without its row", "route lines only",
                                  "nested too deep"])
def test_a_journal_that_is_not_this_runs_is_refused(route_runs, tmp_path, case):
    run = Path(shutil.copytree(route_runs["killed0"], tmp_path / "run"))
    journal = run / "journal.jsonl"
    lines = journal.read_text().splitlines()
    if case.startswith("another run's"):
        shutil.copy(route_runs["killed1"] / "journal.jsonl", journal)
        if "old format" in case:
            strip_run_ids(journal)
    elif case == "this run's without its id":  # no committed run left one: nothing vouches for it
        strip_run_ids(journal)
    elif case == "route lines only":
        strip_run_ids(journal)
        journal.write_text("".join(line + "\n" for line in journal.read_text().splitlines() if '"samples"' not in line))
    else:
        extra = {"null line": "null", "list line": "[1, 2]", "entry without fields": '{"question_id": "arith-0"}',
                 "route entry without its row": '{"question_id": "arith-0", "route": [0, 1, 2]}',
                 "nested too deep": "[" * 100_000 + "]" * 100_000}[case]
        journal.write_text("\n".join([*lines, extra]) + "\n")
    refused(*ROUTE_RUN, "--out", run, intact=(run,), says=("journal.jsonl", "line"))


# -- output folders that would lose data ----------------------------------------------------------


def test_the_empty_out_is_refused(finished, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("keep")
    before = tree(tmp_path)
    grid = tmp_path / "grid.json"
    for command in (AUDIT, ROUTE_RUN, ["compare", finished, finished], ["report", finished], ["route-summary", finished],
                    ["route-cells", tmp_path], ["sweep", grid], ["temperature-sweep", *TINY, "--n", "1", "--k", "1"]):
        refused(*command, "--out", "", intact=(finished,), says=("empty string",))
    assert tree(tmp_path) == before


@pytest.mark.parametrize("held", ["summary.json", "manifest-notes.txt", "records/mine.csv"])
def test_an_out_folder_of_the_users_own_files_is_refused(finished, tmp_path, held):
    out = tmp_path / "mine"
    (out / held).parent.mkdir(parents=True, exist_ok=True)
    (out / held).write_text("the user's own")
    for command in (AUDIT, ROUTE_RUN, ["compare", finished, finished], ["report", finished]):
        refused(*command, "--out", out, intact=(out, finished), says=(held,))
    if held == "summary.json":
        assert "would be overwritten" in refused(*AUDIT, "--out", out)


def test_an_empty_out_folder_or_one_a_killed_start_left_is_used(tmp_path):
    empty, stale = tmp_path / "empty", tmp_path / "stale"
    empty.mkdir()
    (stale / "records").mkdir(parents=True)
    (stale / LOCK).write_text('{"pid": 1}')  # a writer killed before its manifest
    (stale / "records" / "part-00000.parquet.99.tmp").write_bytes(b"torn")
    for out in (empty, stale):
        res = invoke(*AUDIT, "--out", out)
        assert res.exit_code == 0, res.output
        assert len(RunDir(out).read_records()) == 3 * (1 + 2)


# -- bounds before work ------------------------------------------------------------------------


@pytest.mark.parametrize("n", ["99999999999999999999999", "100001"])
def test_more_generated_questions_than_can_be_held(tmp_path, n):
    out = tmp_path / "out"
    refused("audit", *TINY, "--task", "arithmetic", "--n", n, "--k", "1", "--out", out, absent=(out,), says=("100000",))


def test_a_k_whose_vote_tables_cannot_fit_is_refused_with_the_largest_that_does(tmp_path):
    import re

    from rnr_interp.engine.sampling import RunSize, check_run_size

    out = tmp_path / "out"
    err = refused("audit", *TINY, "--task", "arithmetic", "--n", "2", "--k", "100000", "--out", out, absent=(out,),
                  says=("vote tables", "largest --k"))
    largest = int(re.search(r"largest --k that fits is (\d+)", err).group(1))
    size = lambda k: RunSize(2, votes=k, fixed_rows=1, rows_per_vote=1, max_new_tokens=24)  # noqa: E731
    check_run_size(size(largest), "--k")  # the value offered fits
    with pytest.raises(ValueError, match=f"largest --k that fits is {largest}"):
        check_run_size(size(largest + 1), "--k")
    # multiple choice: four answers at most, so the tables stay small and far more fits
    check_run_size(RunSize(2, votes=largest * 4, fixed_rows=1, rows_per_vote=1, max_new_tokens=24, n_answers=4), "--k")


def test_too_many_questions_for_the_records_names_the_largest_n():
    from rnr_interp.engine.sampling import RunSize, check_run_size

    gib = 2 ** 30
    with pytest.raises(ValueError, match=r"largest --n at this --k is (\d+)") as refusal:
        check_run_size(RunSize(10_000_000, votes=32, fixed_rows=1, rows_per_vote=1, max_new_tokens=256), "--k",
                       memory=16 * gib)
    most = int(refusal.value.args[0].rsplit(" ", 1)[1])
    check_run_size(RunSize(most, votes=32, fixed_rows=1, rows_per_vote=1, max_new_tokens=256), "--k", memory=16 * gib)


@pytest.mark.parametrize("space, budget, largest", [("skiponly", "8", "1"), ("native", "20", "19")])
def test_a_route_budget_beyond_the_spaces_routes(tmp_path, space, budget, largest):
    out = tmp_path / "out"
    layers = "tiny-llama:2" if space == "skiponly" else "tiny-llama"
    refused("route", "--model", layers, "--quiet", "--task", "arithmetic", "--n", "1", "--k", budget, "--space", space,
            "--methods", "random", "--out", out, absent=(out,), says=(f"largest budget that works is {largest}",))


def test_route_space_sizes_count_what_enumeration_yields():
    from rnr_interp.analyses.routing.spaces import SPACES, make_space, space_size

    for name in SPACES:
        for layers in range(1, 7):
            space = make_space(name, layers)
            assert space_size(space) == sum(1 for _ in space.iter_routes()), (name, layers)
    assert space_size(make_space("polar", 30)) > 10 ** 15  # counted, not enumerated


def test_deeply_nested_json(tmp_path, run_copy):
    deep = "[" * 100_000 + "]" * 100_000
    data = tmp_path / "deep.jsonl"
    data.write_text(json.dumps(JSONL_ROWS[0]) + "\n" + deep + "\n")
    out = tmp_path / "out"
    refused("audit", *TINY, "--task", "jsonl", "--data", data, "--k", "1", "--out", out, absent=(out,),
            says=("deep.jsonl:2", "nested deeper"))
    manifest = (run_copy / "manifest.json").read_text()
    (run_copy / "manifest.json").write_text('{"config": ' + "[" * 150 + "]" * 150 + ', "config_hash": "x"}')
    refused("pass-at-k", run_copy, intact=(run_copy,), says=("manifest.json", "nested deeper"))
    (run_copy / "manifest.json").write_text(manifest)
    (run_copy / "summary.json").write_text(deep)
    refused("report", run_copy, intact=(run_copy,), says=("nested deeper",))


def test_batched_generation_is_held_against_the_models_device():
    from rnr_interp.engine.sampling import RunSize, check_run_size

    gib = 2 ** 30
    # 8 questions x (1 + 1000) rows of 20 MB: 157 GiB at once
    big = dict(n_questions=8, votes=1000, fixed_rows=1, rows_per_vote=1, max_new_tokens=256, n_answers=4,
               batch_rows=(8, 8), row_bytes=20 * 2 ** 20)
    with pytest.raises(ValueError, match="batched generation 156.4 GiB.*largest --k that fits is 654"):
        check_run_size(RunSize(**big), "--k", memory=128 * gib)
    # on a GPU of 200 GiB the rows are the GPU's to hold, the machine keeps the rest
    check_run_size(RunSize(**big, device_bytes=200 * gib), "--k", memory=16 * gib)
    with pytest.raises(ValueError, match="on the model's device"):
        check_run_size(RunSize(**big, device_bytes=100 * gib), "--k", memory=16 * gib)
