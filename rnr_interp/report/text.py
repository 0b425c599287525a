"""Summaries in words: the chance baselines, answer changes and the letter-permutation
control of a multiple-choice summary as lines of text, the same for the command line
and the report pages. The numbers come from `metrics`; only their wording lives here."""

from __future__ import annotations

from typing import Any


def interval(ci: Any, missing: str = "") -> str:
    """A 95% interval as ``[lo, hi]`` at three decimals; `missing` when there is none."""
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci is not None and len(ci) == 2 else missing


def chance_lines(chance: dict[str, Any]) -> list[str]:
    """`chance_baselines` as the lines every summary prints (CLI and report alike)."""
    k = chance.get("k")
    o_label = f"O_{k}" if k else "O_K"

    def pair(which: str) -> str:
        base = chance[which]
        o_k = f", {o_label} {base['O_K']:.3f}" if base.get("O_K") is not None else ""
        return f"D {base['D']:.3f}{o_k}"

    counts = ", ".join(f"{o} {n}" for o, n in chance["deployed_counts"].items() if n)
    lines = [
        f"chance, uniform guessing:                  {pair('uniform')}",
        f"chance, guessing like the deployed answers: {pair('deployed_distribution')}",
        f"deployed answers: {counts}",
    ]
    if chance.get("warning"):
        lines.append(f"warning: {chance['warning']}")
    return lines


def answer_change_line(label: str, changes: dict[str, Any]) -> str:
    """`answer_changes` as one line (CLI and report alike)."""
    moved = ", ".join(f"{a} {n}" for a, n in changes["after_counts"].items())
    return (f"{label}: {changes['changed']} of {changes['n']} answers changed: {changes['to_gold']} to the gold "
            f"option, {changes['to_other']} to another or none (new answers: {moved or 'none'}; "
            f"{changes['to_gold_by_chance']:.1f} to gold expected if they fell on the gold as often as these land)")


def permutation_lines(control: dict[str, Any]) -> list[str]:
    """A summary's `permutation_control` (`readings.permutation_summary`) as the lines the
    CLI prints and the report shows: what was rotated, the rotated baseline, per
    intervention its rotated repair rate beside the unrotated one and where its
    repairs went under rotation, and how to read that."""
    if "skipped" in control:
        return [f"permutation control: none ({control['skipped']})"]

    def rate(p: dict[str, Any]) -> str:
        return f"{p['k']} of {p['n']} ({p['rate']:.3f} [{p['ci'][0]:.3f}, {p['ci'][1]:.3f}])" if p["n"] else "n/a (0 questions)"

    lines = [f"permutation control: {control['rotation']}",
             f"  rotated, no intervention, right: {rate(control['baseline'])}"]
    for probe, c in control["probes"].items():
        r = c["repairs"]
        lines += [f"  {probe}: right as asked {rate(c['unrotated_repair'])}; right with options rotated {rate(c['repair'])} "
                  "(95% Wilson)",
                  f"    of its {r['n']} unrotated repairs, under rotation {r['follow_content']} answer the moved gold "
                  f"(follow the content), {r['follow_position']} the letter that was gold (follow the position), "
                  f"{r['other']} another letter or none",
                  "    " + answer_change_line("rotated answers vs rotated deployed", c["answer_changes"])]
    lines.append(f"  reading: {control['reading']}")
    return lines


def chance_blocks(chance: Any) -> dict[str, dict[str, Any]]:
    """A summary's `chance` field by label: {"": block} for one run, {"base": ...,
    "trained": ...} for a comparison; {} when it has none."""
    if not isinstance(chance, dict):
        return {}
    if "uniform" in chance:
        return {"": chance}
    return {str(label): block for label, block in chance.items() if isinstance(block, dict)}


# -- deployable votes and the selection gap ----------------------------------------
