"""The sweep command: a grid of audits, locally or on Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rnr_interp.commands.common import check_out, execute, fail, one_of, out_folder


def sweep(
    grid: Annotated[Path, typer.Argument(help="grid spec (JSON): models, tasks, probes, interventions lists")],
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_folder, help="sweep folder: one run folder per cell, plus sweep.json")] = Path("runs/sweep"),
    use_ray: Annotated[bool, typer.Option("--ray", help="run the cells on a Ray cluster (one GPU per worker when there are GPUs)")] = False,
    address: Annotated[Optional[str], typer.Option("--address", help="Ray cluster address (default: local instance or $RAY_ADDRESS)")] = None,
    backend: Annotated[str, typer.Option("--backend", help="sampling backend: tl (TransformerLens) | vllm (no hooks)")] = "tl",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bars")] = False,
):
    """Run a grid of audits (model x task x probe x interventions), skipping finished cells."""
    from rnr_interp.engine.decoding import BACKENDS
    from rnr_interp.analyses.sweep import INDEX, Grid, status_counts, run_local, run_ray

    one_of("--backend", backend, BACKENDS)
    if address and not use_ray:
        fail("--address needs --ray")
    check_out(out, marks=(INDEX,))
    g = execute(lambda: Grid.load(grid), known=(OSError, ValueError, TypeError), context=f"grid {grid}: ")
    cells = execute(lambda: g.cells(backend), known=(OSError, ValueError, TypeError), context=f"grid {grid}: ")
    fallback = g.fallbacks(backend)
    if fallback:
        typer.echo(f"note: {fallback} of {len(cells)} cells have interventions, which need hooks: "
                   f"they run on the TransformerLens backend, not {backend}")
    if backend == "vllm" and not use_ray:
        from rnr_interp.engine.vllm_backend import vllm_available

        if not vllm_available():
            fail("--backend vllm needs the vllm package (pip install vllm on a GPU machine; make vllm builds .venv-vllm with the CPU build)")
    typer.echo(f"{len(cells)} cells -> {out}" + (" on Ray" if use_ray else ""))

    def show(entry: dict[str, Any]) -> None:
        typer.echo(f"  {entry['status']:<8} {entry['folder']}" + (f"  ({entry['error']})" if "error" in entry else ""))

    if use_ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            fail("--ray needs the ray package: pip install 'rnr_interp[scale]'")
        statuses = run_ray(cells, out, address=address, on_status=show)
    else:
        statuses = run_local(cells, out, progress=not quiet, on_status=show)
    counts = status_counts(statuses)
    typer.echo(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f"; index: {out / INDEX}")
    if counts.get("failed"):
        raise typer.Exit(1)
