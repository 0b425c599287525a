"""A run's config as stored: its hashes (the run's id), what may differ between a run
and its resume, the package versions and environment a manifest records."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import tomllib
from pathlib import Path
from typing import Any, Iterable


from rnr_interp.records.schema import LEGACY_GRADING, RunFolderError, short_repr
from rnr_interp.records.files import json_default

# -- config -------------------------------------------------------------------------


def normalise(config: dict[str, Any]) -> dict[str, Any]:
    """The config as it reads back from JSON (tuples become lists, numpy scalars
    numbers), so a stored config and a fresh one compare equal."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    return json.loads(json.dumps(config, default=json_default))


#: config entries that say where something came from, not what it is (the data file's
#: path): kept in the manifest, left out of the resume check and of the comparison of
#: runs. What the data is, `task.questions_hash`, counts.
PROVENANCE_KEYS: tuple[str, ...] = ("task.source", "task.lm_eval.yaml", "task.lm_eval.data", "task.stored_file")
#: (`task.stored_file` is where an opened run's TASK_FILE is: set by `RunDir` when it
#: opens the folder, never read from a manifest.)
#: config entries left out of config_hash, and so of the records' run_id: the content
#: hash came after run ids were published, and a run's id stays the one it had.
UNHASHED_KEYS: tuple[str, ...] = ("task.questions_hash", "task.stored_file")


def _without(config: dict[str, Any], dotted_keys: Iterable[str]) -> dict[str, Any]:
    out = normalise(config)
    for dotted in dotted_keys:
        *parents, last = dotted.split(".")
        node: Any = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def comparable(config: dict[str, Any]) -> dict[str, Any]:
    """The config without its PROVENANCE_KEYS: what two runs must share to be the same
    run (or, for a subset of keys, comparable runs). A run config (one with a `kind`)
    that records no `grading` was graded flexibly (LEGACY_GRADING; experiments/runs/gsm8k40
    records none)."""
    out = _without(config, PROVENANCE_KEYS)
    if "kind" in out:
        out.setdefault("grading", LEGACY_GRADING)
    return out


def config_grading(config: dict[str, Any]) -> str:
    """The headline grading a run config records (LEGACY_GRADING when none, as in
    experiments/runs/gsm8k40)."""
    return config.get("grading") or LEGACY_GRADING


def stable_key(*parts: Any) -> int:
    """A stable 63-bit number for `parts` (seed first, then what it is for): the same
    on every machine and in every process, unlike Python's `hash`. Candidates' sampling
    seeds and the localisation split's order both come from it."""
    digest = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the config (sorted keys, no whitespace), without
    UNHASHED_KEYS. The run's id; resuming compares `comparable` configs instead."""
    canonical = json.dumps(_without(config, UNHASHED_KEYS), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def comparable_hash(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of `comparable(config)`: what a manifest's config
    must still hash to when it is read (the data file's path may change, nothing else)."""
    canonical = json.dumps(comparable(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def config_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}{key}"
            if key not in old or key not in new:
                keys.append(path)
            else:
                keys.extend(config_diff(old[key], new[key], path + "."))
        return keys
    return [] if old == new else [prefix.rstrip(".") or "<config>"]


def lookup(config: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted key path of a nested config, or "<missing>"."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "<missing>"
        node = node[part]
    return node


def _own_version() -> str | None:
    try:
        return importlib.metadata.version("rnr_interp")
    except importlib.metadata.PackageNotFoundError:
        pass
    # Not installed (run from a checkout): read the version from the pyproject beside us.
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
        return str(project["version"]) if project.get("name") == "rnr_interp" else None
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None


def package_versions() -> dict[str, str | None]:
    """Versions of what shapes the results. Read from package metadata rather than by
    importing: importing torch and transformer_lens costs seconds."""
    out: dict[str, str | None] = {"rnr_interp": _own_version(), "python": platform.python_version()}
    for dist in ("torch", "transformers", "transformer_lens", "numpy", "pandas", "pyarrow"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _code_commit() -> str | None:
    """The git commit of the checkout the package runs from (None when installed from a
    wheel, or when git is absent): `versions.rnr_interp` alone does not change per commit."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no", "--", "."],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+changes" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def run_environment() -> dict[str, Any]:
    """What changes a number without being part of the config: where the models run, how
    many threads the CPU kernels use, and the code's commit. Recorded in the manifest
    (a resumed run keeps the values it started with) and shown on the findings page."""
    torch = sys.modules.get("torch")  # only read when a model is already loaded: importing torch costs seconds
    return {"device": (os.environ.get("RNR_DEVICE") or "cpu").strip(),
            "torch_threads": torch.get_num_threads() if torch is not None else None,
            "code_commit": _code_commit()}


class ConfigMismatchError(RunFolderError):
    """A run folder exists with a different config; `keys` are the differing keys
    (dotted paths into nested dicts)."""

    def __init__(self, path: Path, keys: list[str], old: dict[str, Any], new: dict[str, Any]):
        diffs = "; ".join(f"{key}: {short_repr(lookup(old, key))} (stored) != {short_repr(lookup(new, key))} (given)"
                          for key in keys)
        super().__init__(
            f"{path} holds a run with a different config ({diffs}); existing results are never overwritten"
        )
        self.keys = keys
