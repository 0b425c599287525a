"""Failure localisation and repair: which block, silenced, turns a recognised-but-missed
answer right, and what does silencing it break?

- Failure set: questions whose recognition readout (`recognition.py`) ranks the gold
  option first while the deployed (greedy) generation is wrong: the model "knows" the
  answer and still does not say it. Healthy panel: questions the deployed generation
  gets right (the first `panel` of them in task order).
- Silencing sweep: for every layer and component in {mlp, attn, layer}, zero-ablate it
  and re-run the deployed generation on both sets. Repair rate = fraction of the
  failure set now right; damage rate = fraction of the panel now wrong. Every
  (question, ablation) pair is one batch row with its own intervention set, so the whole
  sweep is a few batched generations, not L x 3 runs.

Each generation is a standard record (probe "deployed" for the baseline,
``ablate:{component}:{layer}`` for sweep rows), written per chunk, so an interrupted run
resumes where it stopped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Optional, Sequence

import numpy as np
import pandas as pd
import typer
from tqdm.auto import tqdm

from rnr_interp.generate import Decoding, generate
from rnr_interp.interventions import Ablate, Intervention, set_id
from rnr_interp.metrics import DEPLOYED
from rnr_interp.recognition import READOUTS, gold_first, recognize
from rnr_interp.records import RunDir
from rnr_interp.sampling import candidate_row, chunks, prompt_ids
from rnr_interp.tasks.base import MultipleChoiceTask, Question, Task

COMPONENTS = ("mlp", "attn", "layer")
#: MC answers come first ("A. ...", "Answer: B"): a few tokens decide the grade.
MC_MAX_NEW_TOKENS = 8


def deployed_decoding(task: Task, max_new_tokens: int | None = None) -> Decoding:
    """Greedy decoding, short for multiple-choice tasks."""
    if max_new_tokens is None:
        max_new_tokens = MC_MAX_NEW_TOKENS if isinstance(task, MultipleChoiceTask) else task.max_new_tokens
    return Decoding(temperature=0.0, max_new_tokens=max_new_tokens)


# -- generation rows -----------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One batch row: a question under one intervention set, labelled `probe`."""

    question: Question
    interventions: tuple[Intervention, ...]
    probe: str


def generate_rows(lm, task: Task, rows: Sequence[Row], decoding: Decoding, run_id: str = "") -> list[dict[str, Any]]:
    """Greedy generations of `rows` in one batched call, each row under its own set."""
    gens = generate(
        lm, [prompt_ids(lm, task, r.question) for r in rows], n=1, decoding=decoding,
        interventions=[list(r.interventions) for r in rows], stop_strings=task.stop_strings,
    )
    common = {"run_id": run_id, "model": lm.spec, "task": task.name, "candidate": 0, "seed": 0}
    return [
        candidate_row(task, r.question, g[0], **common, probe=r.probe, intervention=set_id(r.interventions))
        for r, g in zip(rows, gens)
    ]


def run_rows(
    lm, task: Task, rows: Sequence[Row], decoding: Decoding, run: RunDir | None = None,
    batch_size: int = 32, desc: str = "rows", progress: bool = False,
) -> pd.DataFrame:
    """Records of `rows`: those already stored in `run` are read back, the rest are
    generated in chunks of `batch_size` rows (written per chunk)."""
    done = run.stored_groups() if run is not None else set()
    todo = [r for r in rows if (r.question.id, r.probe) not in done]
    # Rows of one question are adjacent, so a chunk has little padding.
    order = {q: i for i, q in enumerate(dict.fromkeys(r.question.id for r in todo))}
    todo.sort(key=lambda r: order[r.question.id])
    run_id = run.run_id if run is not None else ""
    produced: list[dict[str, Any]] = []
    for chunk in tqdm(list(chunks(todo, batch_size)), desc=desc, unit="batch", disable=not progress):
        recs = generate_rows(lm, task, chunk, decoding, run_id=run_id)
        if run is not None:
            run.write_question_batch(recs)
        produced.extend(recs)
    wanted = {(r.question.id, r.probe) for r in rows}
    if run is None:
        return pd.DataFrame(produced)
    records = run.read_records()
    keep = [(q, p) in wanted for q, p in zip(records["question_id"], records["probe"])]
    return records[keep].reset_index(drop=True)


# -- failure set and healthy panel ---------------------------------------------------


@dataclass
class Cohort:
    """The failure set and the healthy panel, with the criteria that made them."""

    failure: list[Question]
    panel: list[Question]
    failure_criterion: str
    panel_criterion: str
    n_questions: int
    n_recognised: int
    n_deployed_correct: int

    def failure_json(self) -> dict[str, Any]:
        return {"question_ids": [q.id for q in self.failure], "criterion": self.failure_criterion}

    def panel_json(self) -> dict[str, Any]:
        return {"question_ids": [q.id for q in self.panel], "criterion": self.panel_criterion}

    def why_empty(self) -> str | None:
        """A one-line reason when the failure set is empty, else None."""
        if self.failure:
            return None
        if self.n_recognised == 0:
            return f"recognition ranks the gold option first on none of the {self.n_questions} questions"
        if self.n_deployed_correct == self.n_questions:
            return "the deployed generation is right on every question"
        return (f"every one of the {self.n_recognised} recognised questions is already answered right "
                f"by the deployed generation")


def select_cohort(
    questions: Sequence[Question], recognition: Sequence[dict[str, Any]], deployed: pd.DataFrame,
    readout: str = "option:mean", panel: int | None = None,
) -> Cohort:
    """Failure set = gold first under `readout` and deployed wrong; panel = deployed
    right (the first `panel` in task order, all when None)."""
    recognised = gold_first(recognition, readout)
    correct = dict(zip(deployed["question_id"], deployed["correct"].astype(bool)))
    failure = [q for q in questions if q.id in recognised and not correct[q.id]]
    healthy = [q for q in questions if correct[q.id]]
    chosen = healthy if panel is None else healthy[:panel]
    limit = "" if panel is None or len(healthy) <= panel else f" (the first {panel} of {len(healthy)} in task order)"
    return Cohort(
        failure=failure, panel=chosen,
        failure_criterion=f"recognition readout {readout!r} ranks the gold option first and the greedy deployed generation is graded wrong",
        panel_criterion=f"the greedy deployed generation is graded right{limit}",
        n_questions=len(questions), n_recognised=len(recognised & {q.id for q in questions}),
        n_deployed_correct=sum(correct[q.id] for q in questions),
    )


def build_cohort(
    lm, task: MultipleChoiceTask, run: RunDir, *, readout: str = "option:mean", panel: int | None = None,
    decoding: Decoding, batch_size: int = 32, progress: bool = False,
) -> Cohort:
    """Recognition + deployed baseline for every question of `task`, the cohort from
    them; writes the `recognition` table, deployed records and the two id lists."""
    if not isinstance(task, MultipleChoiceTask):
        raise ValueError(f"task {task.name!r} is not multiple choice: failure localisation needs options to rank")
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
    recognition = recognize(lm, task, task.questions, batch_size=max(1, batch_size // 2))
    run.write_table("recognition", pd.DataFrame(recognition))
    deployed = run_rows(lm, task, [Row(q, (), DEPLOYED) for q in task.questions], decoding, run,
                        batch_size=batch_size, desc="deployed", progress=progress)
    cohort = select_cohort(task.questions, recognition, deployed, readout=readout, panel=panel)
    run.write_json("failure_set", cohort.failure_json())
    run.write_json("healthy_panel", cohort.panel_json())
    return cohort


def cohort_summary(cohort: Cohort, recognition: pd.DataFrame | None = None) -> dict[str, Any]:
    out = {
        "n_questions": cohort.n_questions,
        "n_recognised": cohort.n_recognised,
        "deployed_accuracy": cohort.n_deployed_correct / max(cohort.n_questions, 1),
        "n_failure": len(cohort.failure),
        "n_panel": len(cohort.panel),
        "failure_criterion": cohort.failure_criterion,
        "panel_criterion": cohort.panel_criterion,
        "failure_empty_reason": cohort.why_empty(),
    }
    if recognition is not None and len(recognition):
        out["recognition_accuracy"] = recognition.groupby("readout")["gold_first"].mean().astype(float).to_dict()
    return out


# -- silencing sweep ---------------------------------------------------------------


def rates(records: pd.DataFrame, failure: Sequence[Question], panel: Sequence[Question], probe: str) -> tuple[float, float]:
    """(repair rate on the failure set, damage rate on the panel) of one probe's records;
    NaN for an empty set."""
    mine = records[records["probe"] == probe]
    correct = dict(zip(mine["question_id"], mine["correct"].astype(bool)))
    repair = float(np.mean([correct[q.id] for q in failure])) if failure else float("nan")
    damage = float(np.mean([not correct[q.id] for q in panel])) if panel else float("nan")
    return repair, damage


def ablation_probe(component: str, layer: int) -> str:
    return set_id([Ablate(component, layer)])


def silencing_sweep(
    lm, task: Task, failure: Sequence[Question], panel: Sequence[Question], *, decoding: Decoding,
    layers: Sequence[int] | None = None, components: Sequence[str] = COMPONENTS,
    run: RunDir | None = None, batch_size: int = 32, progress: bool = False,
) -> pd.DataFrame:
    """The repair table: one row per (layer, component) with repair_rate, damage_rate,
    selectivity (repair - damage), n_failure, n_panel."""
    layers = list(range(lm.n_layers)) if layers is None else list(layers)
    blocks = [(layer, c) for layer in layers for c in components]
    questions = list(dict.fromkeys([*failure, *panel]))
    rows = [Row(q, (Ablate(c, layer),), ablation_probe(c, layer)) for q in questions for layer, c in blocks]
    records = run_rows(lm, task, rows, decoding, run, batch_size=batch_size, desc="sweep", progress=progress)
    table = []
    for layer, c in blocks:
        repair, damage = rates(records, failure, panel, ablation_probe(c, layer))
        table.append({"layer": layer, "component": c, "repair_rate": repair, "damage_rate": damage,
                      "selectivity": repair - damage, "n_failure": len(failure), "n_panel": len(panel)})
    return pd.DataFrame(table)


def best_blocks(table: pd.DataFrame) -> dict[str, dict[str, Any] | None]:
    """Per component, the block with the highest selectivity (ties: higher repair, then
    lower damage, then the earlier layer); None when nothing was repaired."""
    out: dict[str, dict[str, Any] | None] = {}
    for c, sub in table.groupby("component", sort=False):
        sub = sub[sub["repair_rate"].fillna(0) > 0]
        if sub.empty:
            out[str(c)] = None
            continue
        damage = sub["damage_rate"].fillna(0)
        ranked = sub.assign(_d=damage, _s=sub["repair_rate"] - damage).sort_values(
            ["_s", "repair_rate", "_d", "layer"], ascending=[False, False, True, True], kind="stable")
        top = ranked.iloc[0]
        out[str(c)] = {"layer": int(top["layer"]), "repair_rate": float(top["repair_rate"]),
                       "damage_rate": float(top["damage_rate"]), "selectivity": float(top["_s"])}
    return out


# -- run folders ---------------------------------------------------------------------


def repair_config(kind: str, lm, task: Task, decoding: Decoding, readout: str, panel: int | None,
                  batch_size: int, **extra: Any) -> dict[str, Any]:
    """What decides a run's records; a run folder resumes only with the same config."""
    return {
        "kind": kind, "model": lm.spec, "model_facts": lm.facts(), "task": task.describe(),
        "question_ids_hash": task.ids_hash(), "deployed": asdict(decoding),
        "readout": readout, "panel": panel, "batch_size": batch_size, **extra,
    }


def run_failures(lm, task: MultipleChoiceTask, out: str | Path, *, readout: str = "option:mean",
                 panel: int | None = None, decoding: Decoding | None = None, batch_size: int = 32,
                 progress: bool = True) -> dict[str, Any]:
    """Recognition, deployed baseline and the cohort, into a run folder (kind "failures")."""
    decoding = decoding or deployed_decoding(task)
    run = RunDir.create(out, repair_config("failures", lm, task, decoding, readout, panel, batch_size))
    cohort = build_cohort(lm, task, run, readout=readout, panel=panel, decoding=decoding,
                          batch_size=batch_size, progress=progress)
    summary = {"kind": "failures", "model": lm.spec, "task": task.name, "readout": readout,
               **cohort_summary(cohort, run.read_table("recognition"))}
    run.write_summary(summary)
    return summary


def run_repair(lm, task: MultipleChoiceTask, out: str | Path, *, readout: str = "option:mean",
               panel: int | None = 8, decoding: Decoding | None = None, layers: Sequence[int] | None = None,
               components: Sequence[str] = COMPONENTS, batch_size: int = 32, progress: bool = True) -> dict[str, Any]:
    """Cohort + silencing sweep into a run folder (kind "repair"): the `repair` table,
    figures and a summary with the best block per component."""
    from rnr_interp.report.repair_figures import damage_heatmap, repair_heatmap, selectivity_plot

    decoding = decoding or deployed_decoding(task)
    layers = list(range(lm.n_layers)) if layers is None else list(layers)
    run = RunDir.create(out, repair_config("repair", lm, task, decoding, readout, panel, batch_size,
                                           layers=layers, components=list(components)))
    cohort = build_cohort(lm, task, run, readout=readout, panel=panel, decoding=decoding,
                          batch_size=batch_size, progress=progress)
    table = silencing_sweep(lm, task, cohort.failure, cohort.panel, decoding=decoding, layers=layers,
                            components=components, run=run, batch_size=batch_size, progress=progress)
    run.write_table("repair", table)
    title = figure_title(lm, task, cohort)
    write_figures(run, {"repair_heatmap": repair_heatmap(table, title), "damage_heatmap": damage_heatmap(table, title),
                        "selectivity": selectivity_plot(table, title)})
    summary = {"kind": "repair", "model": lm.spec, "task": task.name, "readout": readout,
               **cohort_summary(cohort, run.read_table("recognition")),
               "best": best_blocks(table), "table": table.to_dict(orient="records")}
    run.write_summary(summary)
    return summary


def figure_title(lm, task: Task, cohort: Cohort) -> str:
    return f"{lm.spec} on {task.name}: {len(cohort.failure)} failures, panel {len(cohort.panel)}"


def write_figures(run: RunDir, figures: dict[str, Any]) -> None:
    """Each figure as an HTML file in ``figures/``, sharing one local plotly.min.js."""
    folder = run.path / "figures"
    folder.mkdir(exist_ok=True)
    for name, fig in figures.items():
        # "directory": one local plotly.min.js beside the pages, so they open offline.
        fig.write_html(folder / f"{name}.html", include_plotlyjs="directory")


# -- CLI -----------------------------------------------------------------------------
# The shared option aliases are imported from cli.py at the END of this module, and
# the annotations stay strings until typer reads them (`from __future__ import
# annotations`): cli.py imports these commands, so either module may be imported first.

ReadoutOpt = Annotated[str, typer.Option("--readout", help="recognition readout for the failure set: option:mean | option:sum | letter")]
PanelOpt = Annotated[Optional[int], typer.Option("--panel", help="healthy panel size (first N deployed-right questions)")]
LayersOpt = Annotated[Optional[str], typer.Option("--layers", help="layers to sweep, e.g. '0-5,9' (default: all)")]


def parse_layers(spec: Optional[str], n_layers: int) -> list[int]:
    if not spec:
        return list(range(n_layers))
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    bad = [i for i in out if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"--layers names layer {bad[0]}, but the model has layers 0..{n_layers - 1}")
    return list(dict.fromkeys(out))


def failures_command(
    model: ModelOpt = "smollm2", task: TaskOpt = "arc_easy", data: DataOpt = None, n: NOpt = 24,
    out: OutOpt = Path("runs/failures"), readout: ReadoutOpt = "option:mean", panel: PanelOpt = None,
    max_new_tokens: MaxTokOpt = None, batch_size: BatchOpt = 32, quiet: QuietOpt = False,
):
    """Failure set (recognised but answered wrong) and healthy panel of an MC task."""
    lm, t = load_inputs(model, task, data, n)
    try:
        s = run_failures(lm, t, out, readout=readout, panel=panel, decoding=deployed_decoding(t, max_new_tokens),
                         batch_size=batch_size, progress=not quiet)
    except ValueError as exc:
        fail(str(exc))
    typer.echo(f"{s['model']} on {s['task']}: {s['n_questions']} questions, deployed accuracy {s['deployed_accuracy']:.3f}")
    typer.echo(f"  recognition (gold first): {s.get('recognition_accuracy')}")
    typer.echo(f"  failure set: {s['n_failure']}   healthy panel: {s['n_panel']}")
    if s["failure_empty_reason"]:
        typer.echo(f"  failure set is empty: {s['failure_empty_reason']}")
    typer.echo(f"run folder: {out}")


def repair_command(
    model: ModelOpt = "smollm2", task: TaskOpt = "arc_easy", data: DataOpt = None, n: NOpt = 24,
    out: OutOpt = Path("runs/repair"), readout: ReadoutOpt = "option:mean", panel: PanelOpt = 8,
    layers: LayersOpt = None, max_new_tokens: MaxTokOpt = None, batch_size: BatchOpt = 32, quiet: QuietOpt = False,
):
    """Silence every layer's MLP / attention / whole layer: repair and damage rates."""
    lm, t = load_inputs(model, task, data, n)
    try:
        s = run_repair(lm, t, out, readout=readout, panel=panel, decoding=deployed_decoding(t, max_new_tokens),
                       layers=parse_layers(layers, lm.n_layers), batch_size=batch_size, progress=not quiet)
    except ValueError as exc:
        fail(str(exc))
    typer.echo(f"{s['model']} on {s['task']}: failure set {s['n_failure']}, panel {s['n_panel']}")
    if s["failure_empty_reason"]:
        typer.echo(f"  no repair to find: {s['failure_empty_reason']}")
    for c, b in s["best"].items():
        typer.echo(f"  best {c:5s}: " + ("nothing repaired" if b is None else
                   f"layer {b['layer']}  repair {b['repair_rate']:.3f}  damage {b['damage_rate']:.3f}"))
    typer.echo(f"run folder: {out}")


from rnr_interp.cli import BatchOpt, DataOpt, MaxTokOpt, ModelOpt, NOpt, OutOpt, QuietOpt, TaskOpt, fail, load_inputs  # noqa: E402
