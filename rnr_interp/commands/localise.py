"""Commands of the localisation analyses: failures, repair, steer, units. Each writes
its run folder through the analysis, then the report's figures into ``figures/``
(`_localise`, the command skeleton they share)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from rnr_interp.commands.common import (
    BatchOpt, DataOpt, MaxTokOpt, ModelOpt, NOpt, OutOpt, QuietOpt, SeedOpt, TaskOpt, at_least, execute, fail,
    load_inputs, print_multiple_choice, run_folder,
)
from rnr_interp.steering import DEFAULT_ALPHAS, DEFAULT_KS

ReadoutOpt = Annotated[str, typer.Option("--readout", help="recognition readout for the failure set: option:mean | option:sum | letter")]
PanelOpt = Annotated[Optional[int], typer.Option("--panel", help="healthy panel size (first N deployed-right questions)")]
LayersOpt = Annotated[Optional[str], typer.Option("--layers", help="layers to sweep, e.g. '0-5,9' (default: all)")]
LayerOpt = Annotated[Optional[int], typer.Option("--layer", help="block layer (default: best of --repair-run, else found by a sweep)")]
RepairRunOpt = Annotated[Optional[Path], typer.Option("--repair-run", help="repair run folder: its failure set, panel and best block")]

_ALPHAS = ",".join(f"{a:g}" for a in DEFAULT_ALPHAS)
_KS = ",".join(map(str, DEFAULT_KS))


def parse_layers(spec: Optional[str], n_layers: int) -> list[int]:
    if not spec:
        return list(range(n_layers))
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or not (hi.isdigit() or hi == ""):
            raise ValueError(f"--layers takes layers and ranges such as '0-5,9', got {spec!r}")
        out.extend(range(int(lo), int(hi or lo) + 1))
    bad = [i for i in out if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"--layers names layer {bad[0]}, but the model has layers 0..{n_layers - 1}")
    return list(dict.fromkeys(out))


def _numbers(option: str, text: str, kind: type = float) -> list:
    """A comma-separated list of `kind` (finite), or a one-line refusal naming `option`."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) for v in values):
        fail(f"{option} must be comma-separated {'whole ' if kind is int else ''}numbers, got {text!r}")
    return values


def _figures(out: Path) -> None:
    from rnr_interp.records import RunDir
    from rnr_interp.report.registry import write_run_figures

    write_run_figures(RunDir(out))


def _localise(analysis, model: str, task: str, data, n, out: Path, max_new_tokens, batch_size: int, quiet: bool,
              per_model=lambda lm: {}, **options) -> dict:
    """The localisation commands' body: load, run `analysis` with greedy short decoding
    (`cohort.deployed_decoding`), figures into the run folder; `per_model(lm)` gives the
    options that depend on the loaded model."""
    from rnr_interp.cohort import deployed_decoding

    at_least("--batch-size", batch_size)
    at_least("--panel", options.get("panel"))

    def body():
        lm, t = load_inputs(model, task, data, n, out=out, max_new_tokens=max_new_tokens)
        return analysis(lm, t, out, decoding=deployed_decoding(t, max_new_tokens), batch_size=batch_size,
                        progress=not quiet, **per_model(lm), **options)

    summary = execute(body)
    _figures(out)
    return summary


def _print_curve(s: dict, what: str, headline: str, header: str, pivot: tuple[str, str, str], row) -> None:
    """A steer/units summary: why it was skipped, or its table as one line per x."""
    import pandas as pd

    if "skipped" in s:
        typer.echo(f"no {what}: {s['skipped']}")
        return
    typer.echo(f"{s['model']} on {s['task']}: {headline}")
    typer.echo(header)
    index, columns, values = pivot
    for x, r in pd.DataFrame(s["table"]).pivot(index=index, columns=columns, values=values).iterrows():
        typer.echo(row(x, r))


def failures(
    model: ModelOpt = "smollm2", task: TaskOpt = "arc_easy", data: DataOpt = None, n: NOpt = 24,
    out: OutOpt = Path("runs/failures"), readout: ReadoutOpt = "option:mean", panel: PanelOpt = None,
    max_new_tokens: MaxTokOpt = None, batch_size: BatchOpt = 32, quiet: QuietOpt = False,
):
    """Failure set (recognised but answered wrong) and healthy panel of an MC task."""
    from rnr_interp.repair import run_failures

    s = _localise(run_failures, model, task, data, n, out, max_new_tokens, batch_size, quiet, readout=readout, panel=panel)
    typer.echo(f"{s['model']} on {s['task']}: {s['n_questions']} questions, deployed accuracy {s['deployed_accuracy']:.3f}")
    typer.echo(f"  recognition (gold first): {s.get('recognition_accuracy')}")
    typer.echo(f"  failure set: {s['n_failure']}   healthy panel: {s['n_panel']}")
    if s["failure_empty_reason"]:
        typer.echo(f"  failure set is empty: {s['failure_empty_reason']}")
    print_multiple_choice(s)
    run_folder(out)


def repair(
    model: ModelOpt = "smollm2", task: TaskOpt = "arc_easy", data: DataOpt = None, n: NOpt = 24,
    out: OutOpt = Path("runs/repair"), readout: ReadoutOpt = "option:mean", panel: PanelOpt = 8,
    layers: LayersOpt = None, max_new_tokens: MaxTokOpt = None, batch_size: BatchOpt = 32, quiet: QuietOpt = False,
):
    """Silence every layer's MLP / attention / whole layer: repair and damage rates."""
    from rnr_interp.repair import run_repair

    s = _localise(run_repair, model, task, data, n, out, max_new_tokens, batch_size, quiet, readout=readout, panel=panel,
                  per_model=lambda lm: {"layers": parse_layers(layers, lm.n_layers)})
    typer.echo(f"{s['model']} on {s['task']}: failure set {s['n_failure']}, panel {s['n_panel']}")
    if s["failure_empty_reason"]:
        typer.echo(f"  no repair to find: {s['failure_empty_reason']}")
    for c, b in s["best"].items():
        typer.echo(f"  best {c:5s}: " + ("nothing repaired" if b is None else
                   f"layer {b['layer']}  repair {b['repair_rate']:.3f}  damage {b['damage_rate']:.3f}"))
    print_multiple_choice(s)
    run_folder(out)


def steer(
    model: ModelOpt = "smollm2", task: TaskOpt = "arc_easy", data: DataOpt = None, n: NOpt = 24,
    out: OutOpt = Path("runs/steer"), layer: LayerOpt = None,
    component: Annotated[str, typer.Option("--component", help="mlp | attn | layer")] = "mlp",
    repair_run: RepairRunOpt = None,
    alphas: Annotated[str, typer.Option("--alphas", help="comma-separated alpha grid")] = _ALPHAS,
    readout: ReadoutOpt = "option:mean", panel: PanelOpt = 8, max_new_tokens: MaxTokOpt = None,
    batch_size: BatchOpt = 32, quiet: QuietOpt = False,
):
    """Steer the chosen block along v: rescue the failures, induce failures in the panel."""
    from rnr_interp.interventions import COMPONENT_SITE
    from rnr_interp.steering import run_steer

    if component not in COMPONENT_SITE:
        fail(f"--component must be one of {', '.join(COMPONENT_SITE)}, got {component!r}")
    s = _localise(run_steer, model, task, data, n, out, max_new_tokens, batch_size, quiet, layer=layer,
                  component=component, repair_run=repair_run, alphas=_numbers("--alphas", alphas), readout=readout, panel=panel)
    _print_curve(s, "steering", f"{component} layer {s.get('layer')} ({s.get('block_choice')}), |v| = {s.get('v_norm', 0):.3f}",
                 "  alpha  rescue  induction", ("alpha", "direction", "rate"),
                 lambda alpha, r: f"  {alpha:5g}  {r['rescue']:6.3f}  {r['induction']:9.3f}")
    print_multiple_choice(s)
    run_folder(out)


def units(
    model: ModelOpt = "smollm2", task: TaskOpt = "arc_easy", data: DataOpt = None, n: NOpt = 24,
    out: OutOpt = Path("runs/units"), layer: LayerOpt = None, repair_run: RepairRunOpt = None,
    ks: Annotated[str, typer.Option("--ks", help="comma-separated k grid")] = _KS,
    seed: SeedOpt = 0, readout: ReadoutOpt = "option:mean", panel: PanelOpt = 8, max_new_tokens: MaxTokOpt = None,
    batch_size: BatchOpt = 32, quiet: QuietOpt = False,
):
    """Silence the top-k MLP units along v vs k random units: share of the block's repair."""
    from rnr_interp.steering import run_units

    s = _localise(run_units, model, task, data, n, out, max_new_tokens, batch_size, quiet, layer=layer,
                  repair_run=repair_run, ks=_numbers("--ks", ks, int), seed=seed, readout=readout, panel=panel)
    _print_curve(s, "unit analysis", f"MLP layer {s.get('layer')} ({s.get('block_choice')}), whole-MLP repair {s.get('whole_block_repair', 0):.3f}",
                 "  k     top    random   (fraction of the whole-MLP repair)", ("k", "selection", "recovered_fraction"),
                 lambda k, r: f"  {k:<5d} {r['top']:6.3f} {r['random']:8.3f}")
    print_multiple_choice(s)
    run_folder(out)
