"""The routing audit's summary and tables, from a route run's records only: oracle
curves, oracles at K with their chance nulls, baseline - search differences, the
selectors' picks and their gap recovery, the exclusion rule."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy.stats import norm

from rnr_interp.metrics import (
    bootstrap_ci, oracle_curve_after_first, paired_diff_ci, question_scores, selection_summary, unparsed_rate, vote_matrix,
    wilson_interval,
)
from rnr_interp.models import LoadedModel
from rnr_interp.grading import graded, graded_answers, other_grading, question_null, null_summary, regrade, unfinished_rate, unfinished_warning
from rnr_interp.records import DEPLOYED, ROUTE, ProbeLabel, RouteSummary, RunDir, RunFolderError
from rnr_interp.analyses.routing.config import (BLIND_SEARCHES, CANDIDATE_SELECTORS, SEARCH_SELECTORS, STRUCTURED, VOTES,
                                                RouteConfig, above_chance, draws_at_random, matched_control,
                                                route_config_of)
from rnr_interp.analyses.routing.evaluator import verify_rows
from rnr_interp.analyses.routing.layers import LAYER_ACTIONS, best_routes, route_layers, route_of
from rnr_interp.analyses.routing.search import round_size
from rnr_interp.analyses.routing.selectors import select
from rnr_interp.analyses.routing.spaces import make_space
from rnr_interp.tasks import reload_task
from rnr_interp.tasks.base import Task


def summarize_so_far(run: RunDir, out: str | Path) -> RouteSummary:
    """A route run's summary over the chunks it has written so far, without touching the
    run (it may still be going): its records are copied into a new run folder `out`
    (`RunDir.snapshot`), which gets the summary and tables a finished run gets, over
    those questions. For runs that take hours (GSM8K answers on a CPU). No model; the
    task is reloaded from the file the run names, for the golds of the chance nulls
    (where it cannot be, the summary goes without them and says so)."""
    cfg = route_config_of(run)
    if not run.done_question_ids():
        raise RunFolderError(f"{run.path}: no chunk written yet, nothing to summarise")
    snap = run.snapshot(out)  # counted from the copy: the run may write a chunk meanwhile
    try:
        task, why = reload_task(run.config["task"]), None
    except (OSError, ValueError, RunFolderError) as exc:
        task, why = None, f"chance nulls: the run's task cannot be reloaded here ({exc})"
    summary = summarize_routes(snap, cfg, task=task)
    missing = [*(summary.missing or ()), why] if why is not None else summary.missing
    return snap.write_summary(summary.but(
        missing=missing, snapshot={"of": str(run.path.resolve()), "questions_done": len(snap.done_question_ids()),
                                   "questions_total": (run.config.get("task") or {}).get("n_questions")}))


def _candidates(records: pd.DataFrame, probe: str, qids: Sequence[str]) -> list[pd.DataFrame]:
    """Each question's candidates of one probe, in evaluation order."""
    by_q = {qid: g.sort_values("candidate").reset_index(drop=True) for qid, g in records[records.probe == probe].groupby("question_id", sort=False)}
    missing = [q for q in qids if q not in by_q]
    if missing:
        raise ValueError(f"questions without {probe!r} candidates: {missing[:5]}")
    return [by_q[q] for q in qids]


def _prefix_oracle(cands: list[pd.DataFrame], budget: int, exchangeable: bool) -> np.ndarray:
    """(questions, budget): o_i after b evaluations. Random routes after the full path are
    exchangeable, so their curve is the unbiased pass@k with the full path always in;
    an adaptive search's curve is the running best in its own evaluation order."""
    out = np.zeros((len(cands), budget))
    ks = np.arange(1, budget + 1)
    for i, g in enumerate(cands):
        correct = g["correct"].astype(bool).to_numpy()
        if exchangeable:
            out[i] = oracle_curve_after_first(bool(correct[0]), len(correct) - 1, int(correct[1:].sum()), ks)
        else:
            running = np.maximum.accumulate(correct[:budget].astype(float))
            out[i, :len(running)] = running
            out[i, len(running):] = running[-1] if len(running) else 0.0
    return out


def _curve_rows(cell: str, method: str, kind: str, values: np.ndarray, seed: int) -> list[dict[str, Any]]:
    lo, hi = bootstrap_ci(values, seed=seed)
    return [{"cell": cell, "method": method, "kind": kind, "budget": b + 1, "accuracy": float(v), "lo": float(l), "hi": float(h)}
            for b, (v, l, h) in enumerate(zip(values.mean(0), np.atleast_1d(lo), np.atleast_1d(hi)))]


def verification_stored(run: RunDir) -> bool:
    """Whether a route run's records hold its self-verification scores (runs made
    before they were stored do not)."""
    return bool(run.read_records()["probe"].str.startswith("verify:").any())


def _verify_tables(records: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """Stored self-verification scores: per verified probe label, per question, answer -> score."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for probe, g in records[records.probe.str.startswith("verify:")].groupby("probe", sort=False):
        source = str(probe).removeprefix("verify:")
        out[source] = {qid: dict(zip(h.extracted, h.logprob)) for qid, h in g.groupby("question_id", sort=False)}
    return out


def summarize_routes(run: RunDir, cfg: RouteConfig, grading: str | None = None, target: RunDir | None = None,
                     task: Task | None = None, lm: LoadedModel | None = None) -> RouteSummary:
    """Per cell: oracle curves with intervals, the deployable votes along them, oracle@K
    and mean edit distance per method, random - structured and random_matched -
    structured at K (Newcombe paired, and two-way: `two_way_ci`), and each selector's
    accuracy, selection gap and gap recovery (paired), all under `grading` (default:
    the run's), with the deployed accuracy, oracles@K and selector accuracies under the
    other grading beside (`summary.strict` or `.flexible`), the chance null of the temperature probe
    and of each route oracle, where the gains are (`layers`), and each probe's
    unfinished rate. Tables (under `grading`): route_curves, route_cells,
    route_distances, selectors, route_layers, route_questions, written to `target`
    (default: the run).

    The summary's fields: `route_summary`.

    Reads the records only. Records of runs made before both grades were recorded get
    their strict grade from their texts when `task` is given (`grading.regrade`), and
    before self-verification scores were stored, from `lm` when it is given (`rnr
    regrade` passes both); without them those parts are left out and named in
    `summary.missing`."""
    grading = grading or run.grading
    records = run.read_records()
    if task is not None:
        records = regrade(records, task)
    both = not records["correct_strict"].isna().any()
    if grading == "strict" and not both:
        raise RunFolderError(f"{run.path}: its records hold no strict grades (made before they were recorded); "
                             "`rnr regrade RUN` reads them from the texts")
    verify = _verify_tables(records)
    headline = graded(records, grading)  # a copy of the records: made once
    t_scores = question_scores(headline, "temperature")
    qids = list(t_scores.index)
    rand_labels = {space: str(ProbeLabel.route(space, "random")) for space in cfg.spaces}
    if "temperature" not in verify and lm is not None and task is not None:
        # a run from before the scores were stored (experiments/runs/gsm8k40): the model scores them now
        by_id = {q.id: q for q in task.questions}
        rows = records[records.probe.isin(["temperature", *rand_labels.values()])].to_dict("records")
        verify = _verify_tables(pd.DataFrame(verify_rows(lm, task, [by_id[q] for q in qids], rows,
                                                         ["temperature", *rand_labels.values()])))
    # The selectors' choices are answer-blind: made once, then graded either way.
    choices = {"temperature": _selector_choices(_candidates(records, "temperature", qids), {}, verify.get("temperature"))}
    for space, label in rand_labels.items():
        choices[space] = _selector_choices(
            _candidates(records, label, qids),
            {name: _candidates(records, str(ProbeLabel.route(space, name)), qids) for name in BLIND_SEARCHES},
            verify.get(label))
    collapse = full_path_unparsed(records, qids, task, grading)
    headline_part, tables = _graded_routes(headline, run.config, cfg, choices, collapse)
    missing = []
    if "temperature" not in verify:
        missing.append("self_verification: these records hold no stored self-verification scores")
    if collapse[1] != grading:
        missing.append(f"exclusion rule: the {grading} parse of the full path needs the task's file; the {collapse[1]} "
                       "parse was read")
    other = other_grading(grading)
    beside = _graded_routes(graded(records, other), run.config, cfg, choices, collapse)[0] if both else None
    if not both:
        missing.append(f"{other}: these records hold no strict grades (`rnr regrade` reads them)")
    null = None
    if task is not None:
        found = question_null(headline, task, "temperature", grading, cfg.samples, seed=cfg.seed)
        null = null_summary(t_scores["d"], t_scores["o"], *found) if found is not None else None
        _route_nulls(headline, task, grading, cfg, headline_part, tables)
    n_layers = int(run.config["model_facts"]["n_layers"])
    tables["route_layers"] = route_layers(headline, cfg.spaces, n_layers, qids, task, grading, cfg.seed)
    tables["route_questions"] = best_routes(headline, cfg.spaces, n_layers, qids)
    unfinished = {p: unfinished_rate(records, p) for p in dict.fromkeys(records["probe"]) if not str(p).startswith("verify:")}
    for name, table in tables.items():
        (target or run).write_table(name, table)
    return route_summary(headline_part, grading, beside, null, layers_summary(tables["route_layers"]), unfinished, missing,
                         where=f"{run.path} route summary")


def route_summary(headline: dict[str, Any], grading: str, beside: dict[str, Any] | None, null: dict[str, Any] | None,
                  layers: dict[str, Any], unfinished: dict[str, float], missing: list[str], *,
                  where: str = "route summary") -> RouteSummary:
    """The route summary (summary.json of a route run), checked against `RouteSummary`
    (`where` names it in a refusal): its every field, in one place.

    From `_graded_routes` under the headline grading (`headline`): kind, model, task, k
    (temperature samples), budget (route evaluations per method), n_questions, deployed
    and deployed_ci, proposals (round size per search), exclusion (rule, collapse,
    full_path_unparsed_rate, parse), cells (per cell: space, oracle_at_k,
    oracle_two_way, edits_mean, excluded, informative, unparsed_rate,
    random_minus_structured and matched_minus_structured (per search: value, ci,
    ci_two_way, ci_questions, route_share, baseline), selectors, and with the task's
    golds null (per method: `grading.null_summary` and above_chance)), temperature
    (oracle, selectors), excluded_cells, oracle_at_k (over kept cells), selectors
    (accuracy, gap_recovery_median). Then: grading; the other grading's name ->
    deployed, oracle_at_k, temperature_oracle, cells (oracle_at_k, selector
    accuracies), where the records hold both grades; null (the temperature probe's
    chance null) with the task's golds; layers (`layers_summary`); unfinished_rate
    (per probe) and warnings; missing, where something could not be computed."""
    summary = dict(headline)
    if beside is not None:
        summary[other_grading(grading)] = {
            "deployed": beside["deployed"], "oracle_at_k": beside["oracle_at_k"],
            "temperature_oracle": beside["temperature"]["oracle"],
            "cells": {cell: {"oracle_at_k": c["oracle_at_k"],
                             "selectors": {name: sel["accuracy"] for name, sel in c["selectors"].items()}}
                      for cell, c in beside["cells"].items()}}
    summary["grading"] = grading
    if null is not None:
        summary["null"] = null
    summary["layers"] = layers
    summary["unfinished_rate"] = unfinished
    summary["warnings"] = [w for p, r in unfinished.items() if (w := unfinished_warning(r, p))]
    if missing:
        summary["missing"] = missing
    return RouteSummary.of(summary, where)


def layers_summary(table: pd.DataFrame, ranked: int = 5) -> dict[str, Any]:
    """`RouteSummary.layers`, from the `route_layers` table (`layers.route_layers`): per
    space, `top` -> {layer, action ("skip" | "repeat"), gain, gain_ci, null_gain,
    above_chance} (the largest gain; ties to the lower layer, skip first), and `ranked`,
    the `ranked` largest gains in the same form. Without the task's golds null_gain is
    None and nothing is above chance."""
    def entry(r: pd.Series) -> dict[str, Any]:
        return {"layer": int(r["layer"]), "action": str(r["action"]), "gain": float(r["gain"]),
                "gain_ci": [float(r["gain_ci_low"]), float(r["gain_ci_high"])],
                "null_gain": None if pd.isna(r["null_gain"]) else float(r["null_gain"]),
                "above_chance": bool(r["above_chance"])}

    out: dict[str, Any] = {}
    for space, g in table.groupby("space", sort=False):
        order = g.assign(rank=g["action"].map(LAYER_ACTIONS.index))
        order = order.sort_values(["gain", "rank", "layer"], ascending=[False, True, True], kind="stable")
        out[str(space)] = {"top": entry(order.iloc[0]), "ranked": [entry(r) for _, r in order.head(ranked).iterrows()]}
    return out


def _route_nulls(records: pd.DataFrame, task: Task, grading: str, cfg: RouteConfig, summary: dict[str, Any],
                 tables: dict[str, pd.DataFrame]) -> None:
    """Each cell's chance null per method, beside its oracle@K: what the same K route
    candidates reach by coincidence (`grading.question_null`: graded against another
    question's gold, or guessing like them for a finite option set). A gold-rewarded
    search steers its routes toward the true gold; its null asks how often that set
    holds a wrong question's gold instead. Into `summary["cells"][cell]["null"][method]`
    and the `route_cells` table (`null_oracle`, `oracle_minus_null` with its interval)."""
    columns: list[dict[str, Any]] = []
    for cell, c in summary["cells"].items():
        c["null"] = {}
        for m in c["oracle_at_k"]:
            label = str(ProbeLabel.route(c["space"], m))
            null = question_null(records, task, label, grading, cfg.budget, seed=cfg.seed)
            if null is None:
                continue
            scores = question_scores(records, label)
            c["null"][m] = null_summary(scores["d"].to_numpy(), scores["o"].to_numpy(), *null, seed=cfg.seed)
            lo, hi = c["null"][m]["O_K_minus_null_ci"]
            c["null"][m]["above_chance"] = above_chance(lo)
            columns.append({"cell": cell, "method": m, "null_oracle": c["null"][m]["O_K"],
                            "oracle_minus_null": c["null"][m]["O_K_minus_null"],
                            "oracle_minus_null_lo": lo, "oracle_minus_null_hi": hi, "above_chance": above_chance(lo)})
    if columns and len(tables["route_cells"]):
        tables["route_cells"] = tables["route_cells"].merge(pd.DataFrame(columns), on=["cell", "method"], how="left")


def full_path_unparsed(records: pd.DataFrame, qids: Sequence[str], task: Task | None, grading: str) -> tuple[float, str]:
    """The exclusion rule's measure: the share of the full path's greedy answers with no
    answer as `grading` reads them (`grading.graded_answers`; strict reading needs the
    task, without it the flexible parse is read and named), and the parse read."""
    deployed = records[(records.probe == DEPLOYED) & records.question_id.isin(qids)]
    if grading == "flexible" or task is None:
        return unparsed_rate(deployed), "flexible"
    answers = graded_answers(deployed, task, grading)
    return (float(np.mean([a is None for a in answers])) if answers else math.nan), grading


def _graded_routes(records: pd.DataFrame, config: dict[str, Any], cfg: RouteConfig,
                   choices: dict[str, dict[str, list[int | None]]],
                   collapse: tuple[float, str]) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """`summarize_routes`' summary and tables from records graded one way (`correct`),
    format collapse judged on `collapse` (`full_path_unparsed`)."""
    model, task_name = config["model"], config["task"]["name"]
    n_layers = int(config["model_facts"]["n_layers"])
    scores = question_scores(records, "temperature")
    qids = list(scores.index)
    d = scores["d"].to_numpy()
    greedy = float(d.mean())
    # Format collapse, judged on the one output every method shares: the full path's.
    collapse_rate, parse = collapse
    excluded = bool(collapse_rate > cfg.collapse)
    curves, cells, distances, selectors = [], [], [], []
    summary: dict[str, Any] = {"kind": ROUTE, "model": model, "task": task_name, "k": cfg.samples, "budget": cfg.budget,
                               "n_questions": len(scores), "deployed": greedy,
                               "deployed_ci": list(wilson_interval(d.sum(), len(d))),
                               "proposals": {m: round_size(m, cfg.proposals) for m in STRUCTURED},
                               "exclusion": {"rule": "full path's unparsed rate > collapse", "collapse": cfg.collapse,
                                             "full_path_unparsed_rate": collapse_rate, "parse": parse},
                               "cells": {}}
    # Plain sampling's selection gap, the same for every cell.
    temperature = _picks_correct(choices["temperature"], _candidates(records, "temperature", qids), {})
    t_oracle = scores["o"].to_numpy()
    summary["temperature"] = {"oracle": float(t_oracle.mean()),
                              "selectors": {name: selection_summary(d, t_oracle, hit) for name, hit in temperature.items()}}
    methods, controls = route_methods(records, cfg)
    for space_name in cfg.spaces:
        cell = f"{model}/{task_name}/{space_name}"
        space = make_space(space_name, n_layers, min_len=cfg.min_len, max_len=cfg.max_len)
        rand_label = str(ProbeLabel.route(space_name, "random"))
        rand = _candidates(records, rand_label, qids)
        rand_unparsed = unparsed_rate(pd.concat(rand))  # shown, not judged (see the exclusion rule)
        at_k: dict[str, np.ndarray] = {}
        edits: dict[str, np.ndarray] = {}
        route_var: dict[str, float] = {}  # the route draw's variance of a random method's oracle
        for m in methods:
            cands = _candidates(records, str(ProbeLabel.route(space_name, m)), qids)
            curve = _prefix_oracle(cands, cfg.budget, draws_at_random(m))
            curves += _curve_rows(cell, m, "oracle", curve, cfg.seed)
            at_k[m] = curve[:, -1].astype(bool)
            route_var[m] = route_jackknife_variance(cands) if draws_at_random(m) else 0.0
            edits[m] = np.concatenate([[space.edits(route_of(i)) for i in g["intervention"]] for g in cands])
            values, counts = np.unique(edits[m], return_counts=True)
            distances += [{"cell": cell, "space": space_name, "method": m, "edits": int(v), "routes": int(c)}
                          for v, c in zip(values, counts)]
        for vote, weighted in VOTES.items():
            curves += _curve_rows(cell, vote, "vote", vote_matrix(rand, np.arange(1, cfg.budget + 1), weighted, 1, cfg.seed), cfg.seed)
        blind = {name: _candidates(records, str(ProbeLabel.route(space_name, name)), qids) for name in BLIND_SEARCHES}
        picks = _picks_correct(choices[space_name], rand, blind)
        oracle = at_k["random"]
        oracle_at_k = {m: float(v.mean()) for m, v in at_k.items()}
        #: no method beat greedy anywhere: the comparison could not have gone either way
        informative = any(v.mean() > greedy for v in at_k.values())
        baselines = {"random": {m: "random" for m in STRUCTURED}, "random_matched": controls}
        diffs = {base: {m: _difference(at_k[against], at_k[m], route_var[against]) | {"baseline": against}
                        for m, against in per_search.items() if m in at_k and against in at_k}
                 for base, per_search in baselines.items()}
        diffs = {base: d for base, d in diffs.items() if d}
        for m, v in at_k.items():
            lo, hi = wilson_interval(v.sum(), len(v))
            two_way = two_way_ci(v.astype(float), route_var[m], (lo, hi), low=0.0)
            row = {"cell": cell, "model": model, "task": task_name, "space": space_name, "method": m,
                   "oracle": float(v.mean()), "oracle_lo": lo, "oracle_hi": hi,
                   "oracle_two_way_lo": two_way["ci_two_way"][0], "oracle_two_way_hi": two_way["ci_two_way"][1],
                   "edits_mean": float(edits[m].mean())}
            for base, column in (("random", "random_minus"), ("random_matched", "matched_minus")):
                diff = diffs.get(base, {}).get(m)
                row |= {column: diff["value"] if diff else np.nan, f"{column}_lo": diff["ci"][0] if diff else np.nan,
                        f"{column}_hi": diff["ci"][1] if diff else np.nan,
                        f"{column}_two_way_lo": diff["ci_two_way"][0] if diff else np.nan,
                        f"{column}_two_way_hi": diff["ci_two_way"][1] if diff else np.nan}
            row["matched_control"] = controls.get(m, "")
            cells.append({**row, "deployed": greedy, "n_questions": len(qids), "k": cfg.budget, "excluded": excluded,
                          "informative": informative, "unparsed_rate": collapse_rate,
                          "random_unparsed_rate": rand_unparsed})
        cell_sel = {}
        for name, hit in picks.items():
            cell_sel[name] = selection_summary(d, oracle, hit)
            selectors.append({"cell": cell, "space": space_name, "selector": name, "source": "routes", **_flat(cell_sel[name])})
        for name, sel in summary["temperature"]["selectors"].items():
            selectors.append({"cell": cell, "space": space_name, "selector": name, "source": "temperature", **_flat(sel)})
        summary["cells"][cell] = {
            "space": space_name, "oracle_at_k": oracle_at_k,
            "oracle_two_way": {m: two_way_ci(v.astype(float), route_var[m], wilson_interval(v.sum(), len(v)), low=0.0)
                               for m, v in at_k.items() if draws_at_random(m)},
            "edits_mean": {m: float(v.mean()) for m, v in edits.items()},
            "excluded": excluded, "informative": informative, "unparsed_rate": collapse_rate,
            "random_minus_structured": diffs.get("random", {}), "matched_minus_structured": diffs.get("random_matched", {}),
            "selectors": cell_sel,
        }
    sel = pd.DataFrame(selectors)
    tables = {"route_curves": pd.DataFrame(curves), "route_cells": pd.DataFrame(cells),
              "route_distances": pd.DataFrame(distances), "selectors": sel}
    kept = [c for c, v in summary["cells"].items() if not v["excluded"]]
    summary["excluded_cells"] = [c for c in summary["cells"] if c not in kept]
    summary["oracle_at_k"] = {m: float(np.nanmean([summary["cells"][c]["oracle_at_k"][m] for c in kept])) if kept else float("nan") for m in methods}
    routes_sel = sel[(sel.source == "routes") & sel.cell.isin(kept)] if len(sel) else sel
    summary["selectors"] = {name: {"accuracy": float(g.accuracy.mean()), "gap_recovery_median": float(g.gap_recovery.median())}
                            for name, g in routes_sel.groupby("selector", sort=False)} if len(routes_sel) else {}
    return summary, tables


def route_methods(records: pd.DataFrame, cfg: RouteConfig) -> tuple[list[str], dict[str, str]]:
    """The probe methods of a run's route cells, and per structured search the matched
    control it is compared with: its own (`config.matched_control`) where the records
    hold it, else the pooled `random_matched` of runs made before each search had its
    own (experiments/runs/arith40 and arith10_seq)."""
    searches = [m for m in cfg.methods if m in STRUCTURED]
    controls: dict[str, str] = {}
    if "random_matched" in cfg.methods:
        probes = set(records["probe"])
        own = all(str(ProbeLabel.route(s, matched_control(m))) in probes for s in cfg.spaces for m in searches)
        controls = {m: matched_control(m) if own else "random_matched" for m in searches}
    return list(dict.fromkeys(("random", *searches, *controls.values()))), controls


def route_jackknife_variance(cands: list[pd.DataFrame]) -> float:
    """The variance that the draw of routes adds to a random method's oracle at K: a
    delete-one-route jackknife, each route (by identity) removed from every question
    that evaluated it. Removing a route turns question i from reached to not reached
    only when it was i's one correct route and the full path was wrong, so the
    replicates are exact counts. With one route list shared by all questions (runs made
    before each question got its own draw) this is the component a bootstrap over
    questions misses; with a fresh draw per question the question bootstrap already
    carries most of it, and adding it is conservative."""
    n = len(cands)
    drops: dict[str, int] = {}
    routes: set[str] = set()
    for g in cands:
        after = g.iloc[1:]
        routes.update(after["intervention"])
        hits = after.loc[after["correct"].astype(bool), "intervention"]
        if not bool(g["correct"].iloc[0]) and len(hits) == 1:
            drops[hits.iloc[0]] = drops.get(hits.iloc[0], 0) + 1
    r = len(routes)
    if n == 0 or r < 2:
        return 0.0
    d = np.zeros(r)
    d[:len(drops)] = np.fromiter(drops.values(), dtype=float) / n
    return float((r - 1) / r * ((d - d.mean()) ** 2).sum())


def two_way_ci(values: np.ndarray, route_var: float, question_ci: Sequence[float] | None = None, level: float = 0.95,
               low: float = -1.0) -> dict[str, Any]:
    """A mean over questions with both sources of variance: the questions' (the sample
    variance of `values` / n) and the route draw's (`route_var`, from
    `route_jackknife_variance`), independent components. The question-only interval
    (`question_ci`: the Wilson or Newcombe one reported beside; None: the normal one) is
    widened about the mean by sqrt(total / questions' variance), so it is unchanged when
    the route draw adds nothing; with no variance between questions the route draw's
    normal half-width is added. Clipped to [low, 1] (0 for an oracle). `route_share`:
    the route draw's part of the variance."""
    values = np.asarray(values, dtype=float)
    z = float(norm.ppf(0.5 + level / 2))
    q_var = float(values.var(ddof=1) / len(values)) if len(values) > 1 else 0.0
    mean = float(values.mean())
    if question_ci is None:
        question_ci = (mean - z * math.sqrt(q_var), mean + z * math.sqrt(q_var))
    q_lo, q_hi = (float(x) for x in question_ci)
    total = q_var + route_var
    if route_var <= 0:
        lo, hi = q_lo, q_hi
    elif q_var > 0:
        factor = math.sqrt(total / q_var)
        lo, hi = mean - (mean - q_lo) * factor, mean + (q_hi - mean) * factor
    else:
        half = z * math.sqrt(route_var)
        lo, hi = min(q_lo, mean - half), max(q_hi, mean + half)
    return {"ci_two_way": [max(low, lo), min(1.0, hi)], "ci_questions": [max(low, q_lo), min(1.0, q_hi)],
            "route_share": route_var / total if total > 0 else 0.0}


def _difference(baseline: np.ndarray, search: np.ndarray, route_var: float) -> dict[str, Any]:
    """Baseline - search at K over paired questions: the Newcombe interval (questions
    only, as before) and the two-way one, which widens it by the baseline's route draw
    (an adaptive search's routes are not a draw this can resample)."""
    ci = [float(x) for x in paired_diff_ci(search, baseline)]
    return {"value": float(baseline.mean() - search.mean()), "ci": ci,
            **two_way_ci(baseline.astype(float) - search.astype(float), route_var, ci)}


def _flat(sel: dict[str, Any]) -> dict[str, Any]:
    """A selection summary as table columns (intervals as _lo/_hi)."""
    out: dict[str, Any] = {}
    for key, value in sel.items():
        if key.endswith("_ci"):
            out[f"{key[:-3]}_lo"], out[f"{key[:-3]}_hi"] = value
        else:
            out[key] = value
    return out


def _selector_choices(cands: list[pd.DataFrame], blind: dict[str, list[pd.DataFrame]],
                      verify: dict[str, dict[str, float]] | None) -> dict[str, list[int | None]]:
    """Per selector, the candidate it picks for each question (None: it abstains): the
    candidate selectors over `cands` (self-verification from the stored per-answer
    scores `verify`, question -> answer -> score; left out when None), and each search
    selector over its blind search's candidates in `blind`. Answer-blind: no grade is
    read, so one choice serves both gradings."""
    names = [n for n in CANDIDATE_SELECTORS if verify is not None or n != "self_verification"]
    choices: dict[str, list[int | None]] = {name: [] for name in names}
    for g in cands:
        if verify is not None:
            by_answer = verify.get(g["question_id"].iloc[0], {})
            g = g.assign(verify_yes_logprob=[by_answer.get(a, -math.inf) if isinstance(a, str) else -math.inf
                                             for a in g["extracted"]])
        for name in names:
            choices[name].append(select(g, name))
    for name, (probe, selector) in SEARCH_SELECTORS.items():
        if probe in blind:
            choices[name] = [select(g, selector) for g in blind[probe]]
    return choices


def _picks_correct(choices: dict[str, list[int | None]], cands: list[pd.DataFrame],
                   blind: dict[str, list[pd.DataFrame]]) -> dict[str, np.ndarray]:
    """Per selector, whether its pick is correct (`correct`) for each question; an
    abstention is wrong."""
    def pool(name: str) -> list[pd.DataFrame]:
        return blind[SEARCH_SELECTORS[name][0]] if name in SEARCH_SELECTORS else cands

    return {name: np.asarray([bool(g.loc[i, "correct"]) if i is not None else False
                              for i, g in zip(picked, pool(name))], dtype=bool)
            for name, picked in choices.items()}
