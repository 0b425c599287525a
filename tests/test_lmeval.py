"""lm-eval tasks (`--task lm-eval:NAME`, `--task-config`) against lm-eval itself, and
invalid rows (`--on-invalid`).

lm-eval 0.4.13 is installed by `make setup` with --no-deps; its `lm_eval.api.task`
imports `sacrebleu` (for BLEU metrics these tests never call), which a venv set up
before `make setup` installed it lacks, so the comparison tests put an empty module in its place
(only when it is missing) before importing lm-eval's
ConfigurableTask and HFLM. lm-eval runs offline here: its task's `download` is
replaced by the same `save_to_disk` data we read, and HFLM scores a plain Hugging
Face model given as an object (no hub access).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rnr_interp.cli import app
from rnr_interp.tasks import LmEvalGenerationTask, LmEvalMCTask, load_task
from rnr_interp.tasks.base import DataFormatError
from rnr_interp.tasks.lmeval import find_task_yaml

datasets = pytest.importorskip("datasets")
pytest.importorskip("lm_eval")


def _lm_eval_task_module():
    sys.modules.setdefault("sacrebleu", types.ModuleType("sacrebleu"))  # see the module docstring
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    return ConfigurableTask, load_yaml


def lm_eval_own_task(name: str, folder: Path, keep_splits: bool = False):
    """lm-eval's own ConfigurableTask for `name`, its dataset read from `folder` (every
    split the same rows, or with `keep_splits` the folder's own splits)."""
    ConfigurableTask, load_yaml = _lm_eval_task_module()
    config = load_yaml(find_task_yaml(name))
    for key in ("tag", "group"):
        config.pop(key, None)
    # both readouts compared, whichever the YAML reports (boolq's lists acc only)
    config["metric_list"] = [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc", "acc_norm")]

    class Offline(ConfigurableTask):
        def download(self, dataset_kwargs=None, **kwargs):
            if keep_splits:
                self.dataset = datasets.load_from_disk(str(folder))
                return
            split = datasets.load_from_disk(str(folder))
            split = split[next(iter(split))] if isinstance(split, datasets.DatasetDict) else split
            # every split the task might name is the same rows (no few-shot is drawn at 0 shots)
            self.dataset = datasets.DatasetDict({s: split for s in ("train", "validation", "test", "dev")})

    return Offline(config=config)


# -- data in the Hugging Face layout lm-eval's YAMLs read ------------------------------------


def save(rows: list[dict], folder: Path, split: str = "test") -> Path:
    datasets.DatasetDict({split: datasets.Dataset.from_list(rows)}).save_to_disk(str(folder))
    return folder


def arc_rows(shared: Path, n: int) -> list[dict]:
    """The first n ARC-Easy questions of the original file, in the Hub's layout."""
    rows = []
    with open(shared / "arc" / "ARC-Easy-Test.jsonl") as f:
        for line in list(f)[:n]:
            o = json.loads(line)
            q = o["question"]
            rows.append({"id": o["id"], "question": q["stem"], "answerKey": o["answerKey"],
                         "choices": {"text": [c["text"] for c in q["choices"]], "label": [c["label"] for c in q["choices"]]}})
    return rows


def piqa_rows(shared: Path, n: int) -> list[dict]:
    labels = (shared / "piqa" / "valid-labels.lst").read_text().split()
    with open(shared / "piqa" / "valid.jsonl") as f:
        return [{**json.loads(line), "label": int(labels[i])} for i, line in enumerate(list(f)[:n])]


def boolq_rows(shared: Path, n: int) -> list[dict]:
    """super_glue/boolq's layout (lm-eval's boolq): label 1 for yes."""
    with open(shared / "boolq" / "validation.jsonl") as f:
        return [{"question": o["question"], "passage": o["passage"], "idx": i, "label": int(o["answer"])}
                for i, o in enumerate(json.loads(line) for line in list(f)[:n])]


COMMONSENSE_QA = [
    {"id": f"c{i}", "question": q, "question_concept": "x", "answerKey": key,
     "choices": {"label": list("ABCDE"), "text": texts}}
    for i, (q, texts, key) in enumerate([
        ("Where would you put a plate after washing it?", ["cupboard", "floor", "oven", "bath", "car"], "A"),
        ("What do people do when tired?", ["run", "sleep", "sing", "swim", "shout"], "B"),
        ("What grows on trees?", ["rocks", "cars", "leaves", "fish", "glass"], "C"),
    ])
]
HELLASWAG = [  # the columns lm-eval's hellaswag utils.process_docs reads
    {"ind": i, "activity_label": "Baking", "ctx_a": a, "ctx_b": b, "ctx": f"{a} {b}", "endings": endings,
     "source_id": "s", "split": "val", "split_type": "indomain", "label": str(label)}
    for i, (a, b, endings, label) in enumerate([
        ("A man pours flour into a bowl.", "he", ["adds eggs [title] and stirs.", "drives away.", "sleeps.", "sings."], 0),
        ("A woman kneads dough.", "she", ["flies.", "shapes it into a loaf.", "swims.", "reads."], 1),
    ])
]


OPENBOOKQA = [  # a column as doc_to_text; the ARC loader cannot read these field names
    {"id": "o1", "question_stem": "Plants need", "answerKey": "B",
     "choices": {"text": ["rocks", "sunlight", "plastic", "noise"], "label": list("ABCD")}},
    {"id": "o2", "question_stem": "Ice is", "answerKey": " A",
     "choices": {"text": ["frozen water", "hot", "a gas", "a metal"], "label": list("ABCD")}},
]
MMLU = [  # included base file, description, letters as choices, an integer target column
    {"question": "Which bone is in the arm? ", "subject": "anatomy", "choices": ["femur", "humerus", "tibia", "fibula"], "answer": 1},
    {"question": "The heart has how many chambers?", "subject": "anatomy", "choices": ["2", "3", "4", "5"], "answer": 2},
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, shared_data) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lmeval")
    return {
        "arc_easy": save(arc_rows(shared_data, 6), root / "arc_easy"),
        "piqa": save(piqa_rows(shared_data, 6), root / "piqa", "validation"),
        "boolq": save(boolq_rows(shared_data, 6), root / "boolq", "validation"),
        "commonsense_qa": save(COMMONSENSE_QA, root / "commonsense_qa", "validation"),
        "hellaswag": save(HELLASWAG, root / "hellaswag", "validation"),
        "openbookqa": save(OPENBOOKQA, root / "openbookqa"),
        "mmlu_anatomy": save(MMLU, root / "mmlu_anatomy"),
    }


@pytest.mark.parametrize("name", ["arc_easy", "piqa", "boolq", "commonsense_qa", "hellaswag", "openbookqa", "mmlu_anatomy"])
def test_requests_and_golds_equal_lm_evals_own_task(name, folders):
    """The (context, continuation) requests and the gold of every question, as lm-eval's
    own ConfigurableTask builds them at zero shots (hellaswag through lm-eval's own
    `!function utils.process_docs`)."""
    ours = load_task(f"lm-eval:{name}", data=folders[name])
    theirs = lm_eval_own_task(name, folders[name])
    docs = list(theirs.test_docs() if theirs.has_test_docs() and theirs.config.test_split else theirs.validation_docs())
    assert isinstance(ours, LmEvalMCTask) and len(ours) == len(docs)
    for q, doc in zip(ours.questions, docs):
        ctx = theirs.fewshot_context(doc, 0)
        requests = [r.args for r in theirs.construct_requests(doc, ctx, metadata=(name, 0, 1))]
        assert ours.loglikelihood_requests(q) == requests
        assert q.gold_index == theirs.doc_to_target(doc) if isinstance(theirs.doc_to_target(doc), int) else \
            q.choices[q.gold_index] == theirs.doc_to_target(doc)


@pytest.mark.slow
def test_recognition_choice_equals_lm_evals_acc_and_acc_norm(smollm2, folders):
    """On the demo model and three tasks, the lm-eval readout's choice per question (the
    option ranked first by lm-eval:acc and by lm-eval:acc_norm) is the one lm-eval's own
    HFLM + ConfigurableTask.process_results pick: each option g is tried as the gold, and
    lm-eval's acc is 1 exactly for its choice."""
    from transformers import AutoModelForCausalLM

    from rnr_interp.models import smollm2_dir
    from rnr_interp.analyses.localise.recognition import recognize

    _lm_eval_task_module()
    from lm_eval.models.huggingface import HFLM

    plain = AutoModelForCausalLM.from_pretrained(smollm2_dir()).eval()  # not the bridge: lm-eval's own forward
    hflm = HFLM(pretrained=plain, tokenizer=smollm2.tokenizer, batch_size=4, device="cpu")
    for name in ("arc_easy", "piqa", "boolq"):
        ours = load_task(f"lm-eval:{name}", data=folders[name], n=4)
        rows = recognize(smollm2, ours, ours.questions, variants=("lm-eval",))
        mine = {(r["question_id"], r["readout"]): r for r in rows}
        theirs = lm_eval_own_task(name, folders[name])
        docs = list(theirs.test_docs() if theirs.config.test_split else theirs.validation_docs())[:4]
        for q, doc in zip(ours.questions, docs):
            instances = theirs.construct_requests(doc, theirs.fewshot_context(doc, 0), metadata=(name, 0, 1))
            results = hflm.loglikelihood(instances, disable_tqdm=True)
            lls = [ll for ll, _ in results]
            assert mine[(q.id, "lm-eval:acc")]["scores"] == pytest.approx(lls, abs=2e-3)
            for metric in ("acc", "acc_norm"):
                assert mine[(q.id, f"lm-eval:{metric}")]["ranking"][0] == lm_evals_pick(theirs, doc, results, metric), \
                    (name, q.id, metric)


def lm_evals_pick(theirs, doc: dict, results: list, metric: str) -> int:
    """The option lm-eval's `process_results` picks under `metric` (acc, acc_norm):
    each option g is tried as the gold, and the metric is 1 exactly for its pick."""
    picked = []
    for g in range(len(results)):
        theirs.config.doc_to_target = g
        picked.append(theirs.process_results(doc, results)[metric])
    assert picked.count(1.0) == 1
    return picked.index(1.0)


def test_arc_and_lm_eval_arc_easy_read_the_same_questions(folders, shared_data, tmp_path):
    """`--task arc` on the original file and `--task lm-eval:arc_easy` on a save_to_disk
    folder of the same rows: the same ids, option texts in the same order, the same gold,
    and lm-eval's prompt is its template around the same stem. `rnr audit` runs both."""
    arc = load_task("arc_easy", data=shared_data / "arc" / "ARC-Easy-Test.jsonl", n=6)
    lm_eval_arc = load_task("lm-eval:arc_easy", data=folders["arc_easy"])
    for a, b in zip(arc.questions, lm_eval_arc.questions, strict=True):
        assert (a.id, a.choices, a.gold_index, a.answer) == (b.id, b.choices, b.gold_index, b.answer)
        assert b.text == f"Question: {a.text}\nAnswer:"
    runner = CliRunner()
    for spec, data, out in (("arc_easy", shared_data / "arc" / "ARC-Easy-Test.jsonl", tmp_path / "arc"),
                            ("lm-eval:arc_easy", folders["arc_easy"], tmp_path / "lm")):
        result = runner.invoke(app, ["audit", "--model", "tiny-llama:1", "--task", spec, "--data", str(data),
                                     "--n", "3", "--k", "1", "--out", str(out), "-q"])
        assert result.exit_code == 0, result.output
    from rnr_interp.records import RunDir

    ids = [RunDir(p).read_records().query("probe == 'deployed'")["question_id"].tolist() for p in (tmp_path / "arc", tmp_path / "lm")]
    assert ids[0] == ids[1] == [q.id for q in arc.questions[:3]]


def test_the_generation_prompt_letters_the_options_once(folders):
    arc = load_task("lm-eval:arc_easy", data=folders["arc_easy"], n=1)
    q = arc.questions[0]
    assert arc.user_message(q) == "\n\n".join([q.text, "\n".join(f"{l}. {c}" for l, c in zip("ABCDE", q.choices)), arc.instruction])
    mmlu = load_task("lm-eval:mmlu_anatomy", data=folders["mmlu_anatomy"], n=1)
    q = mmlu.questions[0]
    assert q.choices == ("A", "B", "C", "D") and q.answer == "B"
    assert q.text.startswith("The following are multiple choice questions (with answers) about anatomy.\n\nWhich bone")
    assert mmlu.user_message(q) == q.text.strip() + "\n\n" + mmlu.instruction  # doc_to_text lists the options already


def test_generate_until_task_reads_both_filters_and_grades_like_lm_eval(shared_data):
    task = load_task("lm-eval:gsm8k", data=shared_data / "gsm8k" / "test.jsonl", n=2)
    assert isinstance(task, LmEvalGenerationTask)
    q = task.questions[0]
    assert q.text.startswith("Question: Janet") and q.text.endswith("\nAnswer:") and q.answer.endswith("#### 18")
    assert task.stop_strings == ("Question:", "</s>", "<|im_end|>") and task.max_new_tokens == 256
    assert task.user_message(q) == q.text
    marked, loose = "9 eggs at $2 makes 18.\n#### 18", "She makes $18 a day, i.e. 18."
    assert task.extractions(marked) == {"strict-match": "18", "flexible-extract": "18"}
    assert task.extractions(loose) == {"strict-match": None, "flexible-extract": "18."}
    # exact_match with gsm8k's regexes_to_ignore strips the gold's "... #### " and the trailing "."
    assert task.grade_filtered("18", q) and task.grade_filtered("18.", q) and not task.grade_filtered("17", q)
    # records hold the flexible reading; the strict grading reads strict-match
    assert task.extract(loose) == "18." and task.grade(task.extract(loose), q)
    assert task.extract_strict(loose) is None and task.read_answer_strict(loose, q, finished=True) is None
    assert task.read_answer_strict(marked, q, finished=False) == "18"


def test_lm_eval_task_reloads_from_what_its_run_stored(folders, tmp_path):
    from rnr_interp.records import RunDir
    from rnr_interp.tasks import reload_task

    task = load_task("lm-eval:commonsense_qa", data=folders["commonsense_qa"])
    RunDir.create(tmp_path / "run", {"kind": "audit", "task": task.run_description()}).release()
    again = reload_task(RunDir(tmp_path / "run").config["task"])
    assert again.content_hash() == task.content_hash() and again.name == "lm-eval:commonsense_qa"
    assert type(again) is type(task) and again.config == task.config
    with pytest.raises(ValueError, match="stored no questions"):  # a description alone: its YAML is not read again
        reload_task(task.describe())


# -- bad input: one line naming the file and the problem, exit 2, nothing written ---------


def _refused(args: list[str], out: Path) -> str:
    result = CliRunner().invoke(app, ["audit", "--model", "tiny-llama:1", *args, "--n", "2", "--k", "1", "--out", str(out), "-q"])
    assert result.exit_code == 2, result.output
    assert not out.exists()
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return path


MINE = """task: mine
output_type: multiple_choice
test_split: test
doc_to_text: "Q: {{question}}\\nA:"
doc_to_choice: "{{options}}"
doc_to_target: "{{gold}}"
"""


def _mine_data(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD = [{"id": "a", "question": "1+1?", "options": ["2", "3"], "gold": 0},
        {"id": "b", "question": "2+2?", "options": ["5", "4"], "gold": 1}]


def test_bad_task_configs_and_rows_are_one_line_naming_the_file(tmp_path, folders):
    data = _mine_data(tmp_path, GOOD)
    line = _refused(["--task-config", str(_config(tmp_path, MINE + "doc_to_text: [oops\n")), "--data", str(data)], tmp_path / "o1")
    assert "mine.yaml:" in line and "not valid YAML" in line
    scored = MINE.replace("multiple_choice", "generate_until") + "process_results: !function utils.score\n"
    line = _refused(["--task-config", str(_config(tmp_path, scored)), "--data", str(data)], tmp_path / "o6")
    assert "mine.yaml: process_results: a generation task with its own scoring code is not supported" in line
    line = _refused(["--task", "lm-eval:arc_eazy", "--data", str(folders["arc_easy"])], tmp_path / "o2")
    assert "unknown lm-eval task 'arc_eazy'" in line and "arc_easy" in line and "lm_eval/tasks" in line
    # lm-eval's own index tells a group (its YAML named) and a tag from a task
    line = _refused(["--task", "lm-eval:mmlu", "--data", str(folders["arc_easy"])], tmp_path / "o7")
    assert "_mmlu.yaml:" in line and "lm-eval group 'mmlu' names several tasks, not one" in line
    line = _refused(["--task", "lm-eval:ai2_arc", "--data", str(folders["arc_easy"])], tmp_path / "o8")
    assert "lm-eval tag 'ai2_arc' names several tasks, not one" in line
    python_task = MINE + "class: !function utils.MyTask\n"
    line = _refused(["--task-config", str(_config(tmp_path, python_task)), "--data", str(data)], tmp_path / "o9")
    assert "mine.yaml: a task written as a Python class (class:)" in line
    missing = MINE.replace("{{question}}", "{{stem}}")
    line = _refused(["--task-config", str(_config(tmp_path, missing)), "--data", str(data)], tmp_path / "o3")
    assert f"{data}:1:" in line and "doc_to_text of mine.yaml" in line and "'stem' is undefined" in line
    outside = _mine_data(tmp_path, [GOOD[0], {**GOOD[1], "gold": 5}])
    line = _refused(["--task-config", str(_config(tmp_path, MINE)), "--data", str(outside)], tmp_path / "o4")
    assert f"{outside}:2:" in line and "target index 5 is outside the 2 choices" in line
    code = MINE + "process_docs: !function helpers.clean\n"
    (tmp_path / "helpers.py").write_text("raise SystemExit('user code ran')\n")
    line = _refused(["--task-config", str(_config(tmp_path, code)), "--data", str(data)], tmp_path / "o5")
    assert "mine.yaml" in line and "!function helpers.clean would run Python code" in line


def test_include_of_a_base_file(tmp_path):
    (tmp_path / "base.yaml").write_text(MINE.replace("task: mine\n", "") + "target_delimiter: '|'\n")
    path = _config(tmp_path, "include: base.yaml\ntask: derived\ndoc_to_text: 'Question {{question}}'\n")
    task = load_task("ignored", task_config=path, data=_mine_data(tmp_path, GOOD))
    assert task.name == "lm-eval:derived" and task.questions[0].text == "Question 1+1?"
    assert task.loglikelihood_requests(task.questions[0]) == [("Question 1+1?", "|2"), ("Question 1+1?", "|3")]


def test_skip_drops_invalid_rows_into_manifest_and_summary(tmp_path):
    rows = [GOOD[0], {"id": "twin", "question": "x?", "options": ["same", "same"], "gold": 0},
            {"id": "far", "question": "y?", "options": ["p", "q"], "gold": "r"}, GOOD[1]]
    data, config = _mine_data(tmp_path, rows), _config(tmp_path, MINE)
    with pytest.raises(DataFormatError, match="ambiguous gold"):
        load_task("x", task_config=config, data=data)
    task = load_task("x", task_config=config, data=data, on_invalid="skip")
    assert [q.id for q in task.questions] == ["a", "b"]
    assert [(s["row"], s["id"]) for s in task.skipped_rows] == [(2, "twin"), (3, "far")]
    (tmp_path / "kept").mkdir()
    kept = load_task("x", task_config=config, data=_mine_data(tmp_path / "kept", [GOOD[0], GOOD[1]]))
    assert task.content_hash() == kept.content_hash()  # the hash covers what was kept
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["audit", "--model", "tiny-llama:1", "--task-config", str(config), "--data", str(data),
                                      "--on-invalid", "skip", "--k", "1", "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert "skipped 2 invalid row(s)" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped_rows"] == manifest["config"]["task"]["skipped_rows"] == [
        {"row": 2, "id": "twin", "reason": "ambiguous gold: option A (the gold) and option B have the same text 'same'"},
        {"row": 3, "id": "far", "reason": "target 'r' is not one of the choices ['p', 'q']"}]


def test_skip_applies_to_the_built_in_formats_too(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "ok?", "answer": 1}\n{"prompt": "", "answer": 2}\n{"prompt": "fine", "answer": 3}\n')
    with pytest.raises(DataFormatError, match="mine.jsonl:2: field 'prompt' is empty"):
        load_task("jsonl", data=path)
    task = load_task("jsonl", data=path, on_invalid="skip")
    assert [q.id for q in task.questions] == ["1", "3"] and task.skipped_rows[0]["row"] == 2


def test_context_fit_is_checked_for_the_asked_questions_only(tmp_path):
    rows = GOOD + [{"id": "long", "question": "x" * 5000, "options": ["a", "b"], "gold": 0}]
    data, config = _mine_data(tmp_path, rows), _config(tmp_path, MINE)
    args = ["audit", "--model", "tiny-llama:1", "--task-config", str(config), "--data", str(data), "--k", "1", "-q"]
    asked = CliRunner().invoke(app, [*args, "--n", "2", "--out", str(tmp_path / "ok")])
    assert asked.exit_code == 0, asked.output
    refused = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "no")])
    assert refused.exit_code == 2 and "question 'long'" in refused.output and not (tmp_path / "no").exists()


# -- few-shot, as lm-eval builds it ------------------------------------------------------


@pytest.fixture(scope="module")
def fewshot_folders(tmp_path_factory, shared_data) -> dict[str, Path]:
    """Folders with a question split and a separate few-shot split (the shared data has
    no train files: later rows of the same file serve as the examples' pool)."""
    root = tmp_path_factory.mktemp("fewshot")

    def splits(rows: list[dict], folder: Path, asked: str, pool: str) -> Path:
        datasets.DatasetDict({asked: datasets.Dataset.from_list(rows[:6]),
                              pool: datasets.Dataset.from_list(rows[6:])}).save_to_disk(str(folder))
        return folder

    with open(shared_data / "gsm8k" / "test.jsonl") as f:
        gsm8k = [json.loads(line) for line in list(f)[:20]]
    return {"arc_easy": splits(arc_rows(shared_data, 40), root / "arc_easy", "test", "train"),
            "piqa": splits(piqa_rows(shared_data, 30), root / "piqa", "validation", "train"),
            "gsm8k": splits(gsm8k, root / "gsm8k", "test", "train")}


@pytest.mark.parametrize("name,shots,seed", [("arc_easy", 3, 1234), ("arc_easy", 25, 7), ("piqa", 2, 1234), ("gsm8k", 5, 1234)])
def test_fewshot_context_equals_lm_evals_own(name, shots, seed, fewshot_folders):
    """Each question's prompt, examples included, is lm-eval's `fewshot_context` for
    that doc with the same seed, questions drawn in order; multiple-choice requests are
    its `construct_requests`."""
    ours = load_task(f"lm-eval:{name}", data=fewshot_folders[name], num_fewshot=shots, fewshot_seed=seed)
    theirs = lm_eval_own_task(name, fewshot_folders[name], keep_splits=True)
    theirs.set_fewshot_seed(seed)
    docs = list(theirs.test_docs() if theirs.config.test_split else theirs.validation_docs())
    assert len(ours) == len(docs) == 6
    for q, doc in zip(ours.questions, docs):
        ctx = theirs.fewshot_context(doc, shots)
        assert q.text == ctx and q.text.count("Question:") == shots + 1
        if isinstance(ours, LmEvalMCTask):
            assert ours.loglikelihood_requests(q) == [r.args for r in theirs.construct_requests(doc, ctx, metadata=(name, 0, 1))]
    described = ours.describe()["lm_eval"]
    assert (described["num_fewshot"], described["fewshot_seed"], described["fewshot_sampler"]) == (shots, seed, "default")
    assert described["fewshot_split"] == "train" and described["yaml_num_fewshot"] == (5 if name == "gsm8k" else 0)


def test_first_n_sampler_and_a_question_kept_out_of_its_own_examples(tmp_path):
    """`fewshot_config.sampler: first_n` takes the pool's first rows in order; when the
    examples come from the questions' own split, a question is never its own example."""
    rows = [{"id": f"r{i}", "question": f"q{i}?", "options": ["yes", "no"], "gold": i % 2} for i in range(5)]
    data = _mine_data(tmp_path, rows)
    folder = tmp_path / "dd"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(folder))
    own_split = MINE + "fewshot_split: test\n"
    config = _config(tmp_path, own_split + "fewshot_config:\n  sampler: first_n\n")
    task = load_task("mine", task_config=config, data=folder, num_fewshot=2)
    assert task.questions[0].text == "Q: q1?\nA: no\n\nQ: q2?\nA: yes\n\nQ: q0?\nA:"  # r0 left out of its own examples
    assert task.questions[3].text == "Q: q0?\nA: yes\n\nQ: q1?\nA: no\n\nQ: q3?\nA:"
    shuffled = load_task("mine", task_config=_config(tmp_path, own_split), data=folder, num_fewshot=4)
    for q in shuffled.questions:
        assert q.text.count("?") == 5 and q.text.count(q.text.rsplit("\n\n", 1)[-1]) == 1
    with pytest.raises(DataFormatError, match="one split"):
        load_task("mine", task_config=config, data=data, num_fewshot=1)
    # copies of a question in its own split leave too few other rows: lm-eval's sampler refuses, in one line
    twins = tmp_path / "twins"
    datasets.DatasetDict({"test": datasets.Dataset.from_list([rows[0], rows[0], rows[1]])}).save_to_disk(str(twins))
    for sampler in ("first_n", "default"):
        config = _config(tmp_path, own_split + f"fewshot_config:\n  sampler: {sampler}\n")
        with pytest.raises(DataFormatError, match="has fewer other rows than that beside a question"):
            load_task("mine", task_config=config, data=twins, num_fewshot=2)


def test_bad_fewshot_options_are_one_line(tmp_path, fewshot_folders):
    folder = fewshot_folders["arc_easy"]
    for kw, problem in (({"num_fewshot": -1}, "num_fewshot must be a whole number >= 0"),
                        ({"num_fewshot": 1, "fewshot_seed": "x"}, "seed must be a whole number"),
                        ({"num_fewshot": 1, "fewshot_split": "dev"}, "no few-shot split 'dev'"),
                        ({"num_fewshot": 40}, "has only 34 rows")):
        with pytest.raises((ValueError, DataFormatError), match=problem):
            load_task("lm-eval:arc_easy", data=folder, **kw)
    samples = _config(tmp_path, MINE + "fewshot_config:\n  samples: [{question: a}]\n")
    with pytest.raises(DataFormatError, match="fewshot_config.samples is not supported"):
        load_task("mine", task_config=samples, data=folder, num_fewshot=1)


def test_audit_records_the_fewshot_settings_and_refuses_bad_ones(tmp_path):
    """`rnr audit --num-fewshot` asks lm-eval's few-shot prompts and records the settings
    in the manifest; a bad value is one line."""
    rows = [{"id": f"r{i}", "question": f"q{i}?", "options": ["yes", "no"], "gold": i % 2} for i in range(8)]
    folder = tmp_path / "dd"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows[:3]),
                          "train": datasets.Dataset.from_list(rows[3:])}).save_to_disk(str(folder))
    config = str(_config(tmp_path, MINE + "training_split: train\n"))
    args = ["--task-config", config, "--data", str(folder), "--max-new-tokens", "4"]
    result = CliRunner().invoke(app, ["audit", "--model", "tiny-llama:1", *args, "--n", "2", "--k", "2", "--quiet",
                                      "--num-fewshot", "3", "--fewshot-seed", "5", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    recorded = manifest["config"]["task"]["lm_eval"]
    assert (recorded["num_fewshot"], recorded["fewshot_seed"], recorded["fewshot_split"]) == (3, 5, "train")
    from rnr_interp.models import USER_SLOT

    assert not recorded["apply_chat_template"] and manifest["config"]["prompt_format"]["template"] == USER_SLOT  # raw
    for extra, problem in ((["--num-fewshot", "-2"], "num_fewshot must be a whole number >= 0"),
                           (["--num-fewshot", "6"], "has only 5 rows"),
                           (["--num-fewshot", "1", "--fewshot-split", "dev"], "no few-shot split 'dev'")):
        assert problem in _refused([*args, *extra], tmp_path / "bad")
    for option in (["--num-fewshot", "2"], ["--apply-chat-template"]):
        assert "applies to lm-eval tasks only" in _refused(["--task", "arithmetic", *option], tmp_path / "bad")


@pytest.mark.parametrize("shots", [0, 3])
def test_generation_prompt_equals_lm_evals_raw_and_through_the_chat_template(shots, tmp_path):
    """The prompt text a command asks (`load_inputs`, then the model's `render`) is
    lm-eval's `fewshot_context` for the doc: raw by default, and with
    --apply-chat-template the one lm-eval's own HFLM renders with the model's chat
    template (gsm8k's YAML over short rows, to fit the tiny model's context)."""
    from rnr_interp import notebook
    from rnr_interp.commands.common import load_inputs

    _lm_eval_task_module()
    from lm_eval.models.huggingface import HFLM

    rows = [{"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
            for a, b in zip(range(2, 12), range(7, 17))]
    folder = tmp_path / "gsm8k"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows[:4]),
                          "train": datasets.Dataset.from_list(rows[4:])}).save_to_disk(str(folder))
    theirs = lm_eval_own_task("gsm8k", folder, keep_splits=True)
    docs = list(theirs.test_docs())
    for chat in (False, True):
        theirs.set_fewshot_seed(1234)
        options = {"num_fewshot": shots, "fewshot_split": None, "fewshot_seed": 1234, "apply_chat_template": chat}
        lm, task = load_inputs("tiny-llama:1", "lm-eval:gsm8k", folder, None, max_new_tokens=8, lm_eval=options)
        assert (lm.prompt_override is None) == chat and task.describe()["lm_eval"]["apply_chat_template"] == chat
        notebook_lm, _ = notebook.inputs("tiny-llama:1", task, None, None, max_new_tokens=8)  # rnr.audit(...) asks alike
        assert notebook_lm.prompt_override == lm.prompt_override
        hflm = HFLM(pretrained=lm.hf_model, tokenizer=lm.tokenizer, device="cpu", batch_size=1)
        for q, doc in zip(task.questions, docs, strict=True):
            expected = theirs.fewshot_context(doc, shots, apply_chat_template=chat,
                                              chat_template=hflm.apply_chat_template if chat else None)
            assert lm.render(task.user_message(q)) == expected
            assert expected.count("Question:") == shots + 1 and ("<|im_start|>" in expected) == chat


@pytest.mark.slow
def test_fewshot_recognition_choice_equals_lm_evals_on_40_questions(smollm2, shared_data, tmp_path):
    """With 3 examples per question, on the first 40 questions of ARC-Easy and PIQA, the
    option lm-eval's own HFLM and process_results pick under acc and under acc_norm is
    the one our lm-eval readouts rank first, question by question (the examples come from
    the next 100 rows of the same file, saved as the task's few-shot split)."""
    from transformers import AutoModelForCausalLM

    from rnr_interp.analyses.localise.recognition import recognize
    from rnr_interp.models import smollm2_dir

    _lm_eval_task_module()
    from lm_eval.models.huggingface import HFLM

    plain = AutoModelForCausalLM.from_pretrained(smollm2_dir()).eval()
    hflm = HFLM(pretrained=plain, tokenizer=smollm2.tokenizer, batch_size=8, device="cpu")
    agree: dict[tuple[str, str], int] = {}
    for name, rows, asked in (("arc_easy", arc_rows(shared_data, 140), "test"), ("piqa", piqa_rows(shared_data, 140), "validation")):
        folder = tmp_path / name
        datasets.DatasetDict({asked: datasets.Dataset.from_list(rows[:40]),
                              "train": datasets.Dataset.from_list(rows[40:])}).save_to_disk(str(folder))
        ours = load_task(f"lm-eval:{name}", data=folder, num_fewshot=3)
        rows_out = recognize(smollm2, ours, ours.questions, variants=("lm-eval",))
        mine = {(r["question_id"], r["readout"]): r for r in rows_out}
        theirs = lm_eval_own_task(name, folder, keep_splits=True)
        theirs.set_fewshot_seed(1234)
        docs = list(theirs.test_docs() if theirs.config.test_split else theirs.validation_docs())
        assert len(docs) == len(ours) == 40
        for q, doc in zip(ours.questions, docs):
            ctx = theirs.fewshot_context(doc, 3)
            assert q.text == ctx
            results = hflm.loglikelihood(theirs.construct_requests(doc, ctx, metadata=(name, 0, 1)), disable_tqdm=True)
            for metric in ("acc", "acc_norm"):
                same = mine[(q.id, f"lm-eval:{metric}")]["ranking"][0] == lm_evals_pick(theirs, doc, results, metric)
                agree[(name, metric)] = agree.get((name, metric), 0) + same
    print("per-question agreement with lm-eval's HFLM, 3-shot, of 40:", agree)
    assert all(n == 40 for n in agree.values()), agree
