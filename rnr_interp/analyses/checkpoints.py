"""Checkpoint audit: where a trained model's gains come from, question by question.

Two audit runs of the same questions under the same probe, one of a base model and one
of a trained checkpoint, are aligned per question. Each question gets two transitions:

- realized (deployed answer correct): gained, lost, kept, never;
- reachable (some probe sample correct): entered, left, stayed, never.

A gained question that the base model could already reach was *surfaced* by training
(moved from the reachable set into the realized set); one the base could not reach is
genuinely new. Among base-reachable but unrealized questions, the trained model's
realization rate per bin of the base sampling hit rate c_i/n says whether training
mostly promotes answers the base already sampled often (default bins the paper's:
[0, 0.1], (0.1, 0.35], (0.35, 1]). A budget control re-probes every question with both
models at K and 2K with fresh seeds and reports the reachable change and each model's
O - D gap at both budgets, so a shrinking reachable set is not mistaken for an effect
of a fixed K; it also reads, for the trained model's newly realized (gained) answers,
the share the base model reaches at each budget it sampled (1, 2, 4, ... up to the
control's largest, K and factor x K or `--budget-control-k` among them): the source of
gains as a curve over K with Wilson intervals, since "already base-reachable" grows
with the budget it is read at (the paper probes at K >= 200). McNemar tests and paired intervals on the change in D and O_K come with
the counts. Both runs' prompt formats are stated (a warning when they differ), and an
audit of the trained model in the base prompt format (`--shared-prompt`) gives the
share of the gain that survives the change of format. Runs decoded differently (the
manifest's "deployed") are refused.

The result is a run folder (kind "compare"): table `transitions`, table `propensity`,
optional budget-control records, and summary.json with every count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from rnr_interp.engine.decoding import Decoding
from rnr_interp.grading import N_DERANGEMENTS, derangement_null, graded, regrade
from rnr_interp.metrics import discordant_counts, mcnemar, paired_diff_ci, question_scores, wilson_interval
from rnr_interp.models import LoadedModel
from rnr_interp.records import COMPARE, DEPLOYED, GRADINGS, CompareSummary, RunDir, comparable, config_diff, lookup, short_repr
from rnr_interp.engine.sampling import Probe, chunks, sample_questions
from rnr_interp.tasks.base import Task

REALIZED = ("gained", "lost", "kept", "never")
REACHABLE = ("entered", "left", "stayed", "never")
#: the paper's propensity bins on the base hit rate c/n: [0, 0.1], (0.1, 0.35], (0.35, 1]
#: (its top bin is "base hit rate > 35%"); `--bins` gives finer ones on request
DEFAULT_BIN_EDGES: tuple[float, ...] = (0.0, 0.1, 0.35, 1.0)
#: config entries that decide what "correct" and "reachable" mean; the model may differ
ALIGNED_KEYS = ("task", "question_ids_hash", "probe.k", "probe.temperature", "probe.top_p",
                "probe.name", "deployed", "interventions")


class RunMismatchError(ValueError):
    """Two runs that cannot be compared question by question; `keys` names what differs."""

    def __init__(self, keys: list[str], lines: list[str]):
        super().__init__("runs are not comparable; they differ in " + "; ".join(line.strip() for line in lines))
        self.keys = keys


def check_aligned(base: dict[str, Any], trained: dict[str, Any]) -> None:
    """Raise RunMismatchError listing every aligned key (task incl. answer format,
    grading and the questions' content hash, question ids, probe K/temperature/top_p,
    deployed decoding) that differs between two run configs. Where the data file lived
    does not count."""
    keys, lines = [], []
    base, trained = comparable(base), comparable(trained)
    for key in ALIGNED_KEYS:
        a, b = lookup(base, key), lookup(trained, key)
        if a != b:
            keys.append(key)
        # the message names the innermost differing entries (task.questions_hash, not all of task)
        for sub in config_diff(a, b, key + "."):
            lines.append(f"{sub}: {short_repr(lookup(base, sub))} (base) != {short_repr(lookup(trained, sub))} (trained)")
    if keys:
        raise RunMismatchError(keys, lines)


# -- per-question transitions ----------------------------------------------------------


def transition(before: np.ndarray, after: np.ndarray, labels: Sequence[str]) -> np.ndarray:
    """labels = (became true, became false, stayed true, stayed false) per element."""
    before, after = np.asarray(before, bool), np.asarray(after, bool)
    return np.select([~before & after, before & ~after, before & after], labels[:3], default=labels[3])


def transitions(base_records: pd.DataFrame, trained_records: pd.DataFrame, probe: str = "temperature") -> pd.DataFrame:
    """One row per question (records order): the realized and reachable transitions,
    both models' d, o, c, n and hit rate c/n, and whether the base model could already
    reach the question (`base_reachable`, the origin of a gained answer)."""
    base = question_scores(base_records, probe)
    trained = question_scores(trained_records, probe)
    only_base, only_trained = set(base.index) - set(trained.index), set(trained.index) - set(base.index)
    if only_base or only_trained:
        raise RunMismatchError(["questions"], [
            f"  {len(only_base)} questions only in the base run, {len(only_trained)} only in the trained run "
            "(an unfinished run? finish it with the same `rnr audit` command)"])
    trained = trained.loc[base.index]
    out = pd.DataFrame({
        "question_id": base.index.astype(str),
        "realized": transition(base["d"], trained["d"], REALIZED),
        "reachable": transition(base["o"], trained["o"], REACHABLE),
        "base_d": base["d"].to_numpy(), "trained_d": trained["d"].to_numpy(),
        "base_o": base["o"].to_numpy(), "trained_o": trained["o"].to_numpy(),
        "base_c": base["c"].to_numpy(), "trained_c": trained["c"].to_numpy(),
        "base_n": base["n"].to_numpy(), "trained_n": trained["n"].to_numpy(),
    })
    out["base_hit_rate"] = out["base_c"] / out["base_n"]
    out["trained_hit_rate"] = out["trained_c"] / out["trained_n"]
    out["base_reachable"] = out["base_o"]
    return out


def bin_labels(edges: Sequence[float]) -> list[str]:
    """Interval labels of `propensity` bins: (lo, hi], the first one closed at lo."""
    return [f"{'[' if i == 0 else '('}{lo:g}, {hi:g}]" for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]))]


def check_bin_edges(edges: Sequence[float]) -> list[float]:
    """The edges as floats, or ValueError unless they are two or more finite, strictly
    increasing numbers."""
    edges = [float(e) for e in edges]
    if len(edges) < 2 or not all(np.isfinite(edges)) or any(b <= a for a, b in zip(edges[:-1], edges[1:])):
        raise ValueError(f"bin edges must be at least two finite, strictly increasing numbers, got {edges}")
    return edges


def propensity(t: pd.DataFrame, edges: Sequence[float] = DEFAULT_BIN_EDGES) -> pd.DataFrame:
    """Among questions the base model could reach but did not realize, the trained
    model's realization rate per bin of the base hit rate c/n. Bins are (lo, hi], the
    first one closed at lo, so with the default edges the top bin is the paper's
    "hit rate > 35%": [0, 0.1], (0.1, 0.35], (0.35, 1]. NaN rate for an empty bin."""
    edges = check_bin_edges(edges)
    pool = t[t["base_o"] & ~t["base_d"]]
    rate = pool["base_hit_rate"].to_numpy(dtype=float)
    idx = np.searchsorted(edges, rate, side="left") - 1
    idx[rate == edges[0]] = 0
    inside = (idx >= 0) & (idx < len(edges) - 1)
    rows = []
    for i, label in enumerate(bin_labels(edges)):
        members = pool["trained_d"].to_numpy()[inside & (idx == i)]
        lo, hi = wilson_interval(int(members.sum()), int(members.size))
        rows.append({"bin": label, "lo": edges[i], "hi": edges[i + 1], "n": int(members.size),
                     "n_realized": int(members.sum()),
                     "realized_rate": float(members.mean()) if members.size else float("nan"),
                     "realized_rate_ci": [lo, hi]})
    return pd.DataFrame(rows)


def paired_stats(t: pd.DataFrame, level: float = 0.95) -> dict[str, Any]:
    """McNemar on realized and on reachable outcomes, and paired intervals on the change
    in D and in O_K (trained minus base)."""
    out: dict[str, Any] = {}
    for name, col in (("D", "d"), ("O_K", "o")):
        before, after = t[f"base_{col}"].to_numpy(bool), t[f"trained_{col}"].to_numpy(bool)
        b, c = discordant_counts(before, after)
        out[name] = {
            "base": float(before.mean()), "trained": float(after.mean()),
            "change": float(after.mean() - before.mean()),
            "change_ci": [float(x) for x in paired_diff_ci(before, after, level=level)],
            # b = right before, wrong after (lost / left); c = the reverse (gained / entered)
            "mcnemar": mcnemar(b, c),
        }
    out["gap"] = {"base": out["O_K"]["base"] - out["D"]["base"], "trained": out["O_K"]["trained"] - out["D"]["trained"]}
    out["level"] = level
    return out


def counts(t: pd.DataFrame) -> dict[str, Any]:
    """Counts of every category, and where the gained answers came from."""
    gained = t[t["realized"] == "gained"]
    return {
        "n_questions": len(t),
        "realized": {label: int((t["realized"] == label).sum()) for label in REALIZED},
        "reachable": {label: int((t["reachable"] == label).sum()) for label in REACHABLE},
        "gained_from": {"base_reachable": int(gained["base_reachable"].sum()),
                        "base_unreachable": int((~gained["base_reachable"]).sum())},
        "crosstab": {r: {s: int(((t["realized"] == r) & (t["reachable"] == s)).sum()) for s in REACHABLE} for r in REALIZED},
    }


# -- budget control -------------------------------------------------------------------

ROLES = ("base", "trained")


def control_budget(config: dict[str, Any], factor: int = 2, budget_k: int | None = None) -> int:
    """How many fresh samples the budget control draws per question: factor x K, or
    `budget_k` when that is larger."""
    return max(int(config["probe"]["k"]) * factor, budget_k or 0)


def budget_probe(config: dict[str, Any], role: str, factor: int = 2, seed_offset: int = 1,
                 budget_k: int | None = None) -> Probe:
    """The run's probe with `control_budget` samples and a fresh seed, under its own
    records name per model (`role`: base or trained), so control rows never mix with
    the runs' K-sample ones or with each other."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    p = config["probe"]
    k = control_budget(config, factor, budget_k)
    return Probe(k=k, temperature=p["temperature"], top_p=p["top_p"], seed=int(p["seed"]) + seed_offset,
                 name=f"{p['name']}_{role}_k{k}")


def budget_control(lm: LoadedModel, task: Task, question_ids: Sequence[str], probe: Probe, deployed: Decoding, *,
                   batch_size: int = 8, run: RunDir | None = None) -> pd.DataFrame:
    """Re-probe `question_ids` with `lm` under `probe` (e.g. `budget_probe(config,
    role)`: 2K samples, a fresh seed). Rows go to `run` when given, and questions
    already stored there are not sampled again. Returns the probe rows (question_id,
    probe, candidate, text, finish, correct) of those questions, candidates in order; the deployed answer
    is not redrawn (greedy: it is the one in the audit run). The rows keep their
    texts, for the chance null (`gains_source_null`)."""
    by_id = {q.id: q for q in task.questions}
    missing = [qid for qid in question_ids if qid not in by_id]
    if missing:
        raise ValueError(f"question ids not in task {task.name!r}: {missing[:5]}")
    done = run.done_question_ids(probe.name) if run is not None else set()
    rows: list[dict[str, Any]] = []
    todo = [by_id[qid] for qid in question_ids if qid not in done]
    for batch in chunks(todo, batch_size):
        part = sample_questions(lm, task, batch, probe=probe, deployed=deployed,
                                run_id=run.run_id if run is not None else "budget_control",
                                **({"grading": run.grading} if run is not None else {}))
        part = [r for r in part if r["probe"] == probe.name]
        if run is not None:
            run.write_question_batch(part)
        rows.extend(part)
    columns = ["question_id", "probe", "candidate", "text", "finish", "correct"]
    if run is not None:
        stored = run.read_records(filters=[("probe", "=", probe.name)])
        frame = stored[stored["question_id"].isin(list(question_ids))][columns]
    else:
        frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(["question_id", "candidate"], kind="stable").reset_index(drop=True)


def reached(rows: pd.DataFrame, question_ids: Sequence[str], k: int) -> np.ndarray:
    """o_i(k) per question id (in that order): any correct among candidates 0..k-1.
    A question with fewer than k rows is an error (an unfinished control)."""
    first = rows[rows["candidate"] < k]
    sizes = first.groupby("question_id").size().reindex(list(question_ids), fill_value=0)
    short = sizes[sizes < k]
    if len(short):
        raise ValueError(f"budget control has fewer than {k} samples for questions {list(short.index[:5])}")
    return first.groupby("question_id")["correct"].any().reindex(list(question_ids)).to_numpy(bool)


def curve_budgets(k: int, k_big: int) -> list[int]:
    """The budgets the source-of-gains curve is read at: 1, 2, 4, ... up to k_big, and
    K and k_big themselves."""
    doublings = [2 ** i for i in range(k_big.bit_length()) if 2 ** i <= k_big]
    return sorted({*doublings, k, k_big})


def gains_source_null(base_control: pd.DataFrame, base_deployed: pd.DataFrame, task: Task, grading: str,
                      ks: Sequence[int]) -> dict[int, pd.Series]:
    """Per budget k' of `ks`, per question id: how often the base model's first k'
    control samples hold the gold of the question a derangement maps it to
    (`grading.derangement_null` over every question of the control, under `grading`):
    what "base-reachable" reaches by coincidence. `base_deployed`: the base run's
    deployed rows of those questions (the null's frame needs them; only the samples
    count here)."""
    probe = str(base_control["probe"].iloc[0])
    out = {}
    for budget in ks:
        records = pd.concat([base_deployed, base_control[base_control["candidate"] < budget]], ignore_index=True)
        ids = question_scores(records, probe).index
        _, o_null = derangement_null(records, task, probe, grading)
        out[int(budget)] = pd.Series(o_null, index=ids)
    return out


def gains_source_curve(t: pd.DataFrame, base_control: pd.DataFrame, ks: Sequence[int], k: int,
                       level: float = 0.95, null: dict[int, pd.Series] | None = None) -> dict[str, Any]:
    """For the trained model's newly realized answers (realized "gained"), the share the
    base model reaches within its first k' fresh control samples, at each k' of `ks`,
    with Wilson intervals; `trend` says how the share moves from the audit's budget `k`
    to the largest k'. With `null` (`gains_source_null`), each point also carries
    `null_share`, the share those samples reach by chance (mean over the gained questions)."""
    gained = t.loc[t["realized"] == "gained", "question_id"].tolist()
    curve = []
    for budget in ks:
        hit = int(reached(base_control, gained, budget).sum()) if gained else 0
        lo, hi = wilson_interval(hit, len(gained), level)
        point = {"k": int(budget), "base_reachable": hit, "n_gained": len(gained),
                 "share": hit / len(gained) if gained else float("nan"), "ci": [lo, hi]}
        if null is not None:
            point["null_share"] = float(null[int(budget)].reindex(gained).mean()) if gained else float("nan")
        curve.append(point)
    out: dict[str, Any] = {"n_gained": len(gained), "curve": curve, "level": level,
                           "samples": "the base model's fresh budget-control samples (not the audit run's): the first k"}
    if null is not None:
        out["null"] = ("the same base samples graded against another question's gold "
                       f"({N_DERANGEMENTS} derangements of the control's questions)")
    if gained and len(curve) > 1:
        first, last = next(c for c in curve if c["k"] == k), curve[-1]
        word = "rises" if last["share"] > first["share"] else "falls" if last["share"] < first["share"] else "stays"
        out["trend"] = (f"{word} from {first['share']:.2f} at K={first['k']} to {last['share']:.2f} "
                        f"[{last['ci'][0]:.2f}, {last['ci'][1]:.2f}] at K={last['k']}"
                        + (f" (by chance: {first['null_share']:.3f} and {last['null_share']:.3f})" if null is not None else ""))
    return out


def budget_summary(t: pd.DataFrame, controls: dict[str, pd.DataFrame], k: int, k_big: int,
                   level: float = 0.95, null: dict[int, pd.Series] | None = None) -> dict[str, Any]:
    """Both models re-probed with fresh seeds, read at K (the first K fresh samples) and
    at k_big: per budget each model's O and oracle-deployment gap O - D (Newcombe paired
    interval; D is the audit runs' greedy answer), and the reachable change O_trained -
    O_base (paired interval, McNemar). Also how many questions that left the reachable
    set in the audit runs are reached by the trained model at k_big, and the source of
    gains over K (`gains_source_curve`, with its chance `null` when given)."""
    ids = t["question_id"].tolist()
    d = {role: t[f"{role}_d"].to_numpy(bool) for role in ROLES}
    budgets = {}
    for budget in (k, k_big):
        o = {role: reached(controls[role], ids, budget) for role in ROLES}
        entry: dict[str, Any] = {}
        for role in ROLES:
            entry[f"O_{role}"] = float(o[role].mean())
            entry[f"gap_{role}"] = float(o[role].mean() - d[role].mean())
            entry[f"gap_{role}_ci"] = [float(x) for x in paired_diff_ci(d[role], o[role], level=level)]
        b, c = discordant_counts(o["base"], o["trained"])
        entry.update({
            "reachable_change": float(o["trained"].mean() - o["base"].mean()),
            "reachable_change_ci": [float(x) for x in paired_diff_ci(o["base"], o["trained"], level=level)],
            "n_left": b, "n_entered": c, "mcnemar": mcnemar(b, c),
        })
        budgets[str(budget)] = entry
    left = (t["reachable"] == "left").to_numpy()
    back = reached(controls["trained"], ids, k_big) & left
    return {
        "k": k, "k_control": k_big, "n_questions": len(ids), "level": level,
        "samples": "fresh seed for both models; K = the first K of the k_control fresh samples",
        "budgets": budgets,
        "audit_left": {"n_left": int(left.sum()), "n_back_at_k_control": int(back.sum())},
        "gained_source": gains_source_curve(t, controls["base"], curve_budgets(k, k_big), k, level, null),
    }


def run_budget_control(base: RunDir, trained: RunDir, t: pd.DataFrame, models: dict[str, LoadedModel], task: Task, run: RunDir,
                       *, factor: int = 2, budget_k: int | None = None, batch_size: int = 8,
                       level: float = 0.95) -> dict[str, Any]:
    """Re-probe every question with both models (`models`: role -> loaded model, each
    the one its run audited) at `control_budget` samples (factor x K, or `budget_k`
    when larger) with fresh seeds; the control's summary."""
    for role, source in zip(ROLES, (base, trained)):
        if role not in models:
            raise ValueError(f"the budget control needs the {role} model")
        if not _same_model(models[role].spec, source.config.get("model")):
            raise ValueError(f"the budget control's {role} model must be {source.config.get('model')!r}, got {models[role].spec!r}")
    ids = t["question_id"].tolist()
    controls = {}
    for role, source in zip(ROLES, (base, trained)):
        probe = budget_probe(source.config, role, factor, budget_k=budget_k)
        controls[role] = budget_control(models[role], task, ids, probe, Decoding(**source.config["deployed"]),
                                        batch_size=batch_size, run=run)
    k, k_big = int(base.config["probe"]["k"]), control_budget(base.config, factor, budget_k)
    deployed = base.read_records(filters=[("probe", "=", DEPLOYED)])
    null = gains_source_null(controls["base"], deployed[deployed["question_id"].isin(ids)], task, run.grading,
                             curve_budgets(k, k_big)) if len(ids) > 1 else None
    return budget_summary(t, controls, k, k_big, level, null)


# -- prompt formats -----------------------------------------------------------------------


def prompt_formats(base: dict[str, Any], trained: dict[str, Any]) -> dict[str, Any]:
    """Each run's prompt format as recorded, whether they agree, and a warning when
    they do not (or when a run does not record one): a change between runs asked
    differently may come from the prompt rather than from training."""
    formats = {"base": base.get("prompt_format"), "trained": trained.get("prompt_format")}
    if None in formats.values():
        unknown = [role for role, f in formats.items() if f is None]
        return {**formats, "same": None, "warning": f"prompt format not recorded for the {' and '.join(unknown)} run; "
                "the runs may have asked in different formats"}
    same = formats["base"] == formats["trained"]
    warning = None if same else (
        "the runs asked in different prompt formats, so part of the change may be the prompt's, not the "
        "training's; audit the trained model on the base prompt (`rnr audit --prompt-like BASE_RUN`) and pass "
        "it as --shared-prompt")
    return {**formats, "same": same, "warning": warning}


def shared_prompt_retention(base: RunDir, trained: RunDir, shared: RunDir, t: pd.DataFrame,
                            level: float = 0.95) -> dict[str, Any]:
    """The prompt-format control: `shared` is an audit of the trained model in the base
    run's prompt format (same questions, probe, decoding). For D and O_K, the change
    from base on the shared prompt and on the trained model's own prompt (paired
    intervals) and the share of the native gain retained, shared change / native
    change (None when the native change is 0; a point estimate)."""
    check_aligned(base.config, shared.config)
    if not _same_model(shared.config.get("model"), trained.config.get("model")):
        raise ValueError(f"the shared-prompt run must audit the trained model {trained.config.get('model')!r}, "
                         f"not {shared.config.get('model')!r}")
    if shared.config.get("prompt_format") != base.config.get("prompt_format"):
        raise ValueError("the shared-prompt run was not asked in the base run's prompt format "
                         "(make it with `rnr audit --prompt-like BASE_RUN`)")
    scores = question_scores(shared.read_records(), base.config["probe"]["name"])
    ids = t["question_id"].tolist()
    if set(scores.index.astype(str)) != set(ids):
        raise RunMismatchError(["questions"], ["  the shared-prompt run does not hold the same questions (unfinished?)"])
    scores.index = scores.index.astype(str)
    scores = scores.loc[ids]
    out: dict[str, Any] = {"path": str(shared.path), "prompt_format": shared.config.get("prompt_format"), "level": level}
    for name, col in (("D", "d"), ("O_K", "o")):
        before = t[f"base_{col}"].to_numpy(bool)
        native, on_shared = t[f"trained_{col}"].to_numpy(bool), scores[col].to_numpy(bool)
        native_change = float(native.mean() - before.mean())
        shared_change = float(on_shared.mean() - before.mean())
        out[name] = {
            "base": float(before.mean()), "trained_native": float(native.mean()), "trained_shared": float(on_shared.mean()),
            "native_change": native_change,
            "native_change_ci": [float(x) for x in paired_diff_ci(before, native, level=level)],
            "shared_change": shared_change,
            "shared_change_ci": [float(x) for x in paired_diff_ci(before, on_shared, level=level)],
            "share_retained": shared_change / native_change if native_change else None,
        }
    return out


# -- the whole comparison -----------------------------------------------------------------


def compare_runs(base: RunDir, trained: RunDir, out: str | Path, *, edges: Sequence[float] = DEFAULT_BIN_EDGES,
                 control_models: dict[str, LoadedModel] | None = None, control_task: Task | None = None, factor: int = 2,
                 budget_k: int | None = None, shared_prompt: RunDir | None = None, batch_size: int = 8,
                 level: float = 0.95, grading: str | None = None, task: Task | None = None) -> CompareSummary:
    """Align, classify, bin, test; state both runs' prompt formats (with a warning when
    they differ); with `shared_prompt` (the trained model audited in the base prompt
    format) the share of the gain retained; with `control_models` ({"base": lm,
    "trained": lm}, the runs' models, loaded) and `control_task` (the runs' task) the
    budget control. Transitions, counts and tests are under `grading` (default: the
    base run's), with the counts and tests under the other grading beside (`task`, or
    `control_task`, reads strict grades missing from old records). Writes a compare run
    folder at `out` and returns its summary."""
    # every refusal before the compare folder exists
    edges = check_bin_edges(edges)
    if control_models is not None and (factor < 1 or batch_size < 1 or (budget_k is not None and budget_k < 1)):
        raise ValueError(f"the budget control needs factor, batch_size and budget_k >= 1, got {factor}, {batch_size} "
                         f"and {budget_k}")
    check_aligned(base.config, trained.config)
    probe_name = base.config["probe"]["name"]
    grading = grading or base.grading
    task = task or control_task
    both = [_records_by_grading(run_, task) for run_ in (base, trained)]
    if grading not in both[0] or grading not in both[1]:
        raise ValueError(f"the runs' records hold no {grading} grades and their task is not given to read them")
    t = transitions(both[0][grading], both[1][grading], probe_name)
    if control_models is not None and control_task is None:
        raise ValueError("the budget control needs the runs' task")
    config = {
        "kind": COMPARE,
        "base": {"path": str(base.path), "config_hash": base.config_hash, "model": base.config.get("model")},
        "trained": {"path": str(trained.path), "config_hash": trained.config_hash, "model": trained.config.get("model")},
        "bin_edges": [float(e) for e in edges],
        "grading": grading,
        "deployed": base.config.get("deployed"),
        "shared_prompt": None if shared_prompt is None else {"path": str(shared_prompt.path), "config_hash": shared_prompt.config_hash},
        "budget_control": None if control_models is None else {
            "models": {role: lm.spec for role, lm in control_models.items()}, "factor": factor,
            **({"budget_k": budget_k} if budget_k is not None else {})},
    }
    run = RunDir.create(out, config)
    table = propensity(t, edges)
    summary: dict[str, Any] = {
        "kind": COMPARE,
        "base_model": base.config.get("model"), "trained_model": trained.config.get("model"),
        "task": base.config["task"].get("name"), "k": base.config["probe"]["k"],
        "temperature": base.config["probe"]["temperature"],
        "deployed": base.config.get("deployed"),
        "prompt_formats": prompt_formats(base.config, trained.config),
        **counts(t),
        "stats": paired_stats(t, level),
        "propensity_bins": table["bin"].tolist(),
        "propensity": table.replace({np.nan: None}).to_dict("records"),
        "shared_prompt": None if shared_prompt is None else shared_prompt_retention(base, trained, shared_prompt, t, level),
        "budget_control": None,
        "grading": grading,
    }
    other = next(g for g in both[0] if g != grading) if len(both[0]) > 1 and len(both[1]) > 1 else None
    if other is not None:
        t_other = transitions(both[0][other], both[1][other], probe_name)
        summary[other] = {**counts(t_other), "stats": paired_stats(t_other, level)}
    # Multiple-choice runs carry their chance baselines (audit summaries): shown side by side.
    chance = {label: run_.read_summary().chance for label, run_ in (("base", base), ("trained", trained))
              if run_.has_summary()}
    if any(chance.values()):
        summary["chance"] = chance
    if control_models is not None:
        summary["budget_control"] = run_budget_control(base, trained, t, control_models, control_task, run,
                                                       factor=factor, budget_k=budget_k, batch_size=batch_size,
                                                       level=level)
    run.write_table("transitions", t)
    run.write_table("propensity", table)
    return run.write_summary(summary)


def _records_by_grading(run: RunDir, task: Task | None) -> dict[str, pd.DataFrame]:
    """A run's records graded each way they can be: both when their strict grades are
    stored or `task` reads them from the texts, else flexible only."""
    records = run.read_records()
    if task is not None:
        records = regrade(records, task)
    gradings = GRADINGS if records["correct_strict"].notna().all() else ("flexible",)
    return {g: graded(records, g) for g in gradings}


def _same_model(a: str | None, b: str | None) -> bool:
    """Same spec, or two spellings of one checkpoint folder."""
    if a is None or b is None or a == b:
        return a == b
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def load_aligned_task(config: dict[str, Any], data: Optional[Path] = None):
    """The task a run was audited on, rebuilt from its config (name, question count;
    `data` for file tasks) and checked against the stored description and ids."""
    from rnr_interp.tasks import load_task, reload_task

    described = config["task"]
    if isinstance(described.get("lm_eval"), dict):  # its questions as the run stored them: no YAML is rendered again
        task = reload_task(described)
    else:
        task = load_task(described["name"], data=data, n=described.get("n_questions"),
                         on_invalid="skip" if described.get("skipped_rows") else "refuse")
    differ = config_diff(comparable({"task": described}), comparable({"task": task.describe()}))
    if differ or task.ids_hash() != config["question_ids_hash"]:
        raise RunMismatchError(["task"], [f"the task rebuilt for the budget control differs from the runs' in "
                                          f"{', '.join(differ) or 'question_ids_hash'}; pass --data with the runs' data"])
    return task
