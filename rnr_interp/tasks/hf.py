"""The same tasks read from the Hugging Face Hub with `datasets` (imported lazily).

Each HF row is mapped onto the row shape of the matching local file format and parsed
by that format's own `parse_row`, so an item has the same text, choices and gold
whether it came from a file or the Hub. Needs network access (or a warm HF cache).

    load_hf("gsm8k")                      # openai/gsm8k, config main, split test
    load_hf("arc_easy", split="validation")
    load_hf("piqa", repo="some/mirror")   # a mirror with the same columns
    load_hf("arc_easy", disk="saved/arc")  # a folder written by datasets' save_to_disk

`load_task(name, data=FOLDER)` (and `--data FOLDER` on the command line) reads such a
folder too, and `data=FILE.arrow` one Arrow file of a saved dataset; anything `datasets`
cannot read there is one `HFLoadError` line naming the path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import arc, boolq, gsm8k, hellaswag, logiqa, piqa
from ._io import RowParser, get_index, parse_all
from .base import LETTERS, Task


class HFLoadError(RuntimeError):
    """The dataset could not be fetched or opened (no network, no such dataset...)."""


def _same(row: dict[str, Any]) -> dict[str, Any]:
    return row


def _arc_row(row: dict[str, Any]) -> dict[str, Any]:
    # HF: question is the stem, choices a {"text": [...], "label": [...]} table.
    ch = row.get("choices") or {}
    options = [{"text": t, "label": lab} for t, lab in zip(ch.get("text", []), ch.get("label", []))]
    return {
        "id": row.get("id"),
        "question": {"stem": row.get("question"), "choices": options},
        "answerKey": row.get("answerKey"),
    }


def _hellaswag_row(row: dict[str, Any]) -> dict[str, Any]:
    # The local text export writes the context as "<activity_label>: <ctx>".
    return {
        "ctx": f"{row.get('activity_label')}: {row.get('ctx')}",
        "label": row.get("label"),
        "endings": row.get("endings"),
    }


def _logiqa_row(row: dict[str, Any]) -> dict[str, Any]:
    # lucasmccabe/logiqa: query, options (already without "A." prefixes), correct_option 0-3.
    gold = get_index(row, "correct_option", 4)
    return {
        "answer": LETTERS[gold],
        "context": row.get("context"),
        "question": row.get("query"),
        "options": row.get("options"),
    }


@dataclass(frozen=True)
class _Spec:
    repo: str
    config: str | None
    split: str
    task: Callable[..., Task]
    parse_row: RowParser
    adapt: Callable[[dict[str, Any]], dict[str, Any]] = _same


_ARC = ("allenai/ai2_arc", arc.ARC, arc.parse_row, _arc_row)
SPECS: dict[str, _Spec] = {
    "gsm8k": _Spec("openai/gsm8k", "main", "test", gsm8k.GSM8K, gsm8k.parse_row),
    "arc_challenge": _Spec(_ARC[0], "ARC-Challenge", "test", *_ARC[1:]),
    "arc_easy": _Spec(_ARC[0], "ARC-Easy", "test", *_ARC[1:]),
    "piqa": _Spec("ybisk/piqa", None, "validation", piqa.PIQA, piqa.parse_row),
    "boolq": _Spec("google/boolq", None, "validation", boolq.BoolQ, boolq.parse_row),
    "hellaswag": _Spec(
        "Rowan/hellaswag", None, "validation", hellaswag.HellaSwag, hellaswag.parse_row, _hellaswag_row
    ),
    "logiqa": _Spec("lucasmccabe/logiqa", None, "test", logiqa.LogiQA, logiqa.parse_row, _logiqa_row),
}
SPECS["arc"] = SPECS["arc_challenge"]


def _spec(name: str) -> _Spec:
    if name not in SPECS:
        raise ValueError(f"no Hugging Face mapping for task {name!r}; known: {', '.join(sorted(SPECS))}")
    return SPECS[name]


def _datasets():
    try:
        import datasets  # heavy and optional: only these paths need it
    except ImportError as e:
        raise HFLoadError("reading Hugging Face datasets needs the `datasets` package (pip install datasets)") from e
    return datasets


def _task_from_rows(spec: _Spec, ds: Any, where: str, n: int | None) -> Task:
    rows = enumerate(ds if n is None else ds.select(range(min(n, len(ds)))), 1)
    questions = parse_all(where, rows, lambda row, i: spec.parse_row(spec.adapt(dict(row)), i))
    return spec.task(questions, source=where)


def load_hf_disk(name: str, path: str | Path, split: str | None = None, *, n: int | None = None) -> Task:
    """Task `name` from a folder written by `Dataset.save_to_disk` or
    `DatasetDict.save_to_disk` (split `split`, default the task's), or from one Arrow
    file of such a folder."""
    spec, datasets, p = _spec(name), _datasets(), Path(path)
    try:
        ds = datasets.load_from_disk(str(p)) if p.is_dir() else datasets.Dataset.from_file(str(p))
    except Exception as e:  # noqa: BLE001 - every unreadable folder or file ends here, as one line
        what = "a folder written by datasets' save_to_disk" if p.is_dir() else "an Arrow file datasets can read"
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise HFLoadError(f"{p}: not {what} ({type(e).__name__}: {reason})") from None
    if isinstance(ds, datasets.DatasetDict):
        split = split or spec.split
        if split not in ds:
            raise HFLoadError(f"{p}: no split {split!r} in the saved dataset; splits: {', '.join(ds)}")
        ds = ds[split]
    return _task_from_rows(spec, ds, f"{p}" + (f"[{split}]" if split else ""), n)


def load_hf(
    name: str,
    split: str | None = None,
    *,
    n: int | None = None,
    repo: str | None = None,
    config: str | None = None,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    disk: str | Path | None = None,
) -> Task:
    """Task `name` (a key of SPECS) from the Hub; `repo`/`config` override the default
    dataset (for mirrors with the same columns), `n` keeps the first n rows. `disk`
    reads a `save_to_disk` folder (or Arrow file) instead of the Hub."""
    if disk is not None:
        return load_hf_disk(name, disk, split, n=n)
    spec = _spec(name)
    repo, config, split = repo or spec.repo, config or spec.config, split or spec.split
    datasets = _datasets()
    where = f"hf://{repo}" + (f"/{config}" if config else "") + f"[{split}]"
    try:
        ds = datasets.load_dataset(repo, config, split=split, revision=revision, cache_dir=cache_dir)
    except Exception as e:  # noqa: BLE001 - network, auth and missing-dataset errors all end here
        raise HFLoadError(
            f"could not load {where}: {type(e).__name__}: {e}. "
            "Without network access, pass a local file instead (--data PATH)."
        ) from e
    return _task_from_rows(spec, ds, where, n)
