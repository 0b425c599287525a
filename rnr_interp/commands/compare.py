"""The compare command: base vs trained checkpoint audits, question by question."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rnr_interp.commands.common import at_least, check_out, execute, fail, print_multiple_choice


def compare(
    base_run: Annotated[Path, typer.Argument(help="audit run folder of the base model")],
    trained_run: Annotated[Path, typer.Argument(help="audit run folder of the trained checkpoint")],
    out: Annotated[Path, typer.Option("--out", "-o", help="compare run folder")] = Path("runs/compare"),
    bins: Annotated[str, typer.Option("--bins", help="propensity bin edges on the base hit rate c/n")] = "0,0.1,0.35,0.65,1",
    budget_control_model: Annotated[Optional[str], typer.Option(
        "--budget-control", help="trained model spec: re-probe the questions that left the reachable set at factor x K")] = None,
    factor: Annotated[int, typer.Option("--factor", help="budget multiplier of the control")] = 2,
    data: Annotated[Optional[Path], typer.Option("--data", help="data file of the runs' task (file tasks, for the control)")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 8,
):
    """Base vs trained checkpoint, question by question: gained/lost/kept/never,
    entered/left/stayed/never, propensity bins, McNemar and paired intervals."""
    from rnr_interp.compare import check_aligned, check_bin_edges, compare_runs, load_aligned_task
    from rnr_interp.records import RunDir

    at_least("--factor", factor)
    at_least("--batch-size", batch_size)
    try:
        edges = check_bin_edges(float(x) for x in bins.split(","))
    except ValueError:
        fail(f"--bins must be two or more comma-separated, strictly increasing numbers, got {bins!r}")
    check_out(out)

    def body():
        base, trained = RunDir(base_run), RunDir(trained_run)
        check_aligned(base.config, trained.config)
        lm = task = None
        if budget_control_model is not None:
            from rnr_interp.models import load_model

            task = load_aligned_task(base.config, data)
            lm = load_model(budget_control_model)
        return compare_runs(base, trained, out, edges=edges, control_lm=lm, control_task=task, factor=factor,
                            batch_size=batch_size)

    s = execute(body)
    st = s["stats"]
    typer.echo(f"{s['base_model']} -> {s['trained_model']} on {s['task']}: {s['n_questions']} questions, K={s['k']}")
    typer.echo("  realized:  " + "  ".join(f"{k} {v}" for k, v in s["realized"].items())
               + f"   (gained from base-reachable {s['gained_from']['base_reachable']}, unreachable {s['gained_from']['base_unreachable']})")
    typer.echo("  reachable: " + "  ".join(f"{k} {v}" for k, v in s["reachable"].items()))
    for name in ("D", "O_K"):
        m = st[name]
        typer.echo(f"  {name:4s} {m['base']:.3f} -> {m['trained']:.3f}  change {m['change']:+.3f} "
                   f"[{m['change_ci'][0]:+.3f}, {m['change_ci'][1]:+.3f}]  McNemar p={m['mcnemar']['p_value']:.3g}")
    if s["budget_control"]:
        bc = s["budget_control"]
        typer.echo(f"  budget control: {bc['n_back']} of {bc['n_left']} left questions come back at K={bc['k_control']}")
    print_multiple_choice(s)
    typer.echo(f"compare folder: {out}")
