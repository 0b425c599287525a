"""rnr_interp: realized vs reachable, question by question.

In a notebook::

    import rnr_interp as rnr
    res = rnr.audit("tiny-llama", "arithmetic", k=8, n=4)   # or your own model object and Task
    res.summary.O_K, res.records                             # the summary and a DataFrame of records

`audit`, `route`, `repair`, `steer` and `compare` return a `Result` (`notebook.py`);
`load_model`, `load_task`, the intervention specs and `generate` are here too. The
README maps the rest (one concept per module). Importing this package imports none of
its dependencies: each name loads its module when first used.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

#: each public name and the module that defines it
PUBLIC = {
    "audit": "notebook", "route": "notebook", "repair": "notebook", "steer": "notebook", "compare": "notebook",
    "Result": "notebook",
    "load_model": "models", "LoadedModel": "models", "load_task": "tasks",
    "Probe": "engine.sampling", "Decoding": "engine.decoding", "generate": "engine.generate",
    "Ablate": "interventions", "AblateUnits": "interventions", "Steer": "interventions", "Route": "interventions",
    "Clamp": "interventions", "AblateHead": "interventions", "Patch": "interventions", "SAEFeature": "interventions",
    "applied": "interventions", "capturing": "interventions", "register": "interventions",
    "patching_sweep": "analyses.patching", "patching_heatmap": "report.patching_figures",
    "load_sae": "sae", "feature_loadings": "sae",
    "RunDir": "records",
}
__all__ = ["__version__", *PUBLIC]


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module 'rnr_interp' has no attribute {name!r}")
    value = getattr(import_module(f"rnr_interp.{PUBLIC[name]}"), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *PUBLIC})
