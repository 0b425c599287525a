"""The reproduce command: the paper's protocol end to end, in resumable parts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rnr_interp.commands.common import QuietOpt, check_out, execute, fail, out_folder


def _checkpoints(specs: list[str]) -> dict[str, Path]:
    out = {}
    for spec in specs:
        recipe, sep, path = spec.partition("=")
        if not sep or not recipe or not path:
            fail(f"--checkpoint takes RECIPE=DIR (e.g. grpo=runs/ckpt/grpo), got {spec!r}")
        if not Path(path).is_dir():
            fail(f"--checkpoint {recipe}: {path} is not a folder")
        out[recipe] = Path(path)
    return out


def reproduce(
    profile: Annotated[str, typer.Option("--profile", help="smoke (tiny models) | demo (SmolLM2, this CPU) | full (paper sizes, GPU)")] = "demo",
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_folder,
                                      help="root folder: one folder of run folders per part (resumed)")] = Path("runs/reproduce"),
    parts: Annotated[Optional[str], typer.Option("--parts", help="comma-separated parts to run (default: all but the "
                                                 "profile's opt-in ones, e.g. 6_validation in demo), e.g. 1_audit,2_routing")] = None,
    checkpoint: Annotated[list[str], typer.Option("--checkpoint", help="RECIPE=DIR: a trained checkpoint to audit instead of training one (repeatable)")] = [],
    quiet: QuietOpt = False,
):
    """Reproduce the paper on one model: audit, routing cells, temperature sweep, failure
    screen + localisation, checkpoint audit; findings table and one index report."""
    from rnr_interp.reproduce import get_profile, reproduce as run_reproduction
    from rnr_interp.report.reproduction import where_spent
    from rnr_interp.reproduce.driver import STATE

    chosen = execute(lambda: get_profile(profile))
    check_out(out, marks=(STATE,))
    ckpts = _checkpoints(checkpoint)
    wanted = [p.strip() for p in parts.split(",") if p.strip()] if parts else None
    typer.echo(f"profile {chosen.name}: {chosen.model} -> {out}")
    result = execute(lambda: run_reproduction(chosen, out, parts=wanted, checkpoints=ckpts, progress=not quiet,
                                              log=typer.echo))
    typer.echo("\ncost per part (wall seconds, summed over invocations):")
    for name, p in result["parts"].items():
        where = where_spent(p)
        typer.echo(f"  {name:<16} {p['status']:<8} {p['seconds']:8.0f} s" + (f" ({where})" if where else "")
                   + (f"  {p['error']}" if p.get("error") else ""))
    typer.echo("\nfindings:")
    for f in result["findings"]:
        typer.echo(f"  [{f['verdict']}] {f['claim']} ({f['scope']}): {f['measured'] or f['why']}")
    typer.echo(f"report: {result['index']}")
    if any(p["status"] == "failed" for p in result["parts"].values()):
        raise typer.Exit(1)
