"""No module of the package grows past 450 lines unless the README's Layout says why it
is still one idea: an "over 450 lines" sentence in its own entry, or in its folder's
entry naming it (in the same clause: after the last ";" before it, or up to the next
";" or ")" after it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 450
#: how far before "over 450" a module's name may stand in its clause
BEFORE = 100


def layout_entries() -> dict[str, str]:
    """Each Layout line that starts with a path (`rnr_interp/...`, or a module indented
    under its folder), with its continuation lines, as path -> text."""
    block = ROOT.joinpath("README.md").read_text().split("## Layout", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    folder, head = "", None
    for line in block.splitlines():
        if m := re.match(r"(rnr_interp/\S*)\s", line + " "):
            head = m.group(1)
            folder = head if head.endswith("/") else folder
        elif (m := re.match(r"  (\w+\.py)\s", line)) and folder:
            head = folder + m.group(1)
        elif not line.startswith(" "):
            head = None
            continue
        if head is not None:
            entries[head] = entries.get(head, "") + " " + line.strip()
    return entries


def explained(module: str, entries: dict[str, str]) -> bool:
    stem = Path(module).stem
    for head, text in entries.items():
        if not module.startswith(head):
            continue
        for m in re.finditer("over 450", text):
            before = text[max(0, m.start() - BEFORE):m.start()].rsplit(";", 1)[-1]
            after = re.split(r"[;)]", text[m.end():], maxsplit=1)[0]
            if head == module or re.search(rf"\b{re.escape(stem)}\.py\b|\b{re.escape(stem)} \(", before + after):
                return True
    return False


def test_every_long_module_says_why_it_is_one_idea():
    entries = layout_entries()
    long = [str(p.relative_to(ROOT)) for p in sorted(ROOT.joinpath("rnr_interp").rglob("*.py"))
            if len(p.read_text().splitlines()) > LIMIT]
    assert long, "the check reads no module: the package moved?"
    missing = [m for m in long if not explained(m, entries)]
    assert not missing, f"over {LIMIT} lines with no sentence in the README's Layout saying why: {missing}"


def test_the_check_reads_the_layout():
    """The parse finds entries of both shapes, and a module no entry explains is caught."""
    entries = layout_entries()
    assert "rnr_interp/records/" in entries and "rnr_interp/report/kinds.py" in entries
    assert explained("rnr_interp/interventions.py", entries)
    assert not explained("rnr_interp/cli.py", entries)
    # named in its folder's entry, but not in the clause that says "over 450"
    assert not explained("rnr_interp/analyses/localise/repair.py", entries)
