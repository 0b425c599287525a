"""The plant command: a model organism (a known effect planted in a model) written as
an ordinary checkpoint folder with its ground truth in ``planted.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from rnr_interp.commands.common import ModelOpt, QuietOpt, execute, out_folder


def plant(
    kind: Annotated[str, typer.Argument(help="layer (an extra decoder layer at --layer) | null (layer at strength 0, "
                                        "at a layer drawn from --seed)")],
    model: ModelOpt = "smollm2",
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_folder, help="new checkpoint folder (load it with --model)")] = Path("runs/organism"),
    layer: Annotated[Optional[int], typer.Option("--layer", help="where to plant (default: drawn from --seed, middle half)")] = None,
    strength: Annotated[Optional[float], typer.Option("--strength", help="effect size (layer: scale of the copy's "
                                                      "writes, 1 = an exact duplicate, 0 = no effect)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed of every draw (same seed: same weights bit for bit)")] = 0,
    task: Annotated[Optional[str], typer.Option("--task", "-t", help="the task the organism is made for (recorded)")] = None,
    quiet: QuietOpt = False,
):
    """Plant a known effect in MODEL and write it as a checkpoint folder every command
    loads with --model OUT; planted.json holds what was planted and what each analysis
    should find."""
    from rnr_interp.analyses.plant import plant as plant_organism

    planted = execute(lambda: plant_organism(kind, model, out, layer=layer, strength=strength, seed=seed, task=task))
    typer.echo(f"planted {planted.kind} in {planted.base} at {json.dumps(planted.location)}, strength {planted.strength:g}, "
               f"seed {planted.seed}: {planted.n_layers_base} -> {planted.n_layers} layers")
    typer.echo(f"  expected: {json.dumps(planted.expected)}")
    typer.echo(f"checkpoint: {out} (weights sha256 {planted.weights_sha256[:16]}...)")
