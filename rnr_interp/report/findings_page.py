"""The findings as a Markdown page (`findings.md`), written by the reproduction from its
`findings.json` and run folders: each claim with the paper's number, ours with its
interval and the verdict; the conditions that change a number (model, dtype, device,
threads, n, code commit), read from the run folders' manifests; and, when the root held
an earlier `findings.json`, each value that changed, old beside new.

The page is the measured record: nothing in it is typed by hand, and the command that
regenerates it is its first line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from rnr_interp.records import MANIFEST, read_json_file, write_text_atomic
from rnr_interp.report.reproduction import where_spent
from rnr_interp.report.text import interval

FINDINGS_PAGE = "findings.md"


def _value(row: dict[str, Any]) -> str:
    if row.get("value") is None:
        return "—"
    return f"{row['value']:.3f} {interval(row.get('ci'))}".strip()


def _cell(text: Any) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def _key(row: dict[str, Any]) -> tuple[str, str]:
    return row["claim"], row["scope"]


def conditions(root: Path) -> list[dict[str, Any]]:
    """One row per run folder under `root`: what it ran on and with what."""
    rows = []
    for manifest in sorted(root.rglob(MANIFEST)):
        m = read_json_file(manifest)
        config, env = m.get("config", {}), m.get("environment", {})
        facts, task = config.get("model_facts", {}), config.get("task", {})
        rows.append({
            "run": manifest.parent.relative_to(root).as_posix(),
            "kind": config.get("kind", ""),
            "model": facts.get("spec", config.get("model", "")),
            "dtype": facts.get("dtype", ""),
            "task": task.get("name", ""),
            "n": task.get("n_questions", ""),
            "device": env.get("device", "not recorded"),
            "threads": env.get("torch_threads") or "not recorded",
            "code": (env.get("code_commit") or "not recorded")[:12],
            "created": m.get("created", ""),
        })
    return rows


def findings_markdown(root: Path, profile: str, model: str, parts: dict[str, dict[str, Any]],
                      findings: Sequence[dict[str, Any]], previous: Sequence[dict[str, Any]] = ()) -> str:
    """The page's text (see the module docstring)."""
    old = {_key(r): r for r in previous}
    lines = [
        f"# Findings: the paper's claims on {model} (profile `{profile}`)",
        "",
        f"Written by `rnr reproduce --profile {profile} --out {root.as_posix()}` from `findings.json` and the run",
        "folders below it; rerunning that command (it resumes) rewrites this page. Verdict rules:",
        "[reproducing.md](reproducing.md). Beside a localisation or routing row that found nothing, the last",
        "column reads what a validation of the same model and task detects when the effect is planted.",
        "",
        "| claim | paper | scope | measured | value [95% CI] | n | verdict | planted effect this n detects |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in findings:
        lines.append("| " + " | ".join(_cell(x) for x in (r["claim"], r["paper"], r["scope"], r["measured"], _value(r),
                                                             r.get("n") if r.get("n") is not None else "", r["verdict"],
                                                             r.get("planted", "")))
                     + " |")
    lines += ["", "Why each verdict:", ""]
    lines += [f"- {_cell(r['claim'])} ({_cell(r['scope'])}): {_cell(r['why'])}" for r in findings]
    changed = [(old[_key(r)], r) for r in findings if _key(r) in old
               and (_value(old[_key(r)]) != _value(r) or old[_key(r)]["verdict"] != r["verdict"])]
    if changed:
        lines += ["", "## Changed since the previous findings in this folder", "",
                  "| claim | scope | before | now | verdict before | verdict now |", "|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_cell(x) for x in (new["claim"], new["scope"], _value(before), _value(new),
                                                        before["verdict"], new["verdict"])) + " |"
                  for before, new in changed]
    lines += ["", "## Cost per part", "", "| part | status | seconds | where |", "|---|---|---|---|"]
    for name, entry in parts.items():
        where = where_spent(entry) or ", ".join(entry.get("seconds_by_device", {}))
        lines.append(f"| {name} | {entry.get('status', '')} | {entry.get('seconds', 0):.0f} | {_cell(where)} |")
    rows = conditions(root)
    if rows:
        heads = list(rows[0])
        lines += ["", "## Conditions of each run", "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(_cell(row[h]) for h in heads) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_findings_page(root: Path, profile: str, model: str, parts: dict[str, dict[str, Any]],
                        findings: Sequence[dict[str, Any]], previous: Sequence[dict[str, Any]] = ()) -> Path:
    return write_text_atomic(root / FINDINGS_PAGE, findings_markdown(root, profile, model, parts, findings, previous))
