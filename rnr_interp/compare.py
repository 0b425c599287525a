"""Checkpoint audit: where a trained model's gains come from, question by question.

Two audit runs of the same questions under the same probe, one of a base model and one
of a trained checkpoint, are aligned per question. Each question gets two transitions:

- realized (deployed answer correct): gained, lost, kept, never;
- reachable (some probe sample correct): entered, left, stayed, never.

A gained question that the base model could already reach was *surfaced* by training
(moved from the reachable set into the realized set); one the base could not reach is
genuinely new. Among base-reachable but unrealized questions, the trained model's
realization rate per bin of the base sampling hit rate c_i/n says whether training
mostly promotes answers the base already sampled often. A budget control re-probes the
questions that left the reachable set with twice the budget, so a shrinking reachable
set is not mistaken for an effect of a fixed K. McNemar tests and paired intervals on
the change in D and O_K come with the counts.

The result is a run folder (kind "compare"): table `transitions`, table `propensity`,
optional budget-control records, and summary.json with every count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from rnr_interp.generate import Decoding
from rnr_interp.metrics import discordant_counts, mcnemar, paired_diff_ci, question_scores
from rnr_interp.models import LoadedModel
from rnr_interp.records import RunDir, comparable, config_diff, lookup, short_repr
from rnr_interp.sampling import Probe, chunks, sample_questions
from rnr_interp.tasks.base import Task

REALIZED = ("gained", "lost", "kept", "never")
REACHABLE = ("entered", "left", "stayed", "never")
DEFAULT_BIN_EDGES: tuple[float, ...] = (0.0, 0.1, 0.35, 0.65, 1.0)
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
    return [f"[{lo:g}, {hi:g}{']' if i == len(edges) - 2 else ')'}" for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]))]


def check_bin_edges(edges: Sequence[float]) -> list[float]:
    """The edges as floats, or ValueError unless they are two or more finite, strictly
    increasing numbers."""
    edges = [float(e) for e in edges]
    if len(edges) < 2 or not all(np.isfinite(edges)) or any(b <= a for a, b in zip(edges[:-1], edges[1:])):
        raise ValueError(f"bin edges must be at least two finite, strictly increasing numbers, got {edges}")
    return edges


def propensity(t: pd.DataFrame, edges: Sequence[float] = DEFAULT_BIN_EDGES) -> pd.DataFrame:
    """Among questions the base model could reach but did not realize, the trained
    model's realization rate per bin of the base hit rate c/n. Bins are [lo, hi), the
    last one closed; NaN rate for an empty bin."""
    edges = check_bin_edges(edges)
    pool = t[t["base_o"] & ~t["base_d"]]
    rate = pool["base_hit_rate"].to_numpy(dtype=float)
    idx = np.searchsorted(edges, rate, side="right") - 1
    idx[rate == edges[-1]] = len(edges) - 2
    inside = (idx >= 0) & (idx < len(edges) - 1)
    rows = []
    for i, label in enumerate(bin_labels(edges)):
        members = pool["trained_d"].to_numpy()[inside & (idx == i)]
        rows.append({"bin": label, "lo": edges[i], "hi": edges[i + 1], "n": int(members.size),
                     "n_realized": int(members.sum()), "realized_rate": float(members.mean()) if members.size else float("nan")})
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


def budget_probe(config: dict[str, Any], factor: int = 2, seed_offset: int = 1) -> Probe:
    """The run's probe with `factor` times the budget and a different seed, under its
    own records name so its rows never mix with the K-sample ones."""
    p = config["probe"]
    k = int(p["k"]) * factor
    return Probe(k=k, temperature=p["temperature"], top_p=p["top_p"], seed=int(p["seed"]) + seed_offset,
                 name=f"{p['name']}_k{k}")


def budget_control(lm: LoadedModel, task: Task, question_ids: Sequence[str], probe: Probe, deployed: Decoding, *,
                   batch_size: int = 8, run: RunDir | None = None) -> pd.DataFrame:
    """Re-probe `question_ids` with `lm` (the trained model) under `probe` (e.g.
    `budget_probe(config)`, 2K samples, a fresh seed). Rows go to `run` when given, and
    questions already stored there are not sampled again. Returns per question c, n, o
    at the larger budget."""
    by_id = {q.id: q for q in task.questions}
    missing = [qid for qid in question_ids if qid not in by_id]
    if missing:
        raise ValueError(f"question ids not in task {task.name!r}: {missing[:5]}")
    done = run.done_question_ids(probe.name) if run is not None else set()
    rows: list[dict[str, Any]] = []
    todo = [by_id[qid] for qid in question_ids if qid not in done]
    for batch in chunks(todo, batch_size):
        part = sample_questions(lm, task, batch, probe=probe, deployed=deployed, run_id="budget_control")
        # The deployed candidate is already in the trained run; keep only the probe rows.
        part = [r for r in part if r["probe"] == probe.name]
        if run is not None:
            run.write_question_batch(part)
        rows.extend(part)
    if run is not None:
        stored = run.read_records(filters=[("probe", "=", probe.name)])
        frame = stored[stored["question_id"].isin(list(question_ids))]
    else:
        frame = pd.DataFrame(rows, columns=["question_id", "candidate", "correct"])
    if frame.empty:
        return pd.DataFrame({"question_id": pd.Series(dtype=str), "c": pd.Series(dtype=np.int64),
                             "n": pd.Series(dtype=np.int64), "o": pd.Series(dtype=bool)})
    g = frame.groupby("question_id")["correct"]
    out = pd.DataFrame({"c": g.sum().astype(np.int64), "n": g.size().astype(np.int64)})
    out["o"] = out["c"] > 0
    return out.loc[list(question_ids)].reset_index()


def budget_summary(t: pd.DataFrame, control: pd.DataFrame, k: int, k_big: int) -> dict[str, Any]:
    """How many questions that left the reachable set at K come back with k_big fresh
    samples, and the net change in reachability (entered - left) / N at K and at k_big
    (only the left set is re-probed, so the k_big figure bounds the trained model's
    reachability loss from above)."""
    n = len(t)
    entered = int((t["reachable"] == "entered").sum())
    left = int((t["reachable"] == "left").sum())
    back = int(control["o"].sum()) if len(control) else 0
    return {
        "k": k, "k_control": k_big, "n_left": left, "n_back": back, "n_still_left": left - back,
        "reachable_change_at_k": (entered - left) / n, "reachable_change_at_k_control": (entered - (left - back)) / n,
    }


# -- the whole comparison -----------------------------------------------------------------


def compare_runs(base: RunDir, trained: RunDir, out: str | Path, *, edges: Sequence[float] = DEFAULT_BIN_EDGES,
                 control_lm=None, control_task=None, factor: int = 2, batch_size: int = 8,
                 level: float = 0.95) -> dict[str, Any]:
    """Align, classify, bin, test; with `control_lm` (the trained model, loaded) and
    `control_task` (the runs' task) also run the budget control. Writes a compare run
    folder at `out` and returns its summary."""
    # every refusal before the compare folder exists
    edges = check_bin_edges(edges)
    if control_lm is not None and (factor < 1 or batch_size < 1):
        raise ValueError(f"the budget control needs factor and batch_size >= 1, got {factor} and {batch_size}")
    check_aligned(base.config, trained.config)
    probe_name = base.config["probe"]["name"]
    t = transitions(base.read_records(), trained.read_records(), probe_name)
    config = {
        "kind": "compare",
        "base": {"path": str(base.path), "config_hash": base.config_hash, "model": base.config.get("model")},
        "trained": {"path": str(trained.path), "config_hash": trained.config_hash, "model": trained.config.get("model")},
        "bin_edges": [float(e) for e in edges],
        "budget_control": None if control_lm is None else {"model": control_lm.spec, "factor": factor},
    }
    run = RunDir.create(out, config)
    table = propensity(t, edges)
    summary: dict[str, Any] = {
        "kind": "compare",
        "base_model": base.config.get("model"), "trained_model": trained.config.get("model"),
        "task": base.config["task"].get("name"), "k": base.config["probe"]["k"],
        "temperature": base.config["probe"]["temperature"],
        **counts(t),
        "stats": paired_stats(t, level),
        "propensity": table.replace({np.nan: None}).to_dict("records"),
        "budget_control": None,
    }
    # Multiple-choice runs carry their chance baselines (audit summaries): shown side by side.
    chance = {label: run_.read_summary().get("chance") for label, run_ in (("base", base), ("trained", trained))
              if (run_.path / "summary.json").is_file()}
    if any(chance.values()):
        summary["chance"] = chance
    if control_lm is not None:
        if control_task is None:
            raise ValueError("the budget control needs the runs' task")
        if not _same_model(control_lm.spec, trained.config.get("model")):
            raise ValueError(f"the budget control must use the trained model {trained.config.get('model')!r}, got {control_lm.spec!r}")
        probe = budget_probe(base.config, factor)
        left_ids = t.loc[t["reachable"] == "left", "question_id"].tolist()
        control = budget_control(control_lm, control_task, left_ids, probe, Decoding(**base.config["deployed"]),
                                 batch_size=batch_size, run=run)
        back = dict(zip(control["question_id"], control["o"]))
        t["trained_o_control"] = [back.get(q) for q in t["question_id"]]
        summary["budget_control"] = budget_summary(t, control, int(base.config["probe"]["k"]), probe.k)
    run.write_table("transitions", t)
    run.write_table("propensity", table)
    run.write_summary(summary)
    return summary


def _same_model(a: str, b: str | None) -> bool:
    """Same spec, or two spellings of one checkpoint folder."""
    if b is None or a == b:
        return a == b
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def load_aligned_task(config: dict[str, Any], data: Optional[Path] = None):
    """The task a run was audited on, rebuilt from its config (name, question count;
    `data` for file tasks) and checked against the stored description and ids."""
    from rnr_interp.tasks import load_task

    described = config["task"]
    task = load_task(described["name"], data=data, n=described.get("n_questions"))
    differ = config_diff(comparable({"task": described}), comparable({"task": task.describe()}))
    if differ or task.ids_hash() != config["question_ids_hash"]:
        raise RunMismatchError(["task"], [f"the task rebuilt for the budget control differs from the runs' in "
                                          f"{', '.join(differ) or 'question_ids_hash'}; pass --data with the runs' data"])
    return task
