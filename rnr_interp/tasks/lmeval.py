"""Any lm-eval-harness task: `--task lm-eval:NAME` (a YAML of the installed lm-eval) or
`--task-config FILE.yaml` (your own file in the same format).

The YAML is read the way lm-eval reads it (`include:` of base files, local keys win)
and its `doc_to_text`, `doc_to_choice` and `doc_to_target` are rendered with the settings
of lm-eval's Jinja2 environment (StrictUndefined, so a template naming a field the row
lacks is an error, not an empty string) in a bounded sandbox (`templates`: a template
reaches no Python object's internals, and a whole task renders in a child process with
a memory and a CPU limit), with lm-eval's rules
for a column name, a literal list or an index. Few-shot as lm-eval 0.4.13 does it
(`fewshot_context`): `num_fewshot` examples from the few-shot split
(`fewshot_split`, else `training_split`, else `validation_split`, else `test_split`),
drawn by lm-eval's own sampler named in `fewshot_config.sampler` (`default`: one
`random.Random(seed)` for the questions in order, seed 1234 as lm-eval's `--seed`
default; `first_n`), each rendered `doc_to_text` + `target_delimiter` + its answer,
joined by `fewshot_delimiter`, after `description` and before the question. The number
of shots is the caller's (`num_fewshot`, default 0), not the YAML's, which is recorded beside it.

From the installed lm-eval itself come the index of its tasks (`TaskManager`), the
few-shot samplers, the whitespace rules at the joins, the filters and `exact_match`.
The YAML reader and the rendering stay here: lm-eval's `load_yaml` either imports a
`!function` from any module or flattens the tag into a string that reads as a template,
and bounds no file; its `ConfigurableTask` renders in lm-eval's unsandboxed Jinja2
environment, and when built downloads its dataset and renders the first row (a bad one
refuses the task, where here invalid rows are skipped one by one).

`!function` tags run Python code. They are resolved only when the module lies inside
the installed lm-eval's own task folder (code that came with the package, as trusted as
lm-eval itself); a tag pointing anywhere else (a user's `--task-config` folder, a data
folder) is refused naming the file, and no code from there is imported.

Both are asked raw (the context text alone, lm-eval's default: `raw_prompt`) unless
`apply_chat_template`, then through the model's chat template. Two output types:

- ``multiple_choice`` -> `LmEvalMCTask`: generation asks the rendered context
  (description, examples, `doc_to_text`), then the options lettered ``A. ...`` (not when the choices are the letters
  themselves, as in mmlu, whose doc_to_text lists the options) and the multiple-choice
  instruction, graded by letter; recognition scores lm-eval's own requests
  (`loglikelihood_requests`: context, then `target_delimiter` + each choice, no chat
  template), read as lm-eval's ``acc`` (sum of log-probs) and ``acc_norm`` (divided by
  the choice's length in characters, as lm-eval 0.4.13 computes it).
- ``generate_until`` -> `LmEvalGenerationTask`: the rendered context, stopped at
  `generation_kwargs.until`, `max_gen_toks` new tokens (lm-eval's default 256); each
  named filter of the YAML's `filter_list` (gsm8k: ``strict-match``,
  ``flexible-extract``) is an extraction (`extractions`), applied by lm-eval's own
  filter classes, and graded by `grade_filtered` with the YAML's `exact_match`
  settings against the rendered `doc_to_target`. `extract` is the flexible reading
  (what records hold), `extract_strict` / `read_answer_strict` the strict one.

`--data PATH` replaces `dataset_path`: a `save_to_disk` folder of one split or of a
DatasetDict (then the YAML's `test_split`, else `validation_split`), one `.arrow` file,
or a JSONL / JSON / Parquet file. Without `--data`, `dataset_path` is loaded by name
(needs a network or a warm Hugging Face cache).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import os
from dataclasses import MISSING, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import yaml
from jinja2.exceptions import SecurityError

from ._io import RowError, check_question, checked_data_file, invalid_row, invalid_rows, iter_jsonl
from .base import LETTERS, DataFormatError, MultipleChoiceTask, Question, Task
from .templates import TemplateLimitError, bounded_call, render

#: the task-name prefix that selects an installed lm-eval YAML
PREFIX = "lm-eval:"
#: what lm-eval's RegexFilter returns when nothing matches: no answer
FILTER_FALLBACK = "[invalid]"
OUTPUT_TYPES = ("multiple_choice", "generate_until")
#: the filter names of lm-eval's two gradings of a generation (gsm8k and most math tasks)
STRICT, FLEXIBLE = "strict-match", "flexible-extract"
#: a rule that is neither a function nor a column name (`Renderer._direct`)
_UNSET: Any = object()
#: lm-eval's default few-shot seed (`evaluator.simple_evaluate(fewshot_random_seed=...)`, `--seed`'s fourth value)
FEWSHOT_SEED = 1234
#: the `fewshot_config` keys read here; a YAML with others (its own examples, other templates) is refused at num_fewshot > 0
_FEWSHOT_KEYS = frozenset({"sampler", "split"})


class LmEvalUnavailable(ValueError):
    """lm-eval is not importable here (it is installed by `make setup`)."""


def installed_tasks_dir() -> Path:
    """The installed lm-eval's task folder (found without importing lm-eval)."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise LmEvalUnavailable("lm-eval tasks need the lm_eval package; `make setup` installs lm_eval==0.4.13")
    return Path(list(spec.submodule_search_locations)[0]) / "tasks"


def _lm_eval(module: str) -> Any:
    """lm-eval's `module`, imported when first needed (lm-eval is optional here)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise LmEvalUnavailable(f"{module} is not importable here ({e}); `make setup` installs lm_eval==0.4.13 "
                                "and the packages it imports") from None


# -- the YAML -------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionRef:
    """A `!function module.name` tag, not yet imported; `base` is the YAML's folder."""

    qualname: str
    base: Path
    yaml_path: Path

    def resolve(self) -> Callable[..., Any]:
        """The function, when its module is lm-eval's own installed task code; else a
        refusal naming the YAML (no code from elsewhere is run)."""
        module_path = (self.base / f"{self.qualname.rpartition('.')[0].replace('.', '/')}.py").resolve()
        tasks = installed_tasks_dir().resolve()
        if not module_path.is_relative_to(tasks):
            raise DataFormatError(self.yaml_path, None, f"!function {self.qualname} would run Python code from "
                                  f"{module_path}; only lm-eval's own installed task code is run (write it as a "
                                  "Jinja template, or use the installed lm-eval task)")
        return _installed_function(module_path, self.qualname.rpartition(".")[2], self.yaml_path)


@lru_cache(maxsize=None)
def _installed_function(module_path: Path, name: str, yaml_path: Path) -> Callable[..., Any]:
    rel = module_path.relative_to(installed_tasks_dir().resolve()).with_suffix("")
    spec = importlib.util.spec_from_file_location("rnr_lm_eval_tasks." + ".".join(rel.parts), module_path)
    if spec is None or spec.loader is None or not module_path.is_file():
        raise DataFormatError(yaml_path, None, f"!function: no module {module_path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - lm-eval's own utils may need a package it was installed without
        raise DataFormatError(yaml_path, None, f"!function: {module_path} did not import here ({type(e).__name__}: {e})") from None
    if not callable(getattr(module, name, None)):
        raise DataFormatError(yaml_path, None, f"!function: {module_path} has no function {name!r}")
    return getattr(module, name)


def _loader(path: Path) -> type[yaml.SafeLoader]:
    class Loader(yaml.SafeLoader):
        pass

    def function_tag(loader: yaml.SafeLoader, node: yaml.Node) -> FunctionRef:
        return FunctionRef(str(loader.construct_scalar(node)), path.parent, path)  # type: ignore[arg-type]

    Loader.add_constructor("!function", function_tag)
    return Loader


#: the largest task config file read (lm-eval 0.4.13's largest YAML is 62 kB)
MAX_CONFIG_BYTES = 1 << 20
#: the longest chain of `include:` files (lm-eval 0.4.13's longest is 3 files)
MAX_INCLUDE_DEPTH = 16


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """One task YAML with its `include:` files merged in (lm-eval's rule: included
    files in order, then the file's own keys win; `task_list` is not inherited).
    Bounded before it is parsed: a file of at most MAX_CONFIG_BYTES, includes at most
    MAX_INCLUDE_DEPTH deep, nesting as deep as the parser's stack allows."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataFormatError(p, None, "no such task config file")
    p = p.resolve()
    if p in _seen:
        raise DataFormatError(p, None, "include cycle: " + " -> ".join(str(s) for s in (*_seen, p)))
    if len(_seen) > MAX_INCLUDE_DEPTH:
        raise DataFormatError(p, None, f"include: more than {MAX_INCLUDE_DEPTH} files deep (from {_seen[0]}); "
                              "a task config's includes are a few files deep")
    if (size := p.stat().st_size) > MAX_CONFIG_BYTES:
        raise DataFormatError(p, None, f"{size:,} bytes: a task config holds at most {MAX_CONFIG_BYTES:,} (its data goes in --data)")
    try:
        cfg = yaml.load(p.read_text(encoding="utf-8"), Loader=_loader(p))  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise DataFormatError(p, None, "not a task config: its YAML is nested too deep to read") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise DataFormatError(p, mark.line + 1 if mark else None, f"not valid YAML ({problem})") from None
    except UnicodeDecodeError as e:
        raise DataFormatError(p, None, f"not UTF-8 text ({e.reason})") from None
    if not isinstance(cfg, dict):
        raise DataFormatError(p, None, f"a task config must be a YAML mapping, got {type(cfg).__name__}")
    includes = cfg.pop("include", None)
    if includes is None:
        return cfg
    merged: dict[str, Any] = {}
    for inc in includes if isinstance(includes, list) else [includes]:
        if not isinstance(inc, str):
            raise DataFormatError(p, None, f"include: expected a file name, got {inc!r}")
        inc_path = Path(inc) if Path(inc).is_absolute() else p.parent / inc
        if not inc_path.is_file():
            raise DataFormatError(p, None, f"include: {inc} not found (looked at {inc_path})")
        base = read_yaml(inc_path, (*_seen, p))
        base.pop("task_list", None)
        merged.update(base)
    merged.update(cfg)
    return merged


@lru_cache(maxsize=1)
def _installed_yamls() -> tuple[Path, ...]:
    root = installed_tasks_dir()
    return tuple(sorted(Path(d) / f for d, _, files in os.walk(root) for f in files if f.endswith(".yaml")))


@lru_cache(maxsize=1)
def installed_task_index() -> dict[str, Any]:
    """lm-eval's own index of its installed tasks, groups and tags (`TaskManager().task_index`:
    name -> `Entry`, its kind and YAML), read with includes and no function imported;
    built once, in about ten seconds (it parses every installed YAML)."""
    return _lm_eval("lm_eval.tasks").TaskManager().task_index


def find_task_yaml(name: str) -> Path:
    """The installed YAML that defines lm-eval task `name`, or a refusal (a group or a tag
    names several tasks; an unknown name, with close names). Most tasks live in a file
    named after them, read first; else lm-eval's index is asked."""
    for path in _installed_yamls():
        if path.stem == name and read_yaml(path).get("task") == name:
            return path
    index = installed_task_index()
    kind = index[name].kind.name if name in index else None
    if kind in ("TASK", "PY_TASK"):  # a Python task (class:) is refused by LmEvalConfig.from_yaml
        return Path(index[name].yaml_path)
    if kind in ("GROUP", "TAG"):
        raise DataFormatError(index[name].yaml_path or installed_tasks_dir(), None,
                              f"lm-eval {kind.lower()} {name!r} names several tasks, not one: name one of its tasks")
    close = difflib.get_close_matches(name, [n for n, e in index.items() if e.kind.name == "TASK"], n=3)
    hint = f"; close: {', '.join(close)}" if close else ""
    raise DataFormatError(installed_tasks_dir(), None, f"unknown lm-eval task {name!r}: no YAML there defines it{hint}")


@dataclass(frozen=True)
class LmEvalConfig:
    """The parts of a task YAML that decide questions, prompts and grading."""

    path: Path
    task: str
    output_type: str
    doc_to_text: Any
    doc_to_target: Any
    doc_to_choice: Any
    target_delimiter: str
    description: Any
    dataset_path: str | None
    dataset_name: str | None
    test_split: str | None
    validation_split: str | None
    process_docs: Any
    generation_kwargs: dict[str, Any]
    filter_list: tuple[dict[str, Any], ...]
    exact_match: dict[str, Any]
    gen_prefix: Any
    #: the YAML's own `num_fewshot` (recorded; `num_fewshot` is the one applied)
    yaml_num_fewshot: int = 0
    num_fewshot: int = 0
    training_split: str | None = None
    fewshot_split: str | None = None
    fewshot_sampler: str = "default"
    fewshot_seed: int = FEWSHOT_SEED
    fewshot_delimiter: str = "\n\n"
    #: `fewshot_config` keys this reader does not apply (refused when shots are asked for)
    fewshot_unsupported: tuple[str, ...] = ()
    #: the generation prompt through the model's chat template (lm-eval's --apply_chat_template),
    #: else the raw context text (lm-eval's default)
    apply_chat_template: bool = False

    @classmethod
    def from_yaml(cls, path: str | Path) -> "LmEvalConfig":
        raw = read_yaml(path)
        p = Path(path).expanduser().resolve()

        def bad(problem: str) -> DataFormatError:
            return DataFormatError(p, None, problem)

        task = raw.get("task")
        if isinstance(task, list) or "group" in raw and "task" not in raw:
            raise bad("a group of tasks, not one task: name one of its tasks")
        if not isinstance(task, str):
            raise bad("no 'task:' name")
        if "class" in raw:
            raise bad("a task written as a Python class (class:), not as templates: not supported")
        output_type = raw.get("output_type", "generate_until")
        if output_type not in OUTPUT_TYPES:
            raise bad(f"output_type {output_type!r} is not supported (supported: {', '.join(OUTPUT_TYPES)})")
        for key in ("doc_to_text", "doc_to_target"):
            if raw.get(key) is None:
                raise bad(f"no {key}")
        if output_type == "multiple_choice" and raw.get("doc_to_choice") is None:
            raise bad("a multiple_choice task needs doc_to_choice")
        if output_type == "generate_until" and raw.get("process_results") is not None:
            raise bad("process_results: a generation task with its own scoring code is not supported "
                      "(answers are graded by the YAML's filters and exact_match)")
        if raw.get("doc_to_image") or raw.get("doc_to_audio"):
            raise bad("multimodal tasks (doc_to_image, doc_to_audio) are not supported")
        if not isinstance(raw.get("target_delimiter", " "), str):
            raise bad("target_delimiter must be a string")
        gen = raw.get("generation_kwargs") or {}
        if not isinstance(gen, dict):
            raise bad("generation_kwargs must be a mapping")
        until = gen.get("until", [])
        if isinstance(until, str):
            until = [until]
        if not isinstance(until, list) or not all(isinstance(u, str) for u in until):
            raise bad("generation_kwargs.until must be a string or a list of strings")
        filters = raw.get("filter_list") or []
        if not isinstance(filters, list) or not all(isinstance(f, dict) and "name" in f and "filter" in f for f in filters):
            raise bad("filter_list must be a list of {name, filter} entries")
        metrics = raw.get("metric_list") or []
        exact = next((m for m in metrics if isinstance(m, dict) and m.get("metric") == "exact_match"), {})
        fewshot = raw.get("fewshot_config") or {}
        if not isinstance(fewshot, dict):
            raise bad("fewshot_config must be a mapping")
        yaml_shots = raw.get("num_fewshot") or 0
        if not isinstance(yaml_shots, int) or isinstance(yaml_shots, bool) or yaml_shots < 0:
            raise bad(f"num_fewshot must be a whole number >= 0, got {yaml_shots!r}")
        for key in ("fewshot_delimiter", "training_split", "fewshot_split"):
            if raw.get(key) is not None and not isinstance(raw[key], str):
                raise bad(f"{key} must be a string")
        return cls(
            path=p, task=task, output_type=output_type, doc_to_text=raw["doc_to_text"],
            doc_to_target=raw["doc_to_target"], doc_to_choice=raw.get("doc_to_choice"),
            target_delimiter=raw.get("target_delimiter", " "), description=raw.get("description") or "",
            dataset_path=raw.get("dataset_path"), dataset_name=raw.get("dataset_name"),
            test_split=raw.get("test_split"), validation_split=raw.get("validation_split"),
            process_docs=raw.get("process_docs"), generation_kwargs={**gen, "until": until},
            filter_list=tuple(filters),
            exact_match={k: exact[k] for k in ("regexes_to_ignore", "ignore_case", "ignore_punctuation", "ignore_numbers") if k in exact},
            gen_prefix=raw.get("gen_prefix"), yaml_num_fewshot=yaml_shots,
            training_split=raw.get("training_split"), fewshot_split=fewshot.get("split") or raw.get("fewshot_split"),
            fewshot_sampler=str(fewshot.get("sampler", "default")),
            fewshot_delimiter=raw.get("fewshot_delimiter", "\n\n"),
            fewshot_unsupported=tuple(sorted(k for k, v in fewshot.items() if k not in _FEWSHOT_KEYS and v is not None)),
        )

    def with_fewshot(self, num_fewshot: int, split: str | None = None, seed: int = FEWSHOT_SEED) -> "LmEvalConfig":
        """This config asking `num_fewshot` examples from `split` (None: the YAML's
        rule) drawn with `seed`; bad values are refused in one line."""
        if not isinstance(num_fewshot, int) or isinstance(num_fewshot, bool) or num_fewshot < 0:
            raise ValueError(f"num_fewshot must be a whole number >= 0, got {num_fewshot!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"the few-shot seed must be a whole number, got {seed!r}")
        if split is not None and (not isinstance(split, str) or not split.strip()):
            raise ValueError(f"fewshot_split must be a split name, got {split!r}")
        if num_fewshot:
            samplers = _lm_eval("lm_eval.api.samplers").SAMPLER_REGISTRY
            if self.fewshot_sampler not in samplers:
                raise DataFormatError(self.path, None, f"fewshot_config.sampler {self.fewshot_sampler!r} is not supported "
                                      f"(supported: {', '.join(samplers)})")
            if self.fewshot_unsupported:
                raise DataFormatError(self.path, None, f"fewshot_config.{self.fewshot_unsupported[0]} is not supported "
                                      "(few-shot examples come from a split, rendered with the task's own templates)")
        return replace(self, num_fewshot=num_fewshot, fewshot_seed=seed,
                       fewshot_split=split if split is not None else self.fewshot_split)

    @property
    def fewshot_pool_split(self) -> str | None:
        """The split few-shot examples come from (lm-eval's `fewshot_docs` rule)."""
        return self.fewshot_split or self.training_split or self.validation_split or self.test_split

    @property
    def fewshot_excludes_question(self) -> bool:
        """Whether a question is kept out of its own examples: lm-eval passes the
        evaluated doc to the sampler only when `fewshot_split` equals `test_split`
        (both unset counts as equal, as there)."""
        return self.fewshot_split == self.test_split

    def stored(self) -> dict[str, Any]:
        """Every setting, as JSON (functions as {"!function": name}): what a run stores
        to grade its records later without reading the YAML again (`from_stored`)."""
        def plain(v: Any) -> Any:
            if isinstance(v, FunctionRef):
                return {"!function": v.qualname}
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v

        return {f.name: str(self.path) if f.name == "path" else plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> "LmEvalConfig":
        """The config `stored()` gave; its templates are data here, never rendered."""
        required = [f.name for f in fields(cls) if f.default is MISSING]
        try:
            values = {name: stored[name] for name in required}
        except (KeyError, TypeError) as e:
            raise ValueError(f"stored lm-eval settings lack {e}") from None
        # a run stored before few-shot support keeps the zero-shot defaults
        values.update({f.name: stored[f.name] for f in fields(cls) if f.default is not MISSING and f.name in stored})
        values["path"], values["filter_list"] = Path(values["path"]), tuple(values["filter_list"])
        values["fewshot_unsupported"] = tuple(values.get("fewshot_unsupported", ()))
        return cls(**values)

    def describe(self) -> dict[str, Any]:
        """The settings a run records (functions by their `!function` name)."""
        def shown(v: Any) -> Any:
            return f"!function {v.qualname}" if isinstance(v, FunctionRef) else v

        return {"yaml": str(self.path), "task": self.task, "output_type": self.output_type,
                "doc_to_text": shown(self.doc_to_text), "doc_to_choice": shown(self.doc_to_choice),
                "doc_to_target": shown(self.doc_to_target), "target_delimiter": self.target_delimiter,
                "description": shown(self.description), "apply_chat_template": self.apply_chat_template,
                "num_fewshot": self.num_fewshot,
                "yaml_num_fewshot": self.yaml_num_fewshot,
                **({"fewshot_split": self.fewshot_pool_split, "fewshot_sampler": self.fewshot_sampler,
                    "fewshot_seed": self.fewshot_seed, "fewshot_delimiter": self.fewshot_delimiter}
                   if self.num_fewshot else {}),
                "until": self.generation_kwargs["until"], "filters": [f["name"] for f in self.filter_list]}


# -- rendering, as lm-eval's ConfigurableTask does ---------------------------------


class Renderer:
    """`doc_to_text`, `doc_to_choice`, `doc_to_target` of one config over docs with
    columns `features`, each rule copied from lm-eval 0.4.13's ConfigurableTask."""

    def __init__(self, cfg: LmEvalConfig, features: Sequence[str]):
        self.cfg, self.features = cfg, set(features)
        self._api = _lm_eval("lm_eval.api.utils")  # lm-eval's whitespace rules at the joins
        self._fns = {k: v.resolve() for k in ("doc_to_text", "doc_to_target", "doc_to_choice", "description")
                     if isinstance(v := getattr(cfg, k), FunctionRef)}

    def _template(self, field: str, template: str, doc: dict[str, Any]) -> str:
        try:
            return render(template, doc, field)
        except TemplateLimitError as e:  # the config's fault, not the row's: the file is refused
            raise DataFormatError(self.cfg.path, None, f"{e}; the template is refused") from None
        except SecurityError as e:
            raise DataFormatError(self.cfg.path, None, f"{field} reaches outside the template's sandbox ({e}); "
                                  "the template is refused") from None
        except Exception as e:  # noqa: BLE001 - jinja2's UndefinedError, SecurityError, errors inside filters
            raise RowError(f"{field} of {self.cfg.path.name}: {type(e).__name__}: {e}") from None

    def _direct(self, field: str, doc: dict[str, Any]) -> Any:
        """`field`'s value for doc when its rule is a `!function` (called) or a column
        name (read, lm-eval's first check for a string); else `_UNSET` (a template)."""
        rule = getattr(self.cfg, field)
        if field in self._fns:
            try:
                return self._fns[field](doc)
            except Exception as e:  # noqa: BLE001 - lm-eval's code on a row it was not written for
                raise RowError(f"{field} of {self.cfg.path.name}: {type(e).__name__}: {e}") from None
        if isinstance(rule, str) and rule in self.features:
            return doc[rule]
        return _UNSET

    def text(self, doc: dict[str, Any]) -> str:
        rule = self.cfg.doc_to_text
        if (out := self._direct("doc_to_text", doc)) is not _UNSET:
            pass
        elif isinstance(rule, str):
            out = self._template("doc_to_text", rule, doc)
            if out.isdigit() and self.cfg.doc_to_choice is not None:
                raise RowError("doc_to_text gives an option index (a multiple-input task such as winogrande): not supported")
        else:
            raise RowError(f"doc_to_text must be a template or a column name, got {rule!r}")
        if not isinstance(out, str):
            raise RowError(f"doc_to_text gives {type(out).__name__}, not text")
        return out

    def description(self, doc: dict[str, Any]) -> str:
        if (out := self._direct("description", doc)) is not _UNSET:
            return str(out)
        return self._template("description", self.cfg.description, doc) if self.cfg.description else ""

    def choices(self, doc: dict[str, Any]) -> list[str]:
        rule = self.cfg.doc_to_choice
        if (out := self._direct("doc_to_choice", doc)) is not _UNSET:
            pass
        elif isinstance(rule, str):
            rendered = self._template("doc_to_choice", rule, doc)
            try:
                out = ast.literal_eval(rendered)
            except (ValueError, SyntaxError):
                raise RowError(f"doc_to_choice renders {rendered[:80]!r}, not a list") from None
        elif isinstance(rule, list):
            out = rule
        elif isinstance(rule, dict):
            out = list(rule.values())
        else:
            raise RowError(f"doc_to_choice must be a template, a column name, a list or a mapping, got {rule!r}")
        if not isinstance(out, (list, tuple)) or not all(isinstance(c, str) for c in out):
            raise RowError(f"doc_to_choice gives {out!r}, not a list of strings")
        return list(out)

    def target(self, doc: dict[str, Any]) -> int | str | list[Any]:
        rule = self.cfg.doc_to_target
        if (direct := self._direct("doc_to_target", doc)) is not _UNSET:
            return direct
        if isinstance(rule, (int, list)):
            return rule
        if not isinstance(rule, str):
            raise RowError(f"doc_to_target must be a template, a column name, an index or a list, got {rule!r}")
        out = self._template("doc_to_target", rule, doc)
        if out.isdigit() and self.cfg.doc_to_choice is not None:
            return ast.literal_eval(out)
        if len(out) >= 2 and out[0] == "[" and out[-1] == "]":
            try:
                return ast.literal_eval(out)
            except (SyntaxError, ValueError):
                return out
        return out

    def _gen_prefix(self, doc: dict[str, Any]) -> str:
        if not self.cfg.gen_prefix:
            return ""
        return doc[self.cfg.gen_prefix] if self.cfg.gen_prefix in self.features else self._template("gen_prefix", self.cfg.gen_prefix, doc)

    def shot(self, doc: dict[str, Any]) -> str:
        """One few-shot example as lm-eval's `build_qa_turn` writes it without a chat
        template: doc_to_text, the target delimiter, the answer (an index picks the
        choice; `gen_prefix` before it), then `fewshot_delimiter`."""
        question, target = self.text(doc), self.target(doc)
        choices = self.choices(doc) if self.cfg.doc_to_choice is not None else None
        if isinstance(target, int) and not isinstance(target, bool) and choices:
            if not 0 <= target < len(choices):
                raise RowError(f"target index {target} is outside the {len(choices)} choices")
            answer = choices[target]
        else:
            answer = target[0] if isinstance(target, list) and target else target
        if not isinstance(answer, str):
            raise RowError(f"doc_to_target gives {target!r}, not an answer text")
        prefix = self._gen_prefix(doc)
        join = "" if prefix and not self._api.requires_delimiter(question, prefix) else self.cfg.target_delimiter
        return question + join + self._api.maybe_delimit(prefix, answer, " ") + self.cfg.fewshot_delimiter

    def context(self, doc: dict[str, Any], shots: Sequence[dict[str, Any]] = ()) -> str:
        """lm-eval's context without a chat template: description, the few-shot
        examples `shots`, then doc_to_text (then `gen_prefix`, after the target
        delimiter when neither side has whitespace at the join, as lm-eval's
        `build_qa_turn` does)."""
        text = self.description(doc) + "".join(self.shot(s) for s in shots) + self.text(doc)
        if prefix := self._gen_prefix(doc):
            text = text + (self.cfg.target_delimiter if self._api.requires_delimiter(text, prefix) else "") + prefix
        return text


def fewshot_sampler(pool: Sequence[dict[str, Any]], cfg: LmEvalConfig) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    """The examples of each question in turn, drawn from `pool` by lm-eval's own sampler
    (`api.samplers`: "default" draws with one `random.Random(seed)` for all the questions
    in order, so question i's examples depend on the draws before it; "first_n"), the
    question itself left out when `fewshot_excludes_question`, as `fewshot_context` does."""
    pool = list(pool)
    if len(pool) < cfg.num_fewshot + (1 if cfg.fewshot_excludes_question else 0):
        raise DataFormatError(cfg.path, None, f"num_fewshot {cfg.num_fewshot}: the few-shot split "
                              f"{cfg.fewshot_pool_split!r} has only {len(pool)} rows")
    sampler = _lm_eval("lm_eval.api.samplers").get_sampler(cfg.fewshot_sampler)(pool, rnd=cfg.fewshot_seed)

    def sample(doc: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            return list(sampler.sample(cfg.num_fewshot, eval_doc=doc if cfg.fewshot_excludes_question else None))
        except (AssertionError, ValueError):  # lm-eval's refusal when copies of the question leave too few
            raise DataFormatError(cfg.path, None, f"num_fewshot {cfg.num_fewshot}: the few-shot split "
                                  f"{cfg.fewshot_pool_split!r} has fewer other rows than that beside a question") from None

    return sample


def gold_index(target: int | str | list[Any], choices: Sequence[str]) -> int:
    """The gold option's position, by lm-eval's rule (an index, or a choice's text);
    a target outside the choices is a row error."""
    if isinstance(target, list):
        raise RowError(f"several gold targets {target!r}: not supported (one gold option per question)")
    if isinstance(target, bool) or not isinstance(target, (int, str)):
        raise RowError(f"doc_to_target gives {target!r}, neither an option index nor an option's text")
    if isinstance(target, int):
        if not 0 <= target < len(choices):
            raise RowError(f"target index {target} is outside the {len(choices)} choices")
        return target
    if target not in choices:
        raise RowError(f"target {target!r} is not one of the choices {choices!r}")
    return choices.index(target)


# -- the data -------------------------------------------------------------------


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as e:
        raise LmEvalUnavailable(f"reading this data needs the `datasets` package ({e})") from None
    return datasets


def read_docs(cfg: LmEvalConfig, data: str | Path | None) -> tuple[Any, str, Callable[[int], int]]:
    """(docs, where, row number of doc i): the rows of `data` (or of the YAML's
    `dataset_path` by name when None), after the YAML's `process_docs`."""
    if data is None:
        return _hub_docs(cfg)
    p = Path(data)
    if not p.exists():
        raise FileNotFoundError(f"lm-eval task {cfg.task!r}: data {p} not found")
    suffix = p.suffix.lower()
    if p.is_dir() or suffix == ".arrow":
        if not p.is_dir():
            checked_data_file(p)
        datasets = _datasets()
        try:
            ds = datasets.load_from_disk(str(p)) if p.is_dir() else datasets.Dataset.from_file(str(p))
        except Exception as e:  # noqa: BLE001 - every unreadable folder ends here, as one line
            raise DataFormatError(p, None, f"not a dataset datasets can read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        where = str(p)
        if isinstance(ds, datasets.DatasetDict):
            split = next((s for s in (cfg.test_split, cfg.validation_split) if s and s in ds), None)
            if split is None:
                raise DataFormatError(p, None, f"no split {cfg.test_split or cfg.validation_split!r} of {cfg.path.name} "
                                      f"(test_split, else validation_split) in the saved dataset; splits: {', '.join(ds)}")
            ds, where = ds[split], f"{p}[{split}]"
        return _processed(cfg, ds), where, lambda i: i + 1
    if suffix == ".jsonl":
        numbered = list(iter_jsonl(p))
        lines = [ln for ln, _ in numbered]
        return _processed(cfg, [obj for _, obj in numbered]), str(p), lambda i: lines[i]
    if suffix == ".json":
        try:
            rows = json.loads(checked_data_file(p).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataFormatError(p, None, f"not valid JSON ({e})") from None
        if isinstance(rows, dict) and isinstance(rows.get("data"), list):
            rows = rows["data"]
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise DataFormatError(p, None, "a JSON data file must hold a list of objects (or {\"data\": [...]})")
        return _processed(cfg, rows), str(p), lambda i: i + 1
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(checked_data_file(p)).to_pylist()
        except Exception as e:  # noqa: BLE001 - a damaged or foreign file
            raise DataFormatError(p, None, f"not a readable Parquet file ({type(e).__name__})") from None
        return _processed(cfg, rows), str(p), lambda i: i + 1
    raise DataFormatError(p, None, "lm-eval task data must be a save_to_disk folder, an .arrow, .jsonl, .json or .parquet file")


def read_split(cfg: LmEvalConfig, data: str | Path | None, split: str | None) -> Any:
    """The rows of split `split` (the few-shot examples' split), after the YAML's
    `process_docs`: from `data` when it is a `DatasetDict.save_to_disk` folder holding
    that split, else from the YAML's dataset by name (data None). A one-split source
    (a file, a one-split folder) is refused: it cannot tell its examples from its questions."""
    if split is None:
        raise DataFormatError(cfg.path, None, "num_fewshot > 0 needs a split to draw examples from "
                              "(the YAML names no fewshot_split, training_split, validation_split or test_split)")
    if data is None:
        return _processed(cfg, _hub_split(cfg, split, f"the few-shot split {split!r} of {cfg.dataset_path}"))
    p = Path(data)
    splits: Any = None
    if p.is_dir():
        try:
            splits = _datasets().load_from_disk(str(p))
        except Exception:  # noqa: BLE001 - read_docs has already named what is wrong with it
            splits = None
    if not isinstance(splits, _datasets().DatasetDict):
        raise DataFormatError(p, None, f"num_fewshot {cfg.num_fewshot} draws its examples from split {split!r}, and this "
                              "data is one split: pass a DatasetDict.save_to_disk folder holding it")
    if split not in splits:
        raise DataFormatError(p, None, f"no few-shot split {split!r} in the saved dataset; splits: {', '.join(splits)}")
    return _processed(cfg, splits[split])


def _hub_docs(cfg: LmEvalConfig) -> tuple[Any, str, Callable[[int], int]]:
    split = cfg.test_split or cfg.validation_split
    where = f"hf://{cfg.dataset_path}" + (f"/{cfg.dataset_name}" if cfg.dataset_name else "") + f"[{split}]"
    if not cfg.dataset_path or not split:
        raise DataFormatError(cfg.path, None, "no dataset_path and test_split/validation_split to load: pass --data PATH")
    return _processed(cfg, _hub_split(cfg, split, where)), where, lambda i: i + 1


def _hub_split(cfg: LmEvalConfig, split: str, what: str) -> Any:
    """Split `split` of the YAML's dataset, loaded by name; `what` names it in the refusal."""
    try:
        return _datasets().load_dataset(cfg.dataset_path, cfg.dataset_name, split=split)
    except LmEvalUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - network, auth and missing-dataset errors all end here
        raise DataFormatError(cfg.path, None, f"could not load {what} ({type(e).__name__}); "
                              "without a network, pass the data with --data PATH") from None


def _processed(cfg: LmEvalConfig, rows: Any) -> Any:
    if cfg.process_docs is None:
        return rows
    if not isinstance(cfg.process_docs, FunctionRef):
        raise DataFormatError(cfg.path, None, "process_docs must be a !function")
    fn = cfg.process_docs.resolve()
    if isinstance(rows, list):  # lm-eval's process_docs functions take a datasets.Dataset
        rows = _datasets().Dataset.from_list(rows)
    try:
        return fn(rows)
    except Exception as e:  # noqa: BLE001 - lm-eval's code on data it was not written for
        raise DataFormatError(cfg.path, None, f"process_docs {cfg.process_docs.qualname} failed on the data ({type(e).__name__}: {e})") from None


def _features(docs: Any) -> list[str]:
    names = getattr(docs, "column_names", None)
    if names is not None:
        return list(names)
    return list(docs[0]) if len(docs) else []


# -- the tasks ------------------------------------------------------------------


class _PromptMode:
    config: LmEvalConfig

    @property
    def raw_prompt(self) -> bool:
        """Whether the model is asked the prompt text as it is, without its chat
        template (lm-eval's default; `apply_chat_template` asks through it)."""
        return not self.config.apply_chat_template


class LmEvalMCTask(_PromptMode, MultipleChoiceTask):
    """An lm-eval multiple_choice task: asked with lettered options, graded by letter;
    recognised by lm-eval's own loglikelihood requests."""

    def __init__(self, questions: Sequence[Question], cfg: LmEvalConfig, source: str, data: str | None):
        self.name = f"{PREFIX}{cfg.task}"
        self.config, self.data = cfg, data
        super().__init__(questions, source=source)

    def user_message(self, q: Question) -> str:
        """doc_to_text, the lettered options, the instruction; when the choices are the
        letters themselves (mmlu, commonsense_qa: doc_to_text already lists the options
        under them), doc_to_text and the instruction only."""
        if q.choices == tuple(LETTERS[: len(q.choices or ())]):
            return "\n\n".join([q.text.strip(), self.instruction])
        return super().user_message(q)

    def loglikelihood_requests(self, q: Question) -> list[tuple[str, str]]:
        """lm-eval's requests for q, one per option in order: (context, target
        delimiter + choice), exactly the `Instance.arguments` its ConfigurableTask builds
        (few-shot examples included) without a chat template."""
        return [(q.text, f"{self.config.target_delimiter}{c}") for c in q.choices or ()]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "lm_eval": {**self.config.describe(), "data": self.data}}

    def stored(self) -> dict[str, Any]:
        return {**super().stored(), "lm_eval": self.config.stored()}


class LmEvalGenerationTask(_PromptMode, Task):
    """An lm-eval generate_until task: the rendered doc_to_text, stopped at `until`,
    graded by exact match after the YAML's filters."""

    answer_format = "as the task's lm-eval filters read it"
    max_new_tokens = 256

    def __init__(self, questions: Sequence[Question], cfg: LmEvalConfig, source: str, data: str | None):
        self.name = f"{PREFIX}{cfg.task}"
        self.config, self.data = cfg, data
        self.stop_strings = tuple(cfg.generation_kwargs["until"])
        self.max_new_tokens = int(cfg.generation_kwargs.get("max_gen_toks", 256))
        self.filters = {f["name"]: _filter_pipeline(cfg, f) for f in cfg.filter_list}
        super().__init__(questions, source=source)

    def user_message(self, q: Question) -> str:
        return q.text  # lm-eval's prompt, verbatim: no instruction added

    def extractions(self, generation: str) -> dict[str, str | None]:
        """The answer each of the YAML's filters (strict-match, flexible-extract, ...)
        reads out of one generation; None where it finds none. A YAML without filters
        has one, "none": the whole generation (lm-eval's default)."""
        if not self.filters:
            return {"none": generation}
        return {name: pipeline(generation) for name, pipeline in self.filters.items()}

    def extract(self, generation: str) -> str | None:
        """The flexible reading, what records' `extracted` and `correct` hold (as every
        task's lenient extractor): the filter named "flexible-extract", else the YAML's
        last filter, else the whole generation."""
        readings = self.extractions(generation)
        return readings.get(FLEXIBLE, list(readings.values())[-1])

    def extract_strict(self, generation: str) -> str | None:
        """The strict reading: the filter named "strict-match" (gsm8k: the number after
        '#### '), else the YAML's first filter, else the whole generation."""
        readings = self.extractions(generation)
        return readings.get(STRICT, next(iter(readings.values())))

    def read_answer_strict(self, generation: str, q: Question, finished: bool) -> str | None:
        """The strict grading's reading (the strict/flexible grading's hook): lm-eval's
        strict filter, whether or not the candidate ended on its own (lm-eval's filters
        do not ask)."""
        return self.extract_strict(generation)

    def grade(self, extracted: str | None, q: Question) -> bool:
        return self.grade_filtered(extracted, q)

    def grade_filtered(self, extracted: str | None, q: Question) -> bool:
        """lm-eval's exact_match of one filtered answer against the rendered target,
        with the YAML's regexes_to_ignore, ignore_case, ignore_punctuation."""
        return extracted is not None and exact_match(extracted, q.answer, **self.config.exact_match)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "lm_eval": {**self.config.describe(), "data": self.data}}

    def stored(self) -> dict[str, Any]:
        return {**super().stored(), "lm_eval": self.config.stored()}


def exact_match(prediction: str, reference: str, **settings: Any) -> bool:
    """lm-eval's `exact_match_hf_evaluate` for one pair, with the YAML's `settings`
    (regexes_to_ignore, ignore_case, ignore_punctuation, ignore_numbers)."""
    metric = _lm_eval("lm_eval.api.metrics").exact_match_hf_evaluate
    return bool(metric(predictions=[prediction], references=[reference], **settings)["exact_match"] == 1.0)


def _filter_pipeline(cfg: LmEvalConfig, entry: dict[str, Any]) -> Callable[[str], str | None]:
    """One named filter of the YAML as a function of one generation, run by lm-eval's
    own filter classes (regex, take_first, lowercase, ...); "[invalid]" becomes None."""
    build_filter_ensemble = _lm_eval("lm_eval.filters").build_filter_ensemble
    steps = entry["filter"]
    if not isinstance(steps, list) or not all(isinstance(s, dict) and isinstance(s.get("function"), str) for s in steps):
        raise DataFormatError(cfg.path, None, f"filter {entry['name']!r}: each step needs a 'function' name")
    try:
        ensemble = build_filter_ensemble(entry["name"], [(s["function"], {k: v for k, v in s.items() if k != "function"}) for s in steps])
        filters = [make() for make in ensemble.filters]
    except Exception as e:  # noqa: BLE001 - an unknown filter name or bad arguments
        raise DataFormatError(cfg.path, None, f"filter {entry['name']!r}: {type(e).__name__}: {e}") from None

    def apply(generation: str) -> str | None:
        resps: Any = [[generation]]
        for f in filters:
            resps = f.apply(resps, [{}])
        out = list(resps)[0]
        out = out[0] if isinstance(out, list) else out
        return None if out == FILTER_FALLBACK or not isinstance(out, str) else out

    return apply


def _question_id(doc: dict[str, Any], index: int) -> str:
    value = doc.get("id")
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
        return str(value)
    return str(index)  # lm-eval's doc_id


def _questions(cfg: LmEvalConfig, docs: Any, where: str, row_of: Callable[[int], int],
               pool: Sequence[dict[str, Any]] = ()) -> Iterator[Question]:
    render = Renderer(cfg, _features(docs))
    sampler = fewshot_sampler(pool, cfg) if cfg.num_fewshot else None
    seen: set[str] = set()
    for i, doc in enumerate(docs):
        doc = dict(doc)
        shots = sampler(doc) if sampler else []  # drawn for every row, valid or not, as lm-eval does
        try:
            qid = _question_id(doc, i)
            if qid in seen:
                raise RowError(f"duplicate id {qid!r}")
            text = render.context(doc, shots)
            if not text.strip():
                raise RowError("doc_to_text renders an empty prompt")
            target = render.target(doc)
            if cfg.output_type == "multiple_choice":
                choices = render.choices(doc)
                if not 2 <= len(choices) <= len(LETTERS):
                    raise RowError(f"{len(choices)} choices: a question needs 2 to {len(LETTERS)} (letters A-{LETTERS[-1]})")
                gold = gold_index(target, choices)
                q = check_question(Question(id=qid, text=text, answer=LETTERS[gold], choices=tuple(choices), gold_index=gold))
            else:
                if isinstance(target, list):
                    target = target[0] if target and isinstance(target[0], str) else target
                if not isinstance(target, (str, int)) or isinstance(target, bool) or not str(target).strip():
                    raise RowError(f"doc_to_target gives {target!r}, not a non-empty answer")
                q = Question(id=qid, text=text, answer=str(target))
        except RowError as e:
            invalid_row(where, row_of(i), doc, str(e))
            continue
        seen.add(qid)
        yield q


def _rendered_questions(cfg: LmEvalConfig, docs: Any, where: str, row_of: Callable[[int], int],
                        pool: Sequence[dict[str, Any]] = ()) -> list[Question]:
    """The questions of every doc (with few-shot examples from `pool`), rendered in a
    bounded child process (`templates.bounded_call`); rows it skipped as invalid are
    kept here as well."""
    def work() -> tuple[list[Question], list[dict[str, Any]]]:
        before = len(invalid_rows() or ())
        questions = list(_questions(cfg, docs, where, row_of, pool))
        return questions, list(invalid_rows() or ())[before:]

    questions, skipped = bounded_call(work, f"rendering the templates of {cfg.path.name}")
    if (kept := invalid_rows()) is not None:
        kept.extend(skipped)
    return questions


def stored_lm_eval_task(described: dict[str, Any], stored: Any) -> Task:
    """The lm-eval task a run stored (`Task.stored()`), with the source and data its
    description names: questions as asked, graded by the stored filters."""
    try:
        cfg = LmEvalConfig.from_stored(stored["lm_eval"])
        questions = [Question(**{**q, "choices": None if q.get("choices") is None else tuple(q["choices"])})
                     for q in stored["questions"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{described.get('stored_file')}: not a stored lm-eval task ({type(e).__name__}: {e})") from None
    cls = LmEvalMCTask if cfg.output_type == "multiple_choice" else LmEvalGenerationTask
    lm_eval = described.get("lm_eval") or {}
    task = cls(questions, cfg, source=str(described.get("source") or cfg.path), data=lm_eval.get("data"))
    if described.get("skipped_rows"):
        task.skipped_rows = tuple(described["skipped_rows"])
    return task


def load_lm_eval(task: str | None = None, *, config: str | Path | None = None, data: str | Path | None = None,
                 num_fewshot: int = 0, fewshot_split: str | None = None, fewshot_seed: int = FEWSHOT_SEED,
                 apply_chat_template: bool = False) -> Task:
    """The lm-eval task `task` (a name in the installed lm-eval) or the one a YAML file
    `config` defines, over `data` (None: the YAML's dataset by name), each question
    after `num_fewshot` examples from `fewshot_split` (None: the YAML's rule) drawn with
    `fewshot_seed`, by lm-eval's own sampler (`fewshot_sampler`). The default is zero-shot
    whatever the YAML's `num_fewshot` (recorded as `yaml_num_fewshot`). The task's
    `raw_prompt` says how a model is to be asked: the raw text (lm-eval's default), or,
    with `apply_chat_template`, the user turn of the model's chat template."""
    if (task is None) == (config is None):
        raise ValueError("give an lm-eval task name or a task config file, not both")
    path = find_task_yaml(task) if task is not None else Path(config)  # type: ignore[arg-type]
    cfg = replace(LmEvalConfig.from_yaml(path).with_fewshot(num_fewshot, fewshot_split, fewshot_seed),
                  apply_chat_template=bool(apply_chat_template))
    docs, where, row_of = read_docs(cfg, data)
    pool = [dict(d) for d in read_split(cfg, data, cfg.fewshot_pool_split)] if cfg.num_fewshot else []
    questions = _rendered_questions(cfg, docs, where, row_of, pool)
    if not questions:
        raise DataFormatError(where, None, f"no valid questions for {cfg.task} (of {len(docs)} rows)")
    cls = LmEvalMCTask if cfg.output_type == "multiple_choice" else LmEvalGenerationTask
    return cls(questions, cfg, source=where, data=None if data is None else str(data))
