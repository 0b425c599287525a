"""Imports point down only: models/tasks/records/metrics -> interventions ->
generate/sampling -> analyses -> report -> reproduce -> cli. Walks every module's imports (top level,
inside functions and under TYPE_CHECKING alike) and fails on any edge that points up."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rnr_interp"

#: the first part of a module's dotted name below rnr_interp -> its layer (low to high)
LAYERS: dict[str, int] = {
    "models": 0, "fast_attention": 0, "packed_linear": 0, "tasks": 0, "records": 0, "metrics": 0, "grading": 0,
    "interventions": 1,
    "generate": 2, "sampling": 2, "vllm_backend": 2,
    "audit": 3, "routing": 3, "recognition": 3, "cohort": 3, "repair": 3, "steering": 3, "compare": 3, "sweep": 3,
    "report": 4,
    "reproduce": 5,
    "commands": 6, "cli": 6,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, me: str) -> set[str]:
    """Every rnr_interp module the file at `path`, module `me`, imports (relative
    imports resolved)."""
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, node.module] if node.module else base)
            out.add(name)
            # `from rnr_interp import records`: the imported names may be modules
            out |= {f"{name}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("rnr_interp.")}


def upward(path: Path, me: str) -> list[str]:
    mine = layer(me)
    return [f"{me} (layer {mine}) imports {t} (layer {layer(t)})"
            for t in sorted(imported(path, me)) if layer(t) is not None and layer(t) > mine]


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None



def test_every_module_has_a_layer():
    unplaced = [module_name(p) for p in PACKAGE.rglob("*.py") if layer(module_name(p)) is None and p.parent != PACKAGE]
    top = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert unplaced == [] and top - {"__init__"} <= set(LAYERS), sorted(top - set(LAYERS))


def test_imports_point_down_only():
    found = [edge for path in sorted(PACKAGE.rglob("*.py")) if layer(me := module_name(path)) is not None
             for edge in upward(path, me)]
    assert found == [], "\n".join(found)


def test_the_walk_sees_upward_edges(tmp_path):
    """Not vacuous: imports inside functions, relative ones and module imports count."""
    sample = tmp_path / "x.py"
    sample.write_text("def f():\n    from rnr_interp.cli import fail\n")
    assert upward(sample, "rnr_interp.repair")[0] == "rnr_interp.repair (layer 3) imports rnr_interp.cli (layer 6)"
    sample.write_text("from ..report import figures\n")
    assert upward(sample, "rnr_interp.routing.audit")[0].endswith("rnr_interp.report (layer 4)")
    sample.write_text("import rnr_interp.steering\n")
    assert upward(sample, "rnr_interp.generate") != []
    sample.write_text("from rnr_interp.records import RunDir\n")
    assert upward(sample, "rnr_interp.report.html") == []
