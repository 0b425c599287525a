"""Tasks by name: `load_task("gsm8k")`, `load_task("jsonl", data="mine.jsonl")`.

File-based tasks read their benchmark file from `data`, or, when none is given, from
the default file under `../shared/data/` (relative to the working directory, then to
the repository). `data` may also be a Hugging Face `save_to_disk` folder or Arrow file
of a benchmark with a Hub mapping (`hf.SPECS`). Synthetic tasks take their generator's keywords (seed, digits, ...).
`lm-eval:NAME` is the installed lm-eval-harness task NAME, and `task_config=FILE.yaml`
a task config of your own in lm-eval's format (`lmeval`); their `data` may be a
`save_to_disk` folder, an Arrow, JSONL, JSON or Parquet file.
`on_invalid="skip"` drops each row that does not parse (listed in `Task.skipped_rows`)
instead of refusing the file.
`answer` conventions: multiple-choice tasks hold the gold option's LETTER (by position)
and `gold_index`; BoolQ holds "yes"/"no"; numeric tasks a canonical number string.
"""

from __future__ import annotations

import dataclasses

from pathlib import Path
from typing import Any, Callable

from rnr_interp.records import read_json_file

from .arc import ARC, load_arc
from .base import LETTERS, DataFormatError, MultipleChoiceTask, Question, Task, rotate_options
from .boolq import BoolQ, load_boolq
from .gsm8k import GSM8K, load_gsm8k
from .hellaswag import HellaSwag, load_hellaswag
from .hf import SPECS as HF_SPECS
from .hf import HFLoadError, load_hf, load_hf_disk
from ._io import ON_INVALID, checked_data_file, collecting_invalid_rows
from .jsonl import JsonlMCTask, JsonlNumberTask, JsonlTask, load_jsonl
from .lmeval import PREFIX as LM_EVAL_PREFIX
from .lmeval import LmEvalGenerationTask, LmEvalMCTask, load_lm_eval, stored_lm_eval_task
from .logiqa import LogiQA, load_logiqa
from .piqa import PIQA, load_piqa
from .synthetic import Arithmetic, ArithmeticMC, Copy, arithmetic, arithmetic_mc, copy_numbers, parse_source

# name -> (loader taking a path, default file under shared/data or None)
_FILE_TASKS: dict[str, tuple[Callable[..., Task], str | None]] = {
    "gsm8k": (load_gsm8k, "gsm8k/test.jsonl"),
    "arc": (load_arc, "arc/ARC-Challenge-Test.jsonl"),
    "arc_challenge": (load_arc, "arc/ARC-Challenge-Test.jsonl"),
    "arc_easy": (load_arc, "arc/ARC-Easy-Test.jsonl"),
    "piqa": (load_piqa, "piqa/valid.jsonl"),
    "boolq": (load_boolq, "boolq/validation.jsonl"),
    "logiqa": (load_logiqa, "logiqa/Test.txt"),
    "hellaswag": (load_hellaswag, "hellaswag/hellaswag_val_full.txt.bz2"),
    "jsonl": (load_jsonl, None),
}
_SYNTHETIC: dict[str, Callable[..., Task]] = {"arithmetic": arithmetic, "arithmetic_mc": arithmetic_mc, "copy": copy_numbers}
#: the most questions a synthetic task generates: ten times the largest benchmark read
#: here (HellaSwag, 10,042), about 100 MB of questions; more would only fill memory
MAX_GENERATED = 100_000
TASKS: tuple[str, ...] = tuple(_FILE_TASKS) + tuple(_SYNTHETIC)


def shared_data_dirs() -> list[Path]:
    """Where default benchmark files are looked for, first match wins."""
    repo = Path(__file__).resolve().parents[2]
    return [Path.cwd().parent / "shared" / "data", repo.parent / "shared" / "data"]


def default_data_path(name: str) -> Path:
    """The default file of file-based task `name`, or FileNotFoundError saying what to pass."""
    rel = _FILE_TASKS[name][1]
    if rel is None:
        raise FileNotFoundError(f"task {name!r} has no default file: pass --data PATH")
    dirs = shared_data_dirs()
    for d in dirs:
        if (d / rel).is_file():
            return d / rel
    tried = ", ".join(str(d / rel) for d in dict.fromkeys(dirs))
    raise FileNotFoundError(f"task {name!r}: default file {rel} not found (tried {tried}); pass --data PATH")


#: the options an lm-eval task takes (`load_lm_eval`'s few-shot settings)
LM_EVAL_OPTIONS = frozenset({"num_fewshot", "fewshot_split", "fewshot_seed", "apply_chat_template"})


def load_task(name: str, data: str | Path | None = None, n: int | None = None, *, on_invalid: str = "refuse",
              task_config: str | Path | None = None, **kw: Any) -> Task:
    """Task `name` (see TASKS, or `lm-eval:NAME`), or the lm-eval task config file
    `task_config` (then `name` is not used). `n` keeps the first n questions (synthetic
    tasks: generates n, default 200). `on_invalid` ("refuse" or "skip") decides what an
    invalid row of the data does; skipped rows are kept in `Task.skipped_rows`. `kw` goes
    to the loader or generator."""
    with collecting_invalid_rows(on_invalid) as skipped:
        task = _load_task(name, data, n, task_config, **kw)
    if skipped:
        task.skipped_rows = tuple(skipped)
    return task


def _load_task(name: str, data: str | Path | None, n: int | None, task_config: str | Path | None, **kw: Any) -> Task:
    if task_config is not None or name.startswith(LM_EVAL_PREFIX):
        if other := set(kw) - LM_EVAL_OPTIONS:
            raise ValueError(f"lm-eval tasks take no {', '.join(sorted(other))} option (the task config decides)")
        if task_config is not None:
            return load_lm_eval(config=task_config, data=data, **kw).head(n)
        return load_lm_eval(name.removeprefix(LM_EVAL_PREFIX), data=data, **kw).head(n)
    if "seed" in kw and name in _FILE_TASKS:
        raise ValueError(f"task {name!r} reads its questions from a file: a seed draws the questions of a generated "
                         f"task only ({', '.join(_SYNTHETIC)})")
    if name in _SYNTHETIC:
        if data is not None:
            raise ValueError(f"task {name!r} is generated, it reads no data file (got {data})")
        if n is not None and n > MAX_GENERATED:
            raise ValueError(f"task {name!r} generates at most {MAX_GENERATED} questions, asked for {n} "
                             f"(--n {MAX_GENERATED} is the largest that works)")
        return _SYNTHETIC[name](**kw) if n is None else _SYNTHETIC[name](n=n, **kw)
    if name not in _FILE_TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    path = Path(data) if data is not None else default_data_path(name)
    if path.is_dir() or path.suffix == ".arrow":
        # A Hugging Face `save_to_disk` folder, or one Arrow file of one.
        if name not in HF_SPECS:
            raise ValueError(f"task {name!r} reads its own file format, not a Hugging Face dataset ({path})")
        if not path.exists():
            raise FileNotFoundError(f"task {name!r}: data file {path} not found")
        return load_hf_disk(name, path, **kw).head(n)
    if not path.exists():
        raise FileNotFoundError(f"task {name!r}: data file {path} not found")
    return _FILE_TASKS[name][0](checked_data_file(path), **kw).head(n)


def reload_task(described: dict[str, Any]) -> Task:
    """The task a run manifest describes (`Task.describe()`), rebuilt: lm-eval tasks
    from the questions and settings the run stored (`stored_file`, set by `RunDir`: a
    task config is never rendered again from a run folder, its templates are the
    config's author's), synthetic tasks from the generator parameters in `source`, file
    tasks from the file it names (its first `n_questions`, the questions the run was given)."""
    name, source = described.get("name"), str(described.get("source") or "")
    on_invalid = "skip" if described.get("skipped_rows") else "refuse"
    if isinstance(described.get("anchored"), dict):
        return _reanchored(described)
    if isinstance(described.get("lm_eval"), dict):
        if not described.get("stored_file"):
            raise ValueError(f"the run stored no questions of {name} (it was made before runs stored them); its task "
                             "config is not rendered again from a run folder: rerun it to grade or show its questions")
        return _same_questions(stored_lm_eval_task(described, read_json_file(Path(described["stored_file"]))), described)
    if (synthetic := parse_source(source)) is not None:
        return _same_questions(load_task(name, **synthetic[1]), described)
    if source and Path(source).is_file():
        # A JSONL task is graded as the kind it was run as, whatever detection says now.
        kind = described.get("answer_kind")
        graded_as = {"answer_type": kind} if name == "jsonl" and kind in ("number", "text") else {}
        return _same_questions(load_task(name, data=source, n=described.get("n_questions"), on_invalid=on_invalid, **graded_as),
                               described)
    raise FileNotFoundError(f"task source {source or '?'} is not a file here")


def _reanchored(described: dict[str, Any]) -> Task:
    """An anchored task (`analyses.anchor`) rebuilt: the task it was anchored from, its
    questions (by id, texts unchanged) with the golds the run stored."""
    anchored = described["anchored"]
    if not described.get("stored_file"):
        raise ValueError(f"the run stored no questions of {described.get('name')}: an anchored task's golds are a "
                         "model's answers, kept only in the run's task file")
    original = reload_task({**{k: v for k, v in described.items() if k != "anchored"}, **{k: anchored[k] for k in ANCHORED_FROM}})
    by_id = {q.id: q for q in original.questions}
    stored = read_json_file(Path(described["stored_file"])).get("questions") or []
    questions = []
    for row in stored:
        q = by_id.get(str(row.get("id")))
        if q is None or q.text != row.get("text"):
            raise ValueError(f"the run's task file holds question {row.get('id')!r}, which {anchored['name']} does not ask")
        questions.append(with_gold(q, str(row.get("answer"))))
    return _same_questions(with_questions(original, questions, described["name"], described.get("source", ""), anchored),
                           described)


#: what an anchored task records of the task it was anchored from (`Task.describe()` keys)
ANCHORED_FROM = ("name", "source", "n_questions", "questions_hash")


def with_gold(q: Question, answer: str) -> Question:
    """`q` with `answer` as its gold, the task's own kept in ``meta["task_gold"]``."""
    return dataclasses.replace(q, answer=answer, meta={**q.meta, "task_gold": q.answer})


def with_questions(task: Task, questions: list[Question], name: str, source: str, anchored: dict[str, Any]) -> Task:
    """A copy of `task` (`Task.head`'s) asking `questions` under `name`, anchored as `anchored` says."""
    clone = task.head(len(task))
    clone.questions, clone.name, clone.source, clone.anchored = list(questions), name, source, anchored
    return clone


def _same_questions(task: Task, described: dict[str, Any]) -> Task:
    """`task`, when its questions are the ones `described` was run on (its
    `questions_hash`, where the description has one): a file edited since, or another
    file at the path, is refused rather than shown or graded as the run's."""
    stored = described.get("questions_hash")
    if stored is not None and task.content_hash() != stored:
        raise ValueError(f"task source {described.get('source')} no longer holds the run's questions "
                         f"(task.questions_hash {task.content_hash()} here, {stored} in the run)")
    return task


__all__ = [
    "ARC", "GSM8K", "LETTERS", "PIQA", "TASKS", "Arithmetic", "ArithmeticMC", "BoolQ",
    "DataFormatError", "HFLoadError", "HellaSwag", "JsonlMCTask", "JsonlNumberTask", "JsonlTask", "LM_EVAL_PREFIX",
    "LmEvalGenerationTask", "LmEvalMCTask", "LogiQA", "ON_INVALID",
    "MultipleChoiceTask", "Question", "Task", "arithmetic", "arithmetic_mc", "Copy", "copy_numbers",
    "default_data_path", "load_arc", "load_boolq", "load_gsm8k", "load_hellaswag", "load_hf",
    "load_hf_disk", "load_jsonl",
    "with_gold", "with_questions", "ANCHORED_FROM", "load_lm_eval", "load_logiqa", "load_piqa", "load_task", "reload_task", "rotate_options",
    "shared_data_dirs",
]
