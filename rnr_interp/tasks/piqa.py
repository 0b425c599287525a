"""PIQA physical commonsense (ybisk/piqa JSON lines plus a labels file).

Rows {"goal", "sol1", "sol2"} sit in `valid.jsonl`; their labels (0 = sol1, 1 = sol2),
one per line, in the sibling `valid-labels.lst` (generally `<stem>-labels.lst`). The
loader puts each label into its row as "label", the shape HF rows already have.
`text` = goal, `choices` = (sol1, sol2), `answer` = "A"/"B", ids `piqa-<row index>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._io import get_index, get_str, iter_jsonl, parse_all, read_lines
from .base import LETTERS, DataFormatError, MultipleChoiceTask, Question


class PIQA(MultipleChoiceTask):
    name = "piqa"


def parse_row(obj: dict[str, Any], index: int) -> Question:
    gold = get_index(obj, "label", 2)
    return Question(
        id=f"piqa-{index}",
        text=get_str(obj, "goal"),
        answer=LETTERS[gold],
        choices=(get_str(obj, "sol1", allow_empty=True), get_str(obj, "sol2", allow_empty=True)),
        gold_index=gold,
    )


def default_labels_path(path: str | Path) -> Path:
    p = Path(path)
    return p.with_name(f"{p.stem}-labels.lst")


def _read_labels(path: Path) -> list[int]:
    labels = []
    for line_no, line in enumerate(read_lines(path), 1):
        if line.strip() not in ("0", "1"):
            raise DataFormatError(path, line_no, f"label must be 0 or 1, got {line.strip()!r}")
        labels.append(int(line))
    return labels


def load_piqa(path: str | Path, labels: str | Path | None = None) -> PIQA:
    labels_path = Path(labels) if labels is not None else default_labels_path(path)
    if not labels_path.is_file():
        raise FileNotFoundError(f"PIQA labels file {labels_path} not found (pass labels=...)")
    gold = _read_labels(labels_path)
    rows = list(iter_jsonl(path))
    if len(gold) != len(rows):
        # Name the first line that has no partner: a missing label or a surplus one.
        line = len(gold) + 1 if len(gold) < len(rows) else len(rows) + 1
        raise DataFormatError(
            labels_path, line, f"{len(gold)} labels for {len(rows)} rows of {path}"
        )
    with_labels = [(line_no, {**obj, "label": g}) for (line_no, obj), g in zip(rows, gold)]
    return PIQA(parse_all(path, with_labels, parse_row), source=str(path))
