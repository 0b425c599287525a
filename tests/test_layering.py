"""Imports point down only, between layers and within them, and no module imports
another's private names. Walks every module's imports (top level, inside functions and
under TYPE_CHECKING alike) and fails on any edge that points up or sideways.

The order below is the architecture: a module may import only modules listed before
its own entry (a package's `__init__` may import its own submodules). Inside a package
listed as one entry (tasks/, routing/, report/, ...), its modules may import each other
but not in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rnr_interp"

#: (layer, its entries in import order): a dotted name below rnr_interp names a module or a
#: whole package
LAYERS: list[tuple[str, list[str]]] = [
    ("data and models", ["lockfile", "models.packed_linear", "models.fast_attention", "models", "records.schema", "records.files",
                         "records.journal", "records.config", "records.lock", "records.summaries", "records.reference",
                         "records.outdir", "records.rundir", "records", "tasks", "metrics", "grading", "sae", "interventions"]),
    ("engine and rows", ["engine.decoding", "engine.batch", "engine.generate", "engine.vllm_backend", "engine.sampling", "engine.rows"]),
    ("analyses", ["analyses.audit", "analyses.routing", "analyses.localise.defaults", "analyses.localise.recognition",
                  "analyses.localise.positions", "analyses.localise.circular", "analyses.localise.readings", "analyses.localise.cohort",
                  "analyses.localise.directions", "analyses.localise.silencing", "analyses.localise.mediation",
                  "analyses.localise.choice", "analyses.localise.repair", "analyses.localise.steering", "analyses.patching",
                  "analyses.checkpoints", "analyses.finetune", "analyses.sweep",
                  "analyses.organisms", "analyses.anchor", "analyses.validate"]),
    ("report", ["report"]),
    ("reproduce", ["reproduce"]),
    ("notebook API", ["notebook"]),
    ("commands", ["commands"]),
    ("cli", ["cli"]),
]
#: packages that only group their layer's entries (their `__init__` imports nothing of ours)
GROUPS = ("engine", "analyses", "analyses.localise")
RANK = {entry: rank for rank, entry in enumerate(e for _, entries in LAYERS for e in entries)}
LAYER_OF = {entry: name for name, entries in LAYERS for entry in entries}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def entry(module: str) -> str | None:
    """The LAYERS entry a module belongs to: the longest listed prefix of its name."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANK:
            return ".".join(parts[:n])
    return None


def imports(path: Path, me: str) -> list[tuple[str, list[str]]]:
    """Each `rnr_interp` module the file imports, with the names it takes from it
    (relative imports resolved; `from rnr_interp.x import y` may name a module `x.y`)."""
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, node.module] if node.module else base)
            taken = [a.name for a in node.names]
            modules = [f"{name}.{t}" for t in taken if (PACKAGE.parent / f"{name}.{t}".replace(".", "/")).exists()
                       or (PACKAGE.parent / (f"{name}.{t}".replace(".", "/") + ".py")).exists()]
            names = [t for t in taken if f"{name}.{t}" not in modules]
            out += ([(name, names)] if names or not modules else []) + [(m, []) for m in modules]
    return [(m, names) for m, names in out if m.startswith("rnr_interp.")]


def bad_edges(path: Path, me: str) -> list[str]:
    mine = entry(me)
    found = []
    for target, names in imports(path, me):
        theirs = entry(target)
        if target.startswith(me + ".") and path.name == "__init__.py":
            continue  # a package imports its own submodules
        if theirs is None and target.removeprefix("rnr_interp.") in GROUPS:
            found.append(f"{me} imports the grouping package {target}: import the module itself")
        elif theirs is not None and mine is not None and theirs != mine and RANK[theirs] > RANK[mine]:
            found.append(f"{me} ({LAYER_OF[mine]}: {mine}) imports {target} ({LAYER_OF[theirs]}: {theirs}), "
                         "which comes later")
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        if private and target != me:
            found.append(f"{me} imports private {', '.join(private)} from {target}")
    return found


def edges_within(entry_name: str) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        me = module_name(path)
        if entry(me) == entry_name:
            graph[me] = {t for t, _ in imports(path, me) if entry(t) == entry_name and t != me
                         and not (path.name == "__init__.py" and t.startswith(me + "."))}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return trail + [node, nxt]
            if nxt not in state and (found := visit(nxt, trail + [node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def test_every_module_has_a_place():
    unplaced = [module_name(p) for p in PACKAGE.rglob("*.py")
                if entry(module_name(p)) is None and module_name(p) not in ("rnr_interp", *(f"rnr_interp.{g}" for g in GROUPS))]
    assert unplaced == []


def test_imports_point_down_only():
    found = [edge for path in sorted(PACKAGE.rglob("*.py")) for edge in bad_edges(path, module_name(path))]
    assert found == [], "\n".join(found)


def test_no_circle_inside_a_package():
    circles = {name: c for name in RANK if (c := cycle(edges_within(name)))}
    assert circles == {}


def test_the_walk_sees_bad_edges(tmp_path):
    """Not vacuous: imports inside functions, relative ones, module imports, sideways edges
    within a layer, private names and circles count."""
    sample = tmp_path / "x.py"
    sample.write_text("def f():\n    from rnr_interp.cli import fail\n")
    assert "comes later" in bad_edges(sample, "rnr_interp.analyses.localise.repair")[0]
    sample.write_text("from ...report import figures\n")
    assert bad_edges(sample, "rnr_interp.analyses.routing.run")[0].endswith("(report: report), which comes later")
    sample.write_text("import rnr_interp.analyses.localise.steering\n")
    assert bad_edges(sample, "rnr_interp.engine.generate") != []
    sample.write_text("from rnr_interp.analyses.localise import steering\n")
    assert bad_edges(sample, "rnr_interp.analyses.localise.repair") != []  # within a layer, later entry
    sample.write_text("from rnr_interp.engine.sampling import prompt_ids\n")
    assert bad_edges(sample, "rnr_interp.engine.vllm_backend") != []
    sample.write_text("from rnr_interp.engine.generate import _uniforms\n")
    assert "private _uniforms" in bad_edges(sample, "rnr_interp.engine.sampling")[0]
    sample.write_text("from rnr_interp.records import RunDir\n")
    assert bad_edges(sample, "rnr_interp.report.html") == []
    assert cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"] and cycle({"a": {"b"}, "b": set()}) is None


def test_the_cli_starts_without_torch():
    """`rnr --help` and option parsing import no model stack: commands import their
    analyses when they run, and the defaults their options name are torch-free."""
    import subprocess
    import sys

    probe = "import sys, rnr_interp.cli; print(sorted(m for m in ('torch', 'transformers', 'pandas') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"importing the CLI loads {loaded}"
