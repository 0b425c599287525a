"""The paper's claims beside this model's numbers, read from the parts' run folders.

Every number here is read from a summary or table an analysis wrote; nothing is
recomputed except an interval on a count (Wilson) where a summary gives the count but
not the interval. Each claim has a stated threshold, and the verdict compares the
*interval* with it, so a small sample cannot claim either way:

- ``reproduced``: the whole 95% interval is on the paper's side of the threshold;
- ``not reproduced``: the whole interval is on the other side;
- ``not testable here``: no run measured it (the reason names what is missing), the
  interval spans the threshold at this sample size, or (localisation) the power to
  detect the paper's effect at this n is below 0.8 and the effect was not detected: the
  reason then says "not testable at this n", so no effect and no power are not mixed.

The routing claims are stated by the paper on point estimates per cell (random >=
structured "in every clean cell"), so they are judged on those, in the paper's units
(model-task cells; per space, comparisons of random with one search), with the
narrowest comparison's paired interval shown. Cells where no method beat greedy test
nothing and are counted apart, as are comparisons of two oracles neither of which is
above its chance null; a verdict the format-collapse exclusion would flip is not given.

A localisation or routing row that found nothing (not testable, not reproduced) says,
in ``planted``, what the instrument finds at this n when the effect is known to be
there: the validation run (``6_validation``, `analyses.validate`) of the same model and
task, its smallest planted strength detected (Wilson lower bound above `DETECTED`) per
analysis (repair:* beside localisation, route:* beside routing), and its nulls' false
positives; or the command that makes the missing validation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from rnr_interp.analyses.localise.steering import steering_beside_control
from rnr_interp.metrics import (
    DAMAGE_EFFECT, INDUCTION_EFFECT, MIN_POWER, REPAIR_EFFECT, RESCUE_EFFECT, PaperEffect, wilson_interval, wilson_power,
)
from rnr_interp.records import (
    AUDIT, COMPARE, FAILURES, MANIFEST, REPAIR, ROUTE, VALIDATE, AuditSummary, CompareSummary, RepairSummary, RunDir,
    RunFolderError, SteerSummary, ValidateSummary,
)
from rnr_interp.report.kinds import finished_runs
from rnr_interp.report.reproduction import ROUTE_CELLS, SCREEN
from rnr_interp.tasks.synthetic import parse_source

REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE = "reproduced", "not reproduced", "not testable here"
#: a row that measures and shows a number the paper reports but judges no claim on
REPORTED = "reported, not judged"
#: "little" gap recovery: the paper's six medians lie between -23.5% and +2.2%
LITTLE_RECOVERY = 0.25
#: "most" failures repaired, "little" damage (paper: 67.6-92.0% repair, 0-12% damage)
MOST_REPAIRED, LITTLE_DAMAGE = REPAIR_EFFECT.threshold, DAMAGE_EFFECT.threshold
#: reciprocal steering flips "most" (paper: -8v repairs 97.5%, +4v breaks 95%)
MOST_FLIPPED = RESCUE_EFFECT.threshold
#: "every newly realized answer was already base-reachable" (paper: 11-68 of 11-68)
ALREADY_REACHABLE = 0.8


@dataclass
class Finding:
    claim: str
    paper: str
    scope: str  # which cell / checkpoint
    measured: str  # what the number is, in words
    value: float | None
    ci: tuple[float, float] | None
    n: int | None
    verdict: str
    why: str
    #: beside an untestable or unreproduced localisation or routing row: the smallest
    #: planted effect a validation of this model and task detects (`planted_effect`)
    planted: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def at_least(value: float, ci: Sequence[float], threshold: float) -> tuple[str, str]:
    """Verdict of "value >= threshold" from its interval."""
    lo, hi = ci
    if lo >= threshold:
        return REPRODUCED, f"the whole interval is at or above {threshold:g}"
    if hi < threshold:
        return NOT_REPRODUCED, f"the whole interval is below {threshold:g}"
    return NOT_TESTABLE, f"the interval [{lo:.2f}, {hi:.2f}] spans {threshold:g} at this sample size"


def at_most(value: float, ci: Sequence[float], threshold: float) -> tuple[str, str]:
    """Verdict of "value <= threshold" from its interval."""
    lo, hi = ci
    if hi <= threshold:
        return REPRODUCED, f"the whole interval is at or below {threshold:g}"
    if lo > threshold:
        return NOT_REPRODUCED, f"the whole interval is above {threshold:g}"
    return NOT_TESTABLE, f"the interval [{lo:.2f}, {hi:.2f}] spans {threshold:g} at this sample size"


def _untestable(claim: str, paper: str, why: str, scope: str = "all cells") -> Finding:
    return Finding(claim, paper, scope, "", None, None, None, NOT_TESTABLE, why)


# -- Beside a row that found nothing: what this n detects when the effect is planted ------


VALIDATION_PART = "6_validation"
#: a planted strength counts as detected when its detection rate's 95% Wilson lower
#: bound is above this: more often found than not, at this n, whatever the seeds drew
DETECTED = 0.5


@dataclass(frozen=True)
class Measured:
    """The model and task a finding measured, as its run's manifest names them; `label`
    is the task's name as `rnr` loads it (the folder's: "arc" is both ARC splits' name)."""

    model: str
    task: str
    source: str
    label: str
    n: int | None

    @classmethod
    def of(cls, run: RunDir, label: str) -> "Measured":
        config = run.config
        task = config.get("task", {})
        return cls(str(config.get("model_facts", {}).get("spec", config.get("model", ""))),
                   str(task.get("name", "")).removesuffix("@base"), str(task.get("source", "")), label,
                   task.get("n_questions"))

    def data(self) -> str:
        """What tells this task's data from another's across machines and sizes: a data
        file's name (the folder differs by machine), a synthetic generator's parameters but n."""
        synthetic = parse_source(self.source)
        if synthetic is None:
            return Path(self.source).name
        name, params = synthetic
        return f"{name}{sorted((k, v) for k, v in params.items() if k != 'n')}"


def validation_of(validations: Sequence[RunDir], on: Measured) -> RunDir | None:
    """The finished validation run of `on`'s model and task on the same data (the one
    with the very same source first), or None."""
    same = [v for v in validations if (m := Measured.of(v, "")).model == on.model and m.task == on.task
            and m.data() == on.data()]
    same.sort(key=lambda v: Measured.of(v, "").source != on.source)
    return same[0] if same else None


def detects(run: RunDir, prefix: str) -> str:
    """What a validation run detects with its analyses named `prefix`*: per analysis the
    smallest strength (a multiple of the default plant) whose detection rate's Wilson
    lower bound is above `DETECTED`, or the largest tried when none is, with the rate,
    its interval and n, and how often its nulls named the planted location; how many
    planted organisms left no failure to localise, where any did; and the cells the
    model could not take, where any."""
    s: ValidateSummary = run.read_summary()
    table = run.read_table("detection")
    said = []
    for analysis, entry in sorted(s.by_analysis.items()):
        planted = table[(table["analysis"] == analysis) & (table["strength"] > 0)].sort_values("strength")
        if not analysis.startswith(prefix) or planted.empty:
            continue
        hit = planted[planted["lo"] > DETECTED]
        row = (hit if len(hit) else planted).iloc[0 if len(hit) else -1]
        rate = f"recovered {row['rate']:.2f} [{row['lo']:.2f}, {row['hi']:.2f}] of {int(row['n'])} organisms"
        found = (f"detects {row['strength']:g}x the default plant ({rate})" if len(hit) else
                 f"none of the strengths tried detected (largest {row['strength']:g}x the default plant: {rate})")
        null_lo, null_hi = entry["null_ci"]
        said.append(f"{analysis} {found}; its nulls named the planted location {entry['null_false_positive_rate']:.2f} "
                    f"[{null_lo:.2f}, {null_hi:.2f}] of {entry['n_null']} organisms")
    if said:  # a miss where the plant left no failure is the plant's (`validate.without_failure`)
        said += [f"{r['n_without_failure']} of its {r['n']} planted {kind} organisms left no failure to localise "
                 "(nothing there to find)"
                 for kind, r in sorted(s.recovery.items()) if r.get("n_without_failure")]
    # cells the model refused are no trials (`organisms.NotPlantable`), whether or not others ran
    said += [f"{len(r['not_planted'])} {kind} cells could not be planted in this model ({r['not_planted'][0]['why']})"
             for kind, r in sorted(s.recovery.items()) if r.get("not_planted")]
    head = f"validation {run.path.name} ({s.profile} profile, golds {s.gold}, {s.n_questions} questions)"
    return f"{head}: " + ("; ".join(said) if said else f"no {prefix}* analysis ran")


def planted_effect(root: Path, measured: Sequence[Measured], prefix: str) -> str:
    """`detects` for each task measured (labelled when several), from the validation runs
    under ``root/6_validation``, or the command that makes the missing one."""
    validations = finished_runs(root / VALIDATION_PART, VALIDATE)
    said = []
    for on in measured:
        run = validation_of(validations, on)
        said.append(detects(run, prefix) if run is not None else
                    f"no validation run for this model and task: rnr validate --model {on.model} --task {on.label}"
                    + (f" --n {on.n}" if on.n else "") + f" --out {(root / VALIDATION_PART / on.label).as_posix()}")
    return said[0] if len(said) == 1 else " ".join(f"[{on.label}] {text}" for on, text in zip(measured, said))


def beside_planted(rows: list[Finding], root: Path, measured: Sequence[Measured], prefix: str) -> list[Finding]:
    """`rows`, each that found nothing (not testable, not reproduced) with `planted_effect`."""
    for row in rows:
        if row.verdict in (NOT_TESTABLE, NOT_REPRODUCED) and measured:
            row.planted = planted_effect(root, measured, prefix)
    return rows


# -- The realization audit, read against chance ----------------------------------------


GAP_CLAIM = "a realization gap beyond chance: O_K - D above what the same samples reach by coincidence"
GAP_PAPER = "the paper reports O_K - D > 0 on every task, with no chance null"


def audit_findings(part: Path) -> list[Finding]:
    """Per audited task: the gap above the chance null under the strict grading (the
    headline of a new run), judged on its interval; the flexible grade and, for multiple
    choice asked circularly, the circular numbers shown beside."""
    out = []
    for run in finished_runs(part, AUDIT):
        s: AuditSummary = run.read_summary()
        null = s.null
        scope = f"{s.task}: {s.model}, {s.n_questions} q, K={s.k}, graded {s.headline}"
        if null is None:
            out.append(_untestable(GAP_CLAIM, GAP_PAPER, "the audit summary has no chance null (made before it; "
                                   "`rnr regrade` the run)", scope))
            continue
        other = s.beside()
        measured = (f"O_K {s.O_K:.3f}, D {s.D:.3f}, gap {s.gap:+.3f}; null ({null['method']}) O_K "
                    f"{null['O_K']:.3f}, D {null['D']:.3f}; O_K - null {null['O_K_minus_null']:+.3f} "
                    f"[{null['O_K_minus_null_ci'][0]:+.3f}, {null['O_K_minus_null_ci'][1]:+.3f}]")
        if other:
            beside = s.graded(other)
            measured += f"; {other}: O_K {beside['O_K']:.3f}, D {beside['D']:.3f}, gap {beside['gap']:+.3f}"
        circular = s.circular or {}
        if "O_K" in circular:
            measured += f"; circular ({len(circular.get('shifts', []))} shifts): O_K {circular['O_K']:.3f}, D {circular['D']:.3f}"
            if isinstance(circular.get("null"), dict):
                measured += f", its null O_K {circular['null']['O_K']:.3f}"
        value, ci = float(null["gap_above_null"]), (float(null["gap_above_null_ci"][0]), float(null["gap_above_null_ci"][1]))
        verdict, why = ((REPRODUCED, "the whole interval of the gap above the null is above 0") if ci[0] > 0 else
                        (NOT_REPRODUCED, "the whole interval of the gap above the null is at or below 0") if ci[1] <= 0 else
                        (NOT_TESTABLE, f"the interval [{ci[0]:.2f}, {ci[1]:.2f}] of the gap above the null spans 0 at this sample size"))
        if null.get("indistinguishable"):
            why += "; the reachable set is indistinguishable from chance at this n"
        out.append(Finding(GAP_CLAIM, GAP_PAPER, scope, measured, value, ci, s.n_questions, verdict, why))
    return out


# -- Experiment 1: routing and selection ---------------------------------------------


ROUTING_CLAIM = "random >= structured search in every clean cell"
ROUTING_PAPER = ("43/43 clean model-task cells; per space, comparisons with random >= search: native 46/46, "
                 "polar 23/23, skiponly 10/10; random - structured +2.7 to +37.6 points")
SELECTOR_CLAIM = "answer-blind selectors recover little of the oracle-greedy gap"
SELECTOR_PAPER = "median gap recovery -23.5% to +2.2% over clean cells (K=32)"
#: the paper's six selectors, as this package names them ("MCTS vote": majority over
#: the blind MCTS's routes; "genetic search", "hill climbing": those searches' votes)
PAPER_SELECTORS = ("self_verification", "genetic_vote", "majority", "confidence", "mcts_vote", "hill_climb_vote")


def routing_findings(part: Path) -> list[Finding]:
    """From the routing part's cross-cell aggregate (`routing.cells`), each row that
    found nothing beside what a validation of each routed task detects."""
    measured = [Measured.of(run, run.path.name) for run in finished_runs(part, ROUTE)]
    agg = part / ROUTE_CELLS
    if not (agg / MANIFEST).is_file() or not RunDir(agg).has_summary():
        return beside_planted(
            [_untestable(ROUTING_CLAIM, ROUTING_PAPER, "the routing part did not finish (no cross-cell aggregate)"),
             _untestable(SELECTOR_CLAIM, SELECTOR_PAPER, "the routing part did not finish (no cross-cell aggregate)")],
            part.parent, measured, "route:")
    run = RunDir(agg)
    collapsed = run.read_table("collapsed")
    note = f"; format-collapse cells left out: {', '.join(collapsed['cell'])}" if len(collapsed) else ""
    return beside_planted(
        [_random_vs_structured(run.read_table("model_task"), run.read_table("counts"), run.read_table("comparisons"), note),
         _selectors(run.read_table("selector_distribution"), note)], part.parent, measured, "route:")


def _holds(model_task: pd.DataFrame, baseline: str, scope: str) -> tuple[int, int, int]:
    """(holding, tested, untested) model-task cells for `baseline` in `scope`."""
    row = model_task[(model_task["baseline"] == baseline) & (model_task["scope"] == scope)]
    if row.empty:
        return 0, 0, 0
    r = row.iloc[0]
    return int(r["holding"]), int(r["tested"]), int(r["untested"])


def _per_space(counts: pd.DataFrame, baseline: str, scope: str) -> str:
    rows = counts[(counts["baseline"] == baseline) & (counts["scope"] == scope) & (counts["search"] == "all")
                  & (counts["space"] != "all")]
    return ", ".join(f"{r.space} {r.baseline_ge_search}/{r.comparisons}" for r in rows.itertuples())


def _random_vs_structured(model_task: pd.DataFrame, counts: pd.DataFrame, comparisons: pd.DataFrame, note: str) -> Finding:
    holding, tested, untested = _holds(model_task, "random", "clean")
    holding_all, tested_all, _ = _holds(model_task, "random", "all")
    if not tested_all:
        return _untestable(ROUTING_CLAIM, ROUTING_PAPER, f"no model-task cell where any method beat greedy above chance "
                           f"({untested} untested: every oracle equals greedy, or every comparison sets two oracles at "
                           f"chance level against each other, so random >= search could not fail)" + note)
    medians = counts[(counts["baseline"] == "random") & (counts["scope"] == "clean") & (counts["space"] == "all")
                     & (counts["search"] != "all")]
    measured = (f"random >= every search in {holding} of {tested} clean model-task cells ({untested} untested apart); "
                f"per space, comparisons with random >= search: {_per_space(counts, 'random', 'clean')}; "
                f"with format-collapse cells kept: {holding_all} of {tested_all}; median random - search "
                + ", ".join(f"{r.search} {r.median_diff:+.3f}" for r in medians.itertuples()))
    matched = _holds(model_task, "random_matched", "clean")
    if matched[1]:
        measured += (f"; random_matched (random at the searches' distances) >= every search in {matched[0]} of {matched[1]}, "
                     f"per space {_per_space(counts, 'random_matched', 'clean')}")
    random_clean = comparisons[(comparisons["baseline"] == "random") & ~comparisons["excluded"]]
    if "at_chance" in random_clean:
        measured += (f"; comparisons where neither oracle is above its chance null, counted apart: "
                     f"{int(random_clean['at_chance'].astype(bool).sum())} of {len(random_clean)}")
    tested_rows = random_clean[random_clean["informative"]]
    worst = tested_rows.sort_values("diff", kind="stable").iloc[0] if len(tested_rows) else None
    if worst is not None:
        measured += f"; smallest random - {worst['search']} {worst['diff']:+.3f} [{worst['lo']:+.3f}, {worst['hi']:+.3f}] ({worst['cell']})"
    clean_holds, all_holds = tested > 0 and holding == tested, holding_all == tested_all
    if not tested:
        verdict, why = NOT_TESTABLE, "no clean model-task cell where any method beat greedy with an oracle above chance"
    elif clean_holds != all_holds:
        verdict, why = NOT_TESTABLE, "the format-collapse exclusion decides the verdict, so none is given"
    elif clean_holds:
        verdict, why = REPRODUCED, ("random's oracle at matched K is at or above every structured search's in every tested "
                                    "model-task cell (point estimates, as the paper states it), with or without the excluded cells")
    else:
        verdict, why = NOT_REPRODUCED, f"a structured search beats random in {tested - holding} tested model-task cell(s)"
    value, ci = (float(worst["diff"]), (float(worst["lo"]), float(worst["hi"]))) if worst is not None else (None, None)
    return Finding(ROUTING_CLAIM, ROUTING_PAPER, f"{tested} clean model-task cells", measured, value, ci, tested,
                   verdict, why + note)


def _selectors(dist: pd.DataFrame, note: str) -> Finding:
    if dist["selector"].isin(PAPER_SELECTORS).any():  # older aggregates have other names
        dist = dist[dist["selector"].isin(PAPER_SELECTORS)]
    dist = dist.dropna(subset=["median"])
    if dist.empty:
        return _untestable(SELECTOR_CLAIM, SELECTOR_PAPER,
                           "gap recovery is undefined in every clean cell (oracle = greedy: no gap to recover)" + note)
    dist = dist.sort_values("median")
    best = dist.iloc[-1]
    measured = "median gap recovery over clean cells: " + ", ".join(f"{r.selector} {r.median:+.2f}" for r in dist.itertuples())
    value = float(best["median"])
    ok = value <= LITTLE_RECOVERY
    why = (f"every selector's median recovery is at most {LITTLE_RECOVERY:g}" if ok
           else f"{best['selector']} recovers a median {value:+.2f} of the gap (> {LITTLE_RECOVERY:g})")
    return Finding(SELECTOR_CLAIM, SELECTOR_PAPER, f"{int(best['cells'])} clean cells", measured, value,
                   (float(best["q25"]), float(best["q75"])), int(best["cells"]),
                   REPRODUCED if ok else NOT_REPRODUCED, why + " (the interval column is the best selector's quartiles over cells)" + note)


# -- Experiment 2: recognised but not generated ----------------------------------------


REPAIR_CLAIM = "silencing one MLP block repairs most recognised-but-not-generated failures with little damage"
REPAIR_PAPER = "MLP repair 67.6-92.0%, healthy damage 0-12% (6 cases)"
STEER_CLAIM = "reciprocal steering: -alpha v rescues failures, +alpha v induces them"
STEER_PAPER = "-8v repairs 97.5%, +4v breaks 95% of healthy questions"


def _rate(entry: dict[str, Any]) -> tuple[float, tuple[float, float], int]:
    """(rate, interval, n) of a localisation summary entry {rate, ci, n}."""
    return float(entry["rate"]), (float(entry["ci"][0]), float(entry["ci"][1])), int(entry["n"])


def with_power(verdict: str, why: str, effect: PaperEffect, n: int) -> tuple[str, str]:
    """A verdict read beside its power (`metrics.wilson_power`): below `MIN_POWER` an
    effect that was not detected is "not testable at this n" (too few questions to tell
    no effect from no power); a detected one stands."""
    power = wilson_power(effect, n)
    if verdict != REPRODUCED and not power >= MIN_POWER:
        return NOT_TESTABLE, (f"not testable at this n: power {power:.2f} < {MIN_POWER:g} to detect {effect.paper} "
                              f"with {n} questions ({why})")
    return verdict, f"{why}; power {power:.2f} at n = {n}"


def combine(verdicts: Sequence[str]) -> str:
    """One verdict from several parts of a claim: all alike, else "not reproduced" when
    any is, else "not testable here"."""
    return verdicts[0] if len(set(verdicts)) == 1 else (NOT_REPRODUCED if NOT_REPRODUCED in verdicts else NOT_TESTABLE)


def localisation_findings(part: Path) -> list[Finding]:
    """Per localised cell, repair and steering; each row that found nothing beside what a
    validation of the cell's task detects (of every screened task when no cell passed)."""
    repairs = finished_runs(part, REPAIR)
    if not repairs:
        screened = (part / SCREEN / MANIFEST).is_file() and RunDir(part / SCREEN).has_summary()
        why = ("no cell passed the failure screen" if screened else "the failure screen did not finish")
        measured = [Measured.of(run, run.path.parent.name) for run in finished_runs(part, FAILURES)]
        return beside_planted([_untestable(REPAIR_CLAIM, REPAIR_PAPER, why), _untestable(STEER_CLAIM, STEER_PAPER, why)],
                              part.parent, measured, "repair:")
    # the cell's folder names the split ("arc" is ARC-Easy's and ARC-Challenge's task name)
    return [row for run in repairs for row in beside_planted(_cell_findings(run), part.parent,
                                                             [Measured.of(run, run.path.parent.name)], "repair:")]


def _cell_findings(run: RunDir) -> list[Finding]:
    """Repair and steering on the cell of one repair run."""
    s: RepairSummary = run.read_summary()
    scope = f"{s.model} / {run.path.parent.name}" + (" (circular)" if (s.circular or {}).get("on") else "")
    steering = _steering_finding(run.path.parent / "steer", scope)
    at = (s.at_chosen_layer or {}).get("mlp")
    if at is None:
        return [_untestable(REPAIR_CLAIM, REPAIR_PAPER, f"{_cohort_size(s)}: no MLP block repaired anything on "
                            "the selection part", scope), steering]
    layer, (r, r_ci, r_n), (d, d_ci, d_n) = int(at["layer"]), _rate(at["repair"]), _rate(at["damage"])
    if r_n == 0 or d_n == 0:
        return [_untestable(REPAIR_CLAIM, REPAIR_PAPER, f"MLP {layer} chosen, but the held-out "
                            f"{'failure set' if r_n == 0 else 'panel'} is empty", scope), steering]
    v_r, why_r = with_power(*at_least(r, r_ci, MOST_REPAIRED), REPAIR_EFFECT, r_n)
    v_d, why_d = with_power(*at_most(d, d_ci, LITTLE_DAMAGE), DAMAGE_EFFECT, d_n)
    return [Finding(
        REPAIR_CLAIM, REPAIR_PAPER, scope,
        f"MLP {layer}, held out: repair {r:.2f} [{r_ci[0]:.2f}, {r_ci[1]:.2f}] of {r_n}, "
        f"damage {d:.2f} [{d_ci[0]:.2f}, {d_ci[1]:.2f}] of {d_n}" + _beside(at), r, r_ci, r_n,
        combine([v_r, v_d]), f"repair: {why_r}; damage: {why_d}"), steering]


def _cohort_size(s: RepairSummary) -> str:
    """A repair summary's failure set and healthy panel, in words (an empty panel leaves
    damage unmeasured, whatever the repair)."""
    split, circular = s.split or {}, (s.circular or {}).get("on")
    right = "right under every shift of the options" if circular else "right"
    panel = (f"{s.n_panel} healthy questions" if s.n_panel
             else f"no healthy question (no deployed answer {right}), so damage is unmeasured")
    locked = (s.circular or {}).get("n_letter_locked")
    return (f"{s.n_failure} failures ({split.get('n_failure_selection', 0)} choose, "
            f"{split.get('n_failure_heldout', 0)} held out)"
            + (f" after {locked} letter-locked recognised questions left out" if locked else "") + f", {panel}")


def _beside(at: dict[str, Any]) -> str:
    """The selection-part and all-question rates of a chosen block, labelled, for
    summaries that carry them."""
    parts = []
    for label, key in (("selection part (chose the block)", "selection"), ("all questions", "all")):
        if key in at["repair"] and key in at["damage"]:
            r, d = at["repair"][key], at["damage"][key]
            parts.append(f"{label}: repair {r['rate']:.2f} of {r['n']}, damage {d['rate']:.2f} of {d['n']}")
    return f" ({'; '.join(parts)})" if parts else ""


#: the alpha each direction is judged at, fixed before looking, because the steering
#: rates exist on the held-out questions only and the best alpha over the grid, picked on
#: them, would be optimistic. On the RMS scale (`steering.ALPHA_UNITS`): rescue at one
#: residual RMS norm, induction at half of it, the paper's 2:1 ratio of -8v to +4v; the
#: paper does not give the scale of v, so its numbers fix the ratio, not the strength.
#: Raw-unit runs are judged at the paper's numbers as multiples of v.
JUDGED_ALPHA = {"rms": {"rescue": 1.0, "induction": 0.5}, "raw": {"rescue": 8.0, "induction": 4.0}}
STEER_EFFECTS = {"rescue": RESCUE_EFFECT, "induction": INDUCTION_EFFECT}


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def steer_alpha_unit(run: RunDir) -> str:
    """The unit a steering run's alphas are in (its config's `alpha_unit`), which decides
    the alphas its verdict is read at."""
    if "alpha_unit" not in run.config:
        raise RunFolderError(f"{run.path}: a steering run written before runs recorded their alpha unit "
                             "(an earlier rnr_interp 0.1); rerun it")
    if (unit := str(run.config["alpha_unit"])) not in JUDGED_ALPHA:
        raise RunFolderError(f"{run.path}: steered in alpha unit {unit!r}; the paper's claim is judged in "
                             f"{' or '.join(JUDGED_ALPHA)} units")
    return unit


def _steering_finding(folder: Path, scope: str) -> Finding:
    if not (folder / MANIFEST).is_file() or not RunDir(folder).has_summary():
        return _untestable(STEER_CLAIM, STEER_PAPER, "the steering run did not finish", scope)
    run = RunDir(folder)
    s: SteerSummary = run.read_summary()
    if s.skipped is not None:
        return _untestable(STEER_CLAIM, STEER_PAPER, f"steering skipped: {s.skipped}", scope)
    unit = steer_alpha_unit(run)
    beside = steering_beside_control(run)
    table = beside if beside is not None else run.read_table("steering")
    table = table[table["alpha"] > 0]
    if table.empty:
        return _untestable(STEER_CLAIM, STEER_PAPER, "no alpha > 0 in the steering grid", scope)
    parts, verdicts, lows, best, judged = [], [], [], [], []
    symbol = " RMS" if unit == "rms" else "v"
    for direction in ("rescue", "induction"):
        sub = table[table["direction"] == direction]
        # the alpha fixed in advance when the grid has it, else the grid's largest
        at = sub[sub["alpha"] == JUDGED_ALPHA[unit][direction]]
        row = (at if not at.empty else sub[sub["alpha"] == sub["alpha"].max()]).iloc[0]
        rate, n = float(row["rate"]), int(row["n"])
        ci = ((float(row["lo"]), float(row["hi"])) if {"lo", "hi"} <= set(sub.columns)
              else wilson_interval(round(rate * n), n))
        verdict = with_power(*at_least(rate, ci, MOST_FLIPPED), STEER_EFFECTS[direction], n)
        sign = "-" if direction == "rescue" else "+"
        judged.append(f"{sign}{row['alpha']:g}{symbol}")
        measured = f"{direction} {rate:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] of {n} at {judged[-1]}"
        if beside is not None:
            chance = float(row["random_rate"])
            measured += f" (a random direction of the same length: {chance:.2f})"
            if verdict[0] == REPRODUCED and ci[0] <= chance:
                verdict = (NOT_TESTABLE, f"a random direction of the same length flips {chance:.2f} at {judged[-1]}, "
                                         f"within v's interval: the flips are not v's ({verdict[1]})")
        verdicts.append(verdict)
        lows.append((rate, ci, n))
        parts.append(measured)
        top = sub.loc[sub["rate"].idxmax()]
        best.append(f"{direction} {float(top['rate']):.2f} at {sign}{top['alpha']:g}{symbol}")
    verdict = combine([v for v, _ in verdicts])
    weaker = min(lows, key=lambda x: x[0])
    scale = (f"judged at {' and '.join(judged)}: alpha in residual RMS norms along unit v (|v| "
             f"{_or_nan(s.v_norm):.2f}, RMS norm {_or_nan(s.residual_rms):.2f}), fixed in "
             f"advance at -{JUDGED_ALPHA['rms']['rescue']:g} and +{JUDGED_ALPHA['rms']['induction']:g} (the paper's 2:1 "
             "ratio of -8v to +4v; the paper does not give the scale of v, so its numbers fix the ratio, not the "
             "strength), or the grid's largest alpha without them"
             if unit == "rms" else
             f"judged at {' and '.join(judged)}: alpha in raw multiples of the unnormalised v (no stated scale: |v| "
             "varies by cell), the paper's -8v and +4v, or the grid's largest alpha without them, fixed in advance")
    control = "" if beside is not None else "; no random-direction control (a run made before it)"
    return Finding(STEER_CLAIM, STEER_PAPER, f"{scope}, layer {s.layer}",
                   "; ".join(parts) + f" (best over the grid, picked on the same questions: {'; '.join(best)}){control}",
                   weaker[0], weaker[1], weaker[2], verdict,
                   "; ".join(f"{d}: {w}" for d, (_, w) in zip(("rescue", "induction"), verdicts)) + f" ({scale})")


# -- Experiment 3: where trained gains come from ------------------------------------------


RLVR_REACHABLE = "RLVR's newly realized answers were already base-reachable"
RLVR_REACHABLE_PAPER = "all of them (11-68 per cell, 4 clean cells)"
RLVR_SHRINK = "RLVR may shrink reachability (O_K does not grow)"
RLVR_SHRINK_PAPER = "O change +0.0 to -13.3 points (DAPO: 96.0 -> 82.7)"
SFT_WIDEN = "SFT may widen reachability (O_K grows)"
SFT_WIDEN_PAPER = "OLMo thinking-SFT / instruct raise both D and O"


def checkpoint_findings(part: Path) -> list[Finding]:
    found = {run.path.name.removeprefix("compare_"): run.read_summary() for run in finished_runs(part, COMPARE)}
    out = []
    grpo = found.get("grpo")
    if grpo is None:
        out += [_untestable(RLVR_REACHABLE, RLVR_REACHABLE_PAPER, "no GRPO comparison finished", "GRPO"),
                _untestable(RLVR_SHRINK, RLVR_SHRINK_PAPER, "no GRPO comparison finished", "GRPO")]
    else:
        out += [_gained_from(grpo), _o_change(grpo, RLVR_SHRINK, RLVR_SHRINK_PAPER, "GRPO", shrink=True)]
    sft = found.get("sft")
    out.append(_untestable(SFT_WIDEN, SFT_WIDEN_PAPER, "no SFT comparison finished", "SFT") if sft is None
               else _o_change(sft, SFT_WIDEN, SFT_WIDEN_PAPER, "SFT", shrink=False))
    out += [_prompt_format(s, recipe.upper()) for recipe, s in found.items()]
    return out


PROMPT_CLAIM = "prompt-format control: part of a trained gain is the prompt format's"
PROMPT_PAPER = "a shared base prompt keeps 41.4-50.0% of the native-format gain"


def _prompt_format(s: CompareSummary, label: str) -> Finding:
    """The share of the D gain kept when the trained model is asked in the base prompt
    format. A ratio of two paired changes has no interval of its own, so this row
    reports and does not judge."""
    shared = s.shared_prompt
    formats = s.prompt_formats or {}
    if not shared:
        why = ("base and trained asked in the same prompt format: no format effect to separate"
               if formats.get("same") else "no shared-prompt audit was run")
        return _untestable(PROMPT_CLAIM, PROMPT_PAPER, why, _scope(s, label))
    d = shared["D"]
    share = d.get("share_retained")
    measured = (f"D change on the base prompt {d['shared_change']:+.3f} [{d['shared_change_ci'][0]:+.3f}, "
                f"{d['shared_change_ci'][1]:+.3f}] vs native {d.get('native_change', float('nan')):+.3f}")
    return Finding(PROMPT_CLAIM, PROMPT_PAPER, _scope(s, label), measured, share, None, s.n_questions,
                   REPORTED, "the share retained is a ratio of two paired changes with no interval of its own; "
                                 "the changes and their intervals are shown")


def _scope(s: CompareSummary, label: str) -> str:
    return f"{label}: {s.base_model} -> trained, {s.task}, {s.n_questions} q, K={s.k}"


def _gained_from(s: CompareSummary) -> Finding:
    """Judged at the largest budget the budget control sampled when it ran (the share
    of gained answers the base model reaches grows with K; the paper probes at K >=
    200), with the curve's trend; else at the audit's K."""
    src = (s.budget_control or {}).get("gained_source") or {}
    if src.get("n_gained") and src.get("curve"):
        last = src["curve"][-1]
        reach, n, ci = int(last["base_reachable"]), int(last["n_gained"]), tuple(last["ci"])
        verdict, why = at_least(reach / n, ci, ALREADY_REACHABLE)
        curve = ", ".join(f"K={c['k']} {c['share']:.2f}" + (f" (chance {c['null_share']:.3f})" if "null_share" in c else "")
                          for c in src["curve"])
        return Finding(RLVR_REACHABLE, RLVR_REACHABLE_PAPER, _scope(s, "GRPO"),
                       f"{reach} of {n} gained answers base-reachable at K={last['k']} (the control's largest budget, "
                       f"fresh base samples); the share {src.get('trend', '')}; curve: {curve}; the audit at "
                       f"K={s.k}: {int(s.gained_from['base_reachable'])} of {n}",
                       reach / n, ci, n, verdict, f"{why} (at K={last['k']}; the paper's K is at least 200)")
    reach, unreach = int(s.gained_from["base_reachable"]), int(s.gained_from["base_unreachable"])
    n = reach + unreach
    if n == 0:
        return _untestable(RLVR_REACHABLE, RLVR_REACHABLE_PAPER, "training realized no new answer", _scope(s, "GRPO"))
    share = reach / n
    ci = wilson_interval(reach, n)
    verdict, why = at_least(share, ci, ALREADY_REACHABLE)
    return Finding(RLVR_REACHABLE, RLVR_REACHABLE_PAPER, _scope(s, "GRPO"),
                   f"{reach} of {n} gained answers were base-reachable at K={s.k} (no budget-control curve)",
                   share, ci, n, verdict, why)


def _o_change(s: CompareSummary, claim: str, paper: str, label: str, shrink: bool) -> Finding:
    m = s.stats["O_K"]
    ci = (float(m["change_ci"][0]), float(m["change_ci"][1]))
    change = float(m["change"])
    measured = f"O_K {m['base']:.3f} -> {m['trained']:.3f} (change {change:+.3f}); D {s.stats['D']['base']:.3f} -> {s.stats['D']['trained']:.3f}"
    grading, other = s.headline, s.beside()
    measured += f" (graded {grading})"
    if other:
        o = s.graded(other)["stats"]["O_K"]
        measured += f"; {other}: O_K {o['base']:.3f} -> {o['trained']:.3f} (change {o['change']:+.3f})"
    if shrink:
        verdict, why = at_most(change, ci, 0.0)
    else:
        lo, hi = ci
        verdict, why = ((REPRODUCED, "the whole interval is above 0") if lo > 0 else
                        (NOT_REPRODUCED, "the whole interval is at or below 0") if hi <= 0 else
                        (NOT_TESTABLE, f"the interval [{lo:.2f}, {hi:.2f}] spans 0 at this sample size"))
    return Finding(claim, paper, _scope(s, label), measured, change, ci, s.n_questions, verdict, why)


# -- all of them ------------------------------------------------------------------------


def findings(root: Path) -> list[Finding]:
    """Every claim's row, from the run folders under `root` (parts that did not run
    give "not testable here" rows saying so)."""
    root = Path(root)
    return [*audit_findings(root / "1_audit"), *routing_findings(root / "2_routing"), *localisation_findings(root / "4_localisation"),
            *checkpoint_findings(root / "5_checkpoints")]


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x))


def as_records(rows: Sequence[Finding]) -> list[dict[str, Any]]:
    """JSON-ready rows (NaN -> None)."""
    out = []
    for f in rows:
        d = f.to_dict()
        d["value"] = d["value"] if finite(d["value"]) else None
        d["ci"] = list(d["ci"]) if d["ci"] is not None and all(finite(x) for x in d["ci"]) else None
        out.append(d)
    return out


__all__ = ["Finding", "findings", "planted_effect", "VALIDATION_PART", "as_records", "at_least", "at_most", "REPRODUCED",
           "NOT_REPRODUCED", "NOT_TESTABLE", "REPORTED"]
