"""The compare command: base vs trained checkpoint audits, question by question."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from rnr_interp.commands.common import (
    GradingOpt, at_least, check_grading_option, check_out, execute, fail, out_folder, print_multiple_choice,
)

if TYPE_CHECKING:
    from rnr_interp.records import CompareSummary


def compare(
    base_run: Annotated[Path, typer.Argument(help="audit run folder of the base model")],
    trained_run: Annotated[Path, typer.Argument(help="audit run folder of the trained checkpoint")],
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_folder, help="compare run folder")] = Path("runs/compare"),
    bins: Annotated[Optional[str], typer.Option("--bins", help="propensity bin edges on the base hit rate c/n; bins (lo, hi], the first "
                                                "closed (default: the paper's 0,0.1,0.35,1: top bin > 0.35)")] = None,
    budget_control: Annotated[bool, typer.Option(
        "--budget-control", help="re-probe every question with both runs' models at K and factor x K, fresh seeds")] = False,
    factor: Annotated[int, typer.Option("--factor", help="budget multiplier of the control")] = 2,
    budget_control_k: Annotated[Optional[int], typer.Option(
        "--budget-control-k", help="sample this many per question in the budget control when larger than factor x K "
        "(the source-of-gains curve is read up to it; the paper probes at K >= 200)")] = None,
    shared_prompt: Annotated[Optional[Path], typer.Option(
        "--shared-prompt", help="audit run of the trained model in the base prompt format (rnr audit --prompt-like BASE_RUN)")] = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="data file of the runs' task (file tasks, for the control)")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 8,
    grading: GradingOpt = None,
):
    """Base vs trained checkpoint, question by question: gained/lost/kept/never,
    entered/left/stayed/never, propensity bins, McNemar and paired intervals; prompt
    formats, shared-prompt share of the gain, budget control."""
    from rnr_interp.analyses.checkpoints import DEFAULT_BIN_EDGES, ROLES, check_aligned, check_bin_edges, load_aligned_task
    from rnr_interp.records import COMPARE, RunDir
    from rnr_interp.report.kinds import analysis_of

    at_least("--factor", factor)
    at_least("--budget-control-k", budget_control_k)
    at_least("--batch-size", batch_size)
    check_grading_option(grading)
    try:
        edges = DEFAULT_BIN_EDGES if bins is None else check_bin_edges(float(x) for x in bins.split(","))
    except ValueError:
        fail(f"--bins must be two or more comma-separated, strictly increasing numbers, got {bins!r}")
    check_out(out)

    def body():
        base, trained = RunDir(base_run), RunDir(trained_run)
        check_aligned(base.config, trained.config)
        shared = RunDir(shared_prompt) if shared_prompt is not None else None
        models = task = None
        if budget_control:
            from rnr_interp.models import load_model

            task = load_aligned_task(base.config, data)
            models = {role: load_model(run.config["model"]) for role, run in zip(ROLES, (base, trained))}
        elif data is not None or base.config.get("grading") is None:
            # records made before both grades were recorded: their strict grades are read from the texts
            try:
                task = load_aligned_task(base.config, data)
            except (OSError, ValueError):
                task = None
        return analysis_of(COMPARE).run(base, trained, out, edges=edges, control_models=models, control_task=task if models else None,
                                        task=task, factor=factor, budget_k=budget_control_k, shared_prompt=shared, batch_size=batch_size,
                                        grading=grading)

    s = execute(body)
    print_comparison(s)
    typer.echo(f"compare folder: {out}")


def print_comparison(s: CompareSummary) -> None:
    st = s.stats
    grading, other = s.headline, s.beside()
    typer.echo(f"{s.base_model} -> {s.trained_model} on {s.task}: {s.n_questions} questions, K={s.k}, "
               f"deployed decoding {s.deployed}; graded {grading}{f', {other} beside' if other else ''}")
    pf = s.prompt_formats
    for role in ("base", "trained"):
        typer.echo(f"  prompt format ({role}): " + ("not recorded" if pf[role] is None else
                   f"{pf[role]['template']!r}, BOS {'added' if pf[role]['add_bos'] else 'not added'}"))
    if pf["warning"]:
        typer.secho(f"  warning: {pf['warning']}", fg=typer.colors.YELLOW, err=True)
    typer.echo("  realized:  " + "  ".join(f"{k} {v}" for k, v in s.realized.items())
               + f"   (gained from base-reachable {s.gained_from['base_reachable']}, unreachable {s.gained_from['base_unreachable']})")
    typer.echo("  reachable: " + "  ".join(f"{k} {v}" for k, v in s.reachable.items()))
    if other:
        typer.echo(f"  {other}: realized " + "  ".join(f"{k} {v}" for k, v in s.graded(other)["realized"].items())
                   + ";  reachable " + "  ".join(f"{k} {v}" for k, v in s.graded(other)["reachable"].items()))
    for name in ("D", "O_K"):
        m = st[name]
        typer.echo(f"  {name:4s} {m['base']:.3f} -> {m['trained']:.3f}  change {m['change']:+.3f} "
                   f"[{m['change_ci'][0]:+.3f}, {m['change_ci'][1]:+.3f}]  McNemar p={m['mcnemar']['p_value']:.3g}")
    typer.echo("  propensity (trained realization by base hit rate, base-reachable unrealized questions): "
               + "  ".join(f"{p['bin']} {p['n_realized']}/{p['n']}" for p in s.propensity))
    if s.shared_prompt:
        for name in ("D", "O_K"):
            m = s.shared_prompt[name]
            share = "n/a (no native change)" if m["share_retained"] is None else f"{m['share_retained']:.1%}"
            typer.echo(f"  shared prompt {name}: change {m['shared_change']:+.3f} vs native {m['native_change']:+.3f}; "
                       f"share of the gain retained {share}")
    if s.budget_control:
        bc = s.budget_control
        for budget, b in bc["budgets"].items():
            typer.echo(f"  budget control K={budget}: reachable change {b['reachable_change']:+.3f} "
                       f"[{b['reachable_change_ci'][0]:+.3f}, {b['reachable_change_ci'][1]:+.3f}]; "
                       f"gap O-D base {b['gap_base']:.3f} [{b['gap_base_ci'][0]:.3f}, {b['gap_base_ci'][1]:.3f}], "
                       f"trained {b['gap_trained']:.3f} [{b['gap_trained_ci'][0]:.3f}, {b['gap_trained_ci'][1]:.3f}]")
        typer.echo(f"  {bc['audit_left']['n_back_at_k_control']} of {bc['audit_left']['n_left']} questions that left "
                   f"the reachable set in the audits are reached by the trained model at K={bc['k_control']}")
        src = bc.get("gained_source") or {}
        if src.get("n_gained"):
            typer.echo("  gained answers base-reachable by K (fresh base samples, 95% Wilson): " + "  ".join(
                f"K={c['k']} {c['base_reachable']}/{c['n_gained']} [{c['ci'][0]:.2f}, {c['ci'][1]:.2f}]" for c in src["curve"]))
            if src.get("null"):
                typer.echo(f"  the same share by chance ({src['null']}): " + "  ".join(
                    f"K={c['k']} {c['null_share']:.3f}" for c in src["curve"]))
            typer.echo(f"  share {src['trend']}")
    print_multiple_choice(s)
