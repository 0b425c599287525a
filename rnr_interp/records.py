"""Run folders: candidate records in Parquet parts, a manifest, resumable writes.

A run folder looks like::

    run/
      manifest.json        config given by the caller + created, versions, config_hash
      summary.json         written by the audit when it finishes
      records/part-00000.parquet, part-00001.parquet, ...
      artefacts/NAME.parquet, NAME.json   named extra tables and JSON (failure sets, ...)

Every candidate is one row (`RECORD_SCHEMA`). A part holds complete (question, probe)
groups, so the questions present in the parts are exactly the questions done, and a
resumed run skips them. Every file is written to a `*.tmp` in its final folder and then
moved into place with `os.replace`, which is atomic on POSIX: a kill leaves at most a
stray `*.tmp`, which readers never look at and the next writer's open removes.

One writer per run folder: `RunDir.create` takes an exclusive `flock` on `run/.lock`
(which names the holder: pid, host, start time, command) and keeps it while any `RunDir`
of this process for the folder is alive; a second process is refused with the holder's
name. The kernel drops the lock of a killed process, so a `.lock` left behind by one is
stale and the next writer takes it over. Readers take no lock and may open a run that is
still being written. Unreadable files (garbage JSON, a manifest without a config,
truncated or foreign Parquet parts) raise `RunFolderError`, one line naming the file.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import socket
import sys
import time
import tomllib
import warnings
import weakref
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

MANIFEST = "manifest.json"
#: work in progress not yet in a record part (`Journal`)
JOURNAL = "journal.jsonl"
SUMMARY = "summary.json"
RECORDS_DIR = "records"
ARTEFACTS_DIR = "artefacts"
LOCK = ".lock"

RECORD_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("task", pa.string(), nullable=False),
        pa.field("question_id", pa.string(), nullable=False),
        # a `ProbeLabel`: "deployed", "temperature", "ablate:mlp:3", "native:mcts", ...
        pa.field("probe", pa.string(), nullable=False),
        # index of the candidate within its probe for this question
        pa.field("candidate", pa.int64(), nullable=False),
        # JSON id of the intervention set or route; "" for none
        pa.field("intervention", pa.string(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        # None when no answer parses out of the text
        pa.field("extracted", pa.string(), nullable=True),
        pa.field("gold", pa.string(), nullable=False),
        # the grade the run's headline uses (its manifest's `grading`): one of the two below
        pa.field("correct", pa.bool_(), nullable=False),
        # sum of the generated tokens' log-probabilities
        pa.field("logprob", pa.float64(), nullable=False),
        pa.field("n_tokens", pa.int64(), nullable=False),
        # "stop" | "length"
        pa.field("finish", pa.string(), nullable=False),
        # both grades (docs/grading.md); parts written before they were recorded lack
        # them: `read_records` fills `correct_flexible` from `correct` (then the only
        # rule) and leaves `correct_strict` null (`grading.regrade` reads it from the text)
        pa.field("correct_strict", pa.bool_(), nullable=True),
        pa.field("correct_flexible", pa.bool_(), nullable=True),
    ]
)
RECORD_COLUMNS: tuple[str, ...] = tuple(RECORD_SCHEMA.names)
#: columns that parts written before them lack
LATER_COLUMNS: tuple[str, ...] = ("correct_strict", "correct_flexible")

#: the two gradings of a candidate (docs/grading.md)
GRADINGS: tuple[str, ...] = ("strict", "flexible")
#: the headline grading of a new run
DEFAULT_GRADING = "strict"
#: the headline grading of a run whose config records none: every run made before both
#: grades were recorded was graded by the flexible rule alone
LEGACY_GRADING = "flexible"
#: what identifies a row; read_records drops later duplicates of it
RECORD_KEY: tuple[str, ...] = ("question_id", "probe", "candidate", "intervention")


#: the `probe` value of the deployed candidate
DEPLOYED = "deployed"


@dataclass(frozen=True)
class ProbeLabel:
    """A value of the records' `probe` column: which probe produced a candidate. Built
    and parsed here only, so every module agrees on the formats:

    - ``deployed``: the deployed (greedy unless configured) candidate;
    - ``NAME``: K samples of a sampling probe (`sampling.Probe.name`, e.g. ``temperature``);
    - ``ablate:COMPONENT:LAYER``: the deployed decoding with one block silenced;
    - ``steer:rescue|induction:ALPHA``: the deployed decoding steered along v;
    - ``units:top:K`` / ``units:random:K:DRAW``: the deployed decoding with K MLP units
      silenced (the top K, or random draw DRAW of K);
    - ``SPACE:METHOD``: the routes a search evaluated, METHOD one of random,
      random_matched (random routes at the searches' distances), mcts, hill_climb,
      genetic (oracle reward) or mcts_blind, hill_climb_blind, genetic_blind (the
      answer-blind confidence reward);
    - ``rotated:SHIFT:LABEL``: probe LABEL (deployed, ablate, steer) asked with each
      question's options rotated by SHIFT positions (`tasks.rotate_options`), the
      letter-permutation control;
    - ``verify:LABEL``: self-verification of the answers of probe LABEL (a sampling or
      route probe): one row per distinct answer, `extracted` the answer, `logprob` the
      model's log P(yes) - log P(no) when asked whether it is correct, `correct` its
      grade, `text` "" and `n_tokens` 0 (nothing is generated). Stored so that the
      self-verification selector recomputes from the records alone.
    """

    kind: str  # "deployed" | "sample" | "ablate" | "steer" | "units" | "route" | "rotated" | "verify"
    parts: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.kind == "deployed":
            return DEPLOYED
        if self.kind in ("sample", "route"):
            return ":".join(self.parts)
        return ":".join((self.kind, *self.parts))

    @classmethod
    def deployed(cls) -> "ProbeLabel":
        return cls("deployed")

    @classmethod
    def sample(cls, name: str) -> "ProbeLabel":
        return cls("sample", (name,))

    @classmethod
    def ablate(cls, component: str, layer: int) -> "ProbeLabel":
        return cls("ablate", (component, str(layer)))

    @classmethod
    def steer(cls, direction: str, alpha: float) -> "ProbeLabel":
        return cls("steer", (direction, f"{alpha:g}"))

    @classmethod
    def units(cls, selection: str, k: int, draw: int | None = None) -> "ProbeLabel":
        return cls("units", (selection, str(k)) if draw is None else (selection, str(k), str(draw)))

    @classmethod
    def route(cls, space: str, method: str) -> "ProbeLabel":
        return cls("route", (space, method))

    @classmethod
    def rotated(cls, label: "ProbeLabel", shift: int) -> "ProbeLabel":
        return cls("rotated", (str(shift), *str(label).split(":")))

    @classmethod
    def verify(cls, label: "ProbeLabel") -> "ProbeLabel":
        return cls("verify", tuple(str(label).split(":")))

    @classmethod
    def parse(cls, text: str) -> "ProbeLabel":
        if text == DEPLOYED:
            return cls.deployed()
        head, *rest = text.split(":")
        if head == "verify" and rest and cls.parse(":".join(rest)).kind in ("sample", "route"):
            return cls("verify", tuple(rest))
        if head == "rotated" and len(rest) >= 2 and rest[0].lstrip("-").isdigit() \
                and cls.parse(":".join(rest[1:])).kind != "rotated":
            return cls("rotated", tuple(rest))
        if head in ("ablate", "steer", "units") and len(rest) == 2 or head == "units" and len(rest) == 3:
            return cls(head, tuple(rest))
        if len(rest) == 1:
            return cls("route", (head, rest[0]))
        if not rest:
            return cls.sample(head)
        raise ValueError(f"unrecognised probe label {text!r}")


class RunFolderError(ValueError):
    """A run folder, or one of its files, that cannot be used as one; the message is one
    line naming the path and the problem."""


class RunLockedError(RunFolderError):
    """Another live process holds the run folder's writer lock."""


def short_repr(value: Any, limit: int = 60) -> str:
    """repr clipped to `limit` characters, for one-line messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


# -- atomic files -----------------------------------------------------------------


def _fsync_dir(folder: Path) -> None:
    # The rename is only durable once the directory entry is; not all platforms allow it.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write through a temp file in the same folder (so os.replace cannot cross
    filesystems) and move it into place; on any error the temp file is removed."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays turn up in summaries computed with numpy/pandas.
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _to_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=_json_default)


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    """Serialise first (a failing encode never touches the file), then write atomically."""
    data = (_to_json(obj) + "\n").encode()
    return _atomic_write(Path(path), lambda f: f.write(data))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    data = text.encode()
    return _atomic_write(Path(path), lambda f: f.write(data))


def _write_parquet_atomic(path: Path, table: pa.Table) -> Path:
    return _atomic_write(path, lambda f: pq.write_table(table, f))


class Journal:
    """Work in progress that is not yet a record part: one JSON object per line, each
    append flushed to disk before it returns, so that a run killed in the middle of a
    long batch (a routing chunk: hours on a CPU) resumes without redoing what it had
    done. The kill can tear the last line only: `read` leaves that torn tail out, and
    the next `append` (by the writer, who holds the run's lock) cuts it first. The
    writer clears the journal once the part it was building is written.

    With a `run_id` (a run's journal always has one), every line appended carries it
    and `read` refuses a line that names another run, so a journal copied from another
    run is never replayed into this one. Lines without one were written before lines
    carried it: the reader decides whether they are the run's (`unowned`)."""

    def __init__(self, path: Path, run_id: str | None = None):
        self.path = Path(path)
        self.run_id = run_id

    def append(self, entries: Iterable[dict[str, Any]]) -> None:
        stamp = {"run_id": self.run_id} if self.run_id is not None else {}
        data = "".join(json.dumps({**e, **stamp}, default=_json_default) + "\n" for e in entries).encode()
        if not data:
            return
        self._cut_torn_tail()
        with open(self.path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def _cut_torn_tail(self) -> None:
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return
        with open(self.path, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.seek(0)
                raw = f.read()
                f.truncate(raw.rfind(b"\n") + 1)

    def error(self, line: int, problem: str) -> RunFolderError:
        """The one-line refusal of a journal line (lines count from 1)."""
        return RunFolderError(f"{self.path}, line {line}: {problem}; move the file away to redo its work")

    def read(self) -> list[dict[str, Any]]:
        """The complete lines, each a JSON object (line n is entry n-1); a line that is
        not one, or names another run, raises RunFolderError naming file and line."""
        if not self.path.is_file():
            return []
        raw = self.path.read_bytes()
        entries = []
        for n, line in enumerate(raw[:raw.rfind(b"\n") + 1].splitlines(), 1):
            try:
                entry = parse_json(line)
            except (ValueError, UnicodeDecodeError) as err:
                raise self.error(n, f"not JSON ({_first_line(err)})") from None
            if not isinstance(entry, dict):
                raise self.error(n, f"not a journal entry (a JSON {type(entry).__name__}, not an object)")
            owner = entry.get("run_id")
            if self.run_id is not None and owner is not None and owner != self.run_id:
                raise self.error(n, f"written by another run (run_id {short_repr(owner, 20)}, this run's is {self.run_id[:12]}...)")
            entries.append(entry)
        return entries

    @staticmethod
    def unowned(entry: dict[str, Any]) -> bool:
        """Whether a line read back names no run (written before lines carried one)."""
        return "run_id" not in entry

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
        _fsync_dir(self.path.parent)


def _remove_temp_files(*folders: Path) -> None:
    for folder in folders:
        if folder.is_dir():
            for tmp in folder.glob("*.tmp"):
                tmp.unlink(missing_ok=True)


# -- config -------------------------------------------------------------------------


def _normalise(config: dict[str, Any]) -> dict[str, Any]:
    """The config as it reads back from JSON (tuples become lists, numpy scalars
    numbers), so a stored config and a fresh one compare equal."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    return json.loads(json.dumps(config, default=_json_default))


#: config entries that say where something came from, not what it is (the data file's
#: path): kept in the manifest, left out of the resume check and of the comparison of
#: runs. What the data is, `task.questions_hash`, counts.
PROVENANCE_KEYS: tuple[str, ...] = ("task.source", "task.lm_eval.yaml", "task.lm_eval.data")
#: config entries left out of config_hash, and so of the records' run_id: the content
#: hash came after run ids were published, and a run's id stays the one it had.
UNHASHED_KEYS: tuple[str, ...] = ("task.questions_hash",)


def _without(config: dict[str, Any], dotted_keys: Iterable[str]) -> dict[str, Any]:
    out = _normalise(config)
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
    that records no `grading` was graded flexibly (LEGACY_GRADING)."""
    out = _without(config, PROVENANCE_KEYS)
    if "kind" in out:
        out.setdefault("grading", LEGACY_GRADING)
    return out


def config_grading(config: dict[str, Any]) -> str:
    """The headline grading a run config records (LEGACY_GRADING when none)."""
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


def _hashes_of(config: dict[str, Any]) -> tuple[str, ...]:
    """The config hashes a manifest holding `config` may carry: `config_hash`, and the
    hash with UNHASHED_KEYS in (how manifests of a few days in November 2026 were
    hashed), so those folders still open."""
    whole = json.dumps(_normalise(config), sort_keys=True, separators=(",", ":"))
    return config_hash(config), hashlib.sha256(whole.encode()).hexdigest()


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
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
        return str(project["version"]) if project.get("name") == "rnr_interp" else None
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None


def _versions() -> dict[str, str | None]:
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


def _environment() -> dict[str, Any]:
    """What changes a number without being part of the config: where the models run, how
    many threads the CPU kernels use, and the code's commit. Recorded in the manifest
    (a resumed run keeps the values it started with) and shown on the findings page."""
    torch = sys.modules.get("torch")  # only read when a model is already loaded: importing torch costs seconds
    return {"device": (os.environ.get("RNR_DEVICE") or "cpu").strip(),
            "torch_threads": torch.get_num_threads() if torch is not None else None,
            "code_commit": _code_commit()}


# -- reading run files -------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


#: the deepest nesting of arrays and objects a JSON file we read may have (run configs
#: nest 4 deep, data rows 3): deeper is not data of ours, and Python's parser would
#: fail on it with a RecursionError instead of a message
MAX_JSON_DEPTH = 100


class JSONTooDeepError(ValueError):
    """JSON nested deeper than MAX_JSON_DEPTH."""


def parse_json(text: str | bytes) -> Any:
    """json.loads, refusing nesting deeper than MAX_JSON_DEPTH with JSONTooDeepError
    (json.JSONDecodeError for what is not JSON), whatever the depth."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONTooDeepError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    # Measured without recursion, so a value Python could parse but not walk is refused too.
    level: list[Any] = [value]
    for _ in range(MAX_JSON_DEPTH + 1):
        level = [child for node in level if isinstance(node, (dict, list))
                 for child in (node.values() if isinstance(node, dict) else node)]
        if not level:
            return value
    raise JSONTooDeepError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")


def read_json_file(path: Path) -> Any:
    """A JSON file's content, or RunFolderError naming the file and what is wrong."""
    try:
        return parse_json(path.read_bytes().decode("utf-8"))
    except JSONTooDeepError as exc:
        raise RunFolderError(f"{path}: {exc}") from None
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing") from None
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot be read ({exc.strerror or _first_line(exc)})") from None
    except UnicodeDecodeError as exc:
        raise RunFolderError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise RunFolderError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


def _read_parquet(path: Path, schema: pa.Schema | None = None, **kw: Any) -> pa.Table:
    """A Parquet file as a table. With `schema`, the file must hold every one of its
    columns with its type (extra columns are ignored). Damaged or foreign files raise
    RunFolderError naming the file."""
    try:
        found = pq.read_schema(path)
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing") from None
    except (pa.ArrowException, OSError) as exc:
        raise RunFolderError(f"{path}: not a readable Parquet file ({_first_line(exc)})") from None
    if schema is not None:
        for field in schema:
            i = found.get_field_index(field.name)
            if i < 0 and schema is RECORD_SCHEMA and field.name in LATER_COLUMNS:
                continue
            if i < 0:
                raise RunFolderError(f"{path}: not a records part of this format (no column {field.name!r})")
            if not found.field(i).type.equals(field.type):
                raise RunFolderError(
                    f"{path}: not a records part of this format (column {field.name!r} is {found.field(i).type}, "
                    f"expected {field.type})"
                )
    if schema is RECORD_SCHEMA:
        schema = pa.schema([f for f in schema if f.name not in LATER_COLUMNS or found.get_field_index(f.name) >= 0])
        if kw.get("columns") is not None:
            kw["columns"] = [c for c in kw["columns"] if c in schema.names]
    try:
        return pq.read_table(path, schema=schema, **kw)
    except (pa.ArrowException, OSError) as exc:
        raise RunFolderError(f"{path}: damaged Parquet file ({_first_line(exc)})") from None


# -- the writer lock ----------------------------------------------------------------


_NO_DETAILS = "a process that left no details"


def _holder_text(raw: bytes) -> str:
    try:
        h = json.loads(raw.decode())
        return f"pid {h['pid']} on {h['host']} since {h['started']} ({h['command']})"
    except (ValueError, KeyError, TypeError):
        return _NO_DETAILS


def _read_holder(fd: int) -> str:
    """Who holds the lock on `fd`. A holder writes its details just after taking the
    flock, so a racing reader can find the file still empty: it looks again for up to a
    second before saying the holder left none."""
    for _ in range(20):
        raw = os.pread(fd, 4096, 0)
        if raw.strip():
            text = _holder_text(raw)
            if text != _NO_DETAILS:
                return text
        time.sleep(0.05)
    return _holder_text(os.pread(fd, 4096, 0))


class _WriterLock:
    """An exclusive flock on `folder/.lock`, shared by every RunDir of this process for
    the folder (see `_writer_lock`) and released, its file removed, when the last of them
    is gone. A lock file whose flock nobody holds was left by a killed process: it is
    taken over (`stale_holder` keeps what it said)."""

    def __init__(self, folder: Path):
        self.path = folder / LOCK
        self.stale_holder: str | None = None
        for _ in range(10):  # retried only when the file is swapped under us
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd)
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunLockedError(
                        f"{folder} is being written by {holder}; wait for it to finish or use another folder"
                    ) from None
                raise RunFolderError(f"{self.path}: cannot be locked ({exc.strerror})") from None
            # A releasing holder unlinks the file before unlocking it: if ours is no longer
            # the file at the path, we locked a dead inode and must start again.
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            mine = os.fstat(fd)
            if current is None or (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
                os.close(fd)
                continue
            previous = os.pread(fd, 4096, 0)
            if previous.strip():
                self.stale_holder = _holder_text(previous)
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:200] if sys.argv else "python",
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
            self._finalizer = weakref.finalize(self, _release_lock, fd, self.path)
            return
        raise RunFolderError(f"{self.path}: kept changing while being locked")

    def release(self) -> None:
        self._finalizer()


def _release_lock(fd: int, path: Path) -> None:
    try:
        if os.path.exists(path) and os.path.samestat(os.stat(path), os.fstat(fd)):
            os.unlink(path)
    except OSError:
        pass
    os.close(fd)  # closing drops the flock


_HELD_LOCKS: "weakref.WeakValueDictionary[str, _WriterLock]" = weakref.WeakValueDictionary()


def _writer_lock(folder: Path) -> _WriterLock:
    """This process's lock on `folder`, taken if not yet held."""
    key = str(folder.resolve())
    lock = _HELD_LOCKS.get(key)
    if lock is None:
        lock = _WriterLock(folder)
        _HELD_LOCKS[key] = lock
    return lock


#: files a run folder's writer makes (a foreign one of these names would be overwritten)
WRITTEN: tuple[str, ...] = (MANIFEST, SUMMARY, JOURNAL, RECORDS_DIR, ARTEFACTS_DIR)
#: how deep `check_out_folder` looks for this tool's folders inside an output folder
_OUT_DEPTH = 6


def check_out_folder(path: str | os.PathLike[str], option: str = "--out", marks: tuple[str, ...] | None = None) -> None:
    """Refuse, with one line naming the problem, a folder that cannot be a run folder:
    an existing file, a path under a file, a folder that cannot be created or written.
    Creates nothing, so commands call it before they start.

    With `marks` (the files that mark a folder as this tool's output: a run folder's
    manifest, a sweep's index, ...), an existing folder must also be this tool's: one
    holding a mark, or holding nothing but such folders and what a killed writer leaves
    (its lock, temp files, empty folders). Anything else is a user's folder, refused
    naming a file in it (first one the run would overwrite), so nothing of theirs is
    overwritten or mixed into a run."""
    root = Path(path)
    if str(path) == "":
        raise RunFolderError(f"{option} must name a folder, got the empty string")
    if root.exists() and not root.is_dir():
        raise RunFolderError(f"{option} {root} is a file, not a folder")
    existing = root
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise RunFolderError(f"{option} {root} is under a file ({existing})")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunFolderError(f"{option} {root}: {existing} is not writable")
    if marks is not None and root.is_dir() and (foreign := _not_ours(root, marks, _OUT_DEPTH)) is not None:
        held = foreign.relative_to(root)
        overwritten = f" ({held} would be overwritten)" if foreign.parent == root and foreign.name in WRITTEN else ""
        raise RunFolderError(
            f"{option} {root} holds {held} but no {' or '.join(marks)}: not a folder of this tool{overwritten}; "
            "use a new or empty folder, or a run folder of this tool to resume it")


def _not_ours(folder: Path, marks: tuple[str, ...], depth: int) -> Path | None:
    """The first entry of `folder` that makes it not this tool's (None: it is); names
    a run would write come first, so the message names what would be overwritten."""
    if any((folder / mark).is_file() for mark in marks):
        return None
    try:
        entries = sorted(folder.iterdir(), key=lambda p: (p.name not in WRITTEN, p.name))
    except OSError:
        return folder
    for entry in entries:
        if entry.name == LOCK or entry.name.endswith(".tmp"):
            continue  # what a killed writer leaves
        if entry.is_dir() and not entry.is_symlink() and depth > 0:
            found = _not_ours(entry, marks, depth - 1)
            if found is None:
                continue
            return found
        return entry
    return None


def _make_folder(root: Path) -> list[Path]:
    """mkdir -p, returning the folders it created (deepest last) so a failed start can
    remove them again; OS errors become one-line RunFolderErrors."""
    check_out_folder(root, "run folder")
    created = []
    for folder in [*reversed(root.parents), root]:
        if not folder.exists():
            try:
                folder.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                _remove_empty(created)
                raise RunFolderError(f"run folder {root}: cannot create {folder} ({exc.strerror})") from None
            created.append(folder)
    return created


def _remove_empty(folders: list[Path]) -> None:
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            pass


# -- run folders ----------------------------------------------------------------------

_PART_RE = re.compile(r"^part-(\d+)\.parquet$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class RunDir:
    """An existing run folder. `RunDir(path)` opens it for reading (it never deletes
    anything); `RunDir.create(path, config)` starts or resumes one for writing."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not (self.path / MANIFEST).is_file():
            raise FileNotFoundError(f"{self.path} is not a run folder (no {MANIFEST})")
        self._manifest: dict[str, Any] = self._read_manifest()
        # (question_id, probe) groups stored in parts; loaded on first use
        self._stored: set[tuple[str, str]] | None = None
        # the writer lock, for a RunDir from `create`
        self._lock: _WriterLock | None = None

    def _read_manifest(self) -> dict[str, Any]:
        path = self.path / MANIFEST
        manifest = read_json_file(path)
        if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict) \
                or not isinstance(manifest.get("config_hash"), str):
            raise RunFolderError(f"{path}: not a run manifest (needs a 'config' object and a 'config_hash')")
        # A config edited after the run started (a K, a probe, a seed, the questions)
        # describes records made under another one. Where the data file lives may be
        # edited (PROVENANCE_KEYS): manifests that carry `comparable_hash` allow that.
        key, allowed = ("comparable_hash", (comparable_hash(manifest["config"]),)) if "comparable_hash" in manifest \
            else ("config_hash", _hashes_of(manifest["config"]))
        if manifest[key] not in allowed:
            raise RunFolderError(f"{path}: its config does not match its {key} (edited after the run started?); "
                                 "the records were made under another config, so the folder is refused")
        return manifest

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @classmethod
    def create(cls, path: str | os.PathLike[str], config: dict[str, Any], resume: bool = True) -> "RunDir":
        """Start a run in `path`, or resume the one there.

        Same config (up to PROVENANCE_KEYS) and resume=True: resume, after removing stray temp
        files a killed writer left. Same config and resume=False: FileExistsError.
        Different config: ConfigMismatchError naming the differing keys. Another process
        writing the folder: RunLockedError naming it. Nothing already written is ever
        deleted or overwritten, and a refused start leaves no folder behind that it made.

        The data file's path does not count: the same questions read from another path
        resume the run (under its first id). The returned RunDir holds the writer lock
        until it is released or dropped.
        """
        root = Path(path)
        config = _normalise(config)
        if "grading" in config and config["grading"] is None:
            # Unspecified: the folder's own grading when resuming it, else the default.
            stored = cls(root).config if (root / MANIFEST).is_file() else None
            config["grading"] = config_grading(stored) if stored is not None else DEFAULT_GRADING
        if config.get("grading", DEFAULT_GRADING) not in GRADINGS:
            raise ValueError(f"grading must be one of {', '.join(GRADINGS)}, got {config['grading']!r}")
        digest = config_hash(config)
        created = _make_folder(root)
        try:
            lock = _writer_lock(root)
            if (root / MANIFEST).is_file():
                run = cls(root)
                differ = config_diff(comparable(run.config), comparable(config))
                if differ:
                    raise ConfigMismatchError(root, differ, comparable(run.config), config)
                if not resume:
                    raise FileExistsError(f"{root} already holds this run; pass resume=True to continue it")
                run.stored_groups()  # every part must be the run's own before anything is added
                run._lock = lock
                _remove_temp_files(root, run.records_dir, run.artefacts_dir)
                return run
            records = root / RECORDS_DIR
            if records.is_dir() and any(_PART_RE.match(p.name) for p in records.iterdir()):
                raise FileExistsError(f"{root} holds records but no {MANIFEST}; refusing to mix runs")
            records.mkdir(exist_ok=True)
            created.append(records)
            _remove_temp_files(root, records)
            manifest = {
                "config": config,
                "config_hash": digest,
                "comparable_hash": comparable_hash(config),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "versions": _versions(),
                "environment": _environment(),
                "record_columns": list(RECORD_COLUMNS),
            }
            # The manifest goes last: its presence is what marks the folder as a run.
            write_json_atomic(root / MANIFEST, manifest)
        except BaseException:
            # Drop our reference, not the lock: another RunDir of this process may hold
            # it; the lock goes when the last one does.
            # The lock of a folder made just now has no other holder: dropping it here
            # removes its file, so the folders made can go too.
            lock = None
            _remove_empty(created)
            raise
        run = cls(root)
        run._lock = lock
        return run

    def release(self) -> None:
        """Give up this process's writer lock on the folder now, for every RunDir of it
        (the lock also goes with the last such RunDir, and with the process)."""
        if self._lock is not None:
            lock, self._lock = self._lock, None
            lock.release()

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # -- metadata --------------------------------------------------------------------
    @property
    def manifest(self) -> dict[str, Any]:
        return self._manifest

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest["config"]

    @property
    def config_hash(self) -> str:
        return self.manifest["config_hash"]

    @property
    def grading(self) -> str:
        """The grading the run's headline and its records' `correct` use."""
        return config_grading(self.config)

    @property
    def run_id(self) -> str:
        """The records' `run_id`: the config hash, so a resumed run keeps its id."""
        return self.config_hash

    @property
    def records_dir(self) -> Path:
        return self.path / RECORDS_DIR

    @property
    def artefacts_dir(self) -> Path:
        return self.path / ARTEFACTS_DIR

    @property
    def journal(self) -> Journal:
        """The run's work in progress (`Journal`); empty between batches."""
        return Journal(self.path / JOURNAL, self.run_id)

    # -- records ---------------------------------------------------------------------
    def parts(self) -> list[Path]:
        """Record part files in write order (by part number, not by name)."""
        if not self.records_dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.records_dir.iterdir() if (m := _PART_RE.match(p.name))]
        return [p for _, p in sorted(found)]

    def _next_part_path(self) -> Path:
        # One past the highest number, so a part never replaces another (gaps are fine).
        numbers = [int(m.group(1)) for p in self.parts() if (m := _PART_RE.match(p.name))]
        return self.records_dir / f"part-{max(numbers, default=-1) + 1:05d}.parquet"

    def _read_part(self, part: Path, **kw: Any) -> pa.Table:
        """A records part of this run: every row's run_id must be the run's, filtered
        out or not (rows copied from another run, or a part made under a config since
        edited, are refused naming the part). `kw` goes to pyarrow (columns, filters)."""
        ids = _read_parquet(part, RECORD_SCHEMA, columns=["run_id"])["run_id"]
        foreign = set(ids.unique().to_pylist()) - {self.run_id, *self._legacy_run_ids()}
        if foreign:
            raise RunFolderError(
                f"{part}: rows of another run (run_id {short_repr(sorted(foreign)[0], 20)}, this run's is "
                f"{self.run_id[:12]}...); move the file out of {self.path} to use the folder")
        return _read_parquet(part, RECORD_SCHEMA, **kw)

    def _legacy_run_ids(self) -> tuple[str, ...]:
        """run_id values this run's own parts held before every writer stamped the run's
        id: a checkpoint comparison's budget controls were written as "budget_control"."""
        return ("budget_control",) if self.config.get("kind") == "compare" else ()

    def stored_groups(self) -> set[tuple[str, str]]:
        """The (question_id, probe) groups already written (cached after the first read)."""
        if self._stored is None:
            self._stored = set()
            for part in self.parts():
                t = self._read_part(part, columns=["question_id", "probe"])
                self._stored.update(zip(t["question_id"].to_pylist(), t["probe"].to_pylist()))
        return self._stored

    def write_question_batch(self, rows: list[dict[str, Any]]) -> Path | None:
        """Write the rows as one new part, atomically; returns its path (None for no rows).

        The rows must hold every row of each (question, probe) group they touch: a group
        already stored raises ValueError (a resumed run must skip `done_question_ids()`),
        as do missing or unknown columns, values that do not fit RECORD_SCHEMA, and a
        key (question_id, probe, candidate, intervention) repeated in the batch. Every
        row is written with this run's `run_id`, whatever it held: that is what marks
        a part as the run's own when it is read back.
        """
        if not rows:
            return None
        expected = set(RECORD_COLUMNS)
        for i, row in enumerate(rows):
            if row.keys() != expected:
                missing, extra = sorted(expected - row.keys()), sorted(row.keys() - expected)
                raise ValueError(
                    f"row {i} (question {row.get('question_id')!r}): missing columns {missing}, "
                    f"unknown columns {extra}"
                )
        rows = [{**row, "run_id": self.run_id} for row in rows]
        try:
            table = pa.Table.from_pylist(list(rows), schema=RECORD_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise ValueError(f"rows do not fit RECORD_SCHEMA: {err}") from err
        # Arrow does not enforce nullable=False on conversion.
        nulls = [f.name for f in RECORD_SCHEMA if not f.nullable and table[f.name].null_count]
        if nulls:
            raise ValueError(f"None in non-nullable columns {nulls}")
        repeated = [key for key, n in Counter(tuple(r[c] for c in RECORD_KEY) for r in rows).items() if n > 1]
        if repeated:
            raise ValueError(f"batch repeats record keys {RECORD_KEY}: {repeated[:3]}")
        groups = {(r["question_id"], r["probe"]) for r in rows}
        already = groups & self.stored_groups()
        if already:
            raise ValueError(
                f"(question, probe) groups already stored: {sorted(already)[:5]}; "
                "a part must hold complete groups, so skip done_question_ids() when resuming"
            )
        self.records_dir.mkdir(parents=True, exist_ok=True)
        path = _write_parquet_atomic(self._next_part_path(), table)
        self.stored_groups().update(groups)
        return path

    def done_question_ids(self, probe_set: Iterable[str] | None = None) -> set[str]:
        """Questions already stored (with every probe in `probe_set`, when given)."""
        groups = self.stored_groups()
        if probe_set is None:
            return {q for q, _ in groups}
        need = {probe_set} if isinstance(probe_set, str) else set(probe_set)
        have: dict[str, set[str]] = {}
        for q, probe in groups:
            have.setdefault(q, set()).add(probe)
        return {q for q, probes in have.items() if need <= probes}

    def read_records(self, filters: Any = None) -> pd.DataFrame:
        """All records as one DataFrame, sorted stably by RECORD_KEY.

        `filters` is passed to pyarrow (DNF list, e.g. [("probe", "in", ["deployed",
        "temperature"])], or an expression). Rows repeating a key are dropped keeping
        the first (earliest part) with a warning; they should not occur, but a crash
        during `compact` can leave them.
        """
        tables = [_with_later_columns(self._read_part(p, filters=filters)) for p in self.parts()]
        table = pa.concat_tables(tables) if tables else RECORD_SCHEMA.empty_table()
        df = table.to_pandas()
        dup = df.duplicated(list(RECORD_KEY))
        if dup.any():
            warnings.warn(f"{self.path}: dropping {int(dup.sum())} duplicate record rows", stacklevel=2)
            df = df[~dup]
        return df.sort_values(list(RECORD_KEY), kind="stable").reset_index(drop=True)

    def compact(self) -> Path | None:
        """Merge all parts into one, atomically: the merged part is in place before the
        old ones are removed, so a crash in between only leaves duplicates that
        read_records drops."""
        old = self.parts()
        if len(old) <= 1:
            return old[0] if old else None
        table = pa.Table.from_pandas(self.read_records(), schema=RECORD_SCHEMA, preserve_index=False)
        merged = _write_parquet_atomic(self._next_part_path(), table)
        for part in old:
            part.unlink()
        _fsync_dir(self.records_dir)
        return merged

    def snapshot(self, out: str | os.PathLike[str]) -> "RunDir":
        """A new run folder `out` with this run's config and the records it holds now, in
        one part: a frozen copy of a run in progress, to summarise while the run goes on.
        This folder is only read (its journal, work in progress, is not copied); `out`
        must not be a run folder already."""
        target = Path(out)
        if (target / MANIFEST).exists() or target.resolve() == self.path.resolve():
            raise FileExistsError(f"{target} is already a run folder; choose another --out for the snapshot")
        records = self.read_records()
        snap = RunDir.create(target, self.config, resume=False)
        if len(records):
            _write_parquet_atomic(snap._next_part_path(), pa.Table.from_pandas(records, schema=RECORD_SCHEMA, preserve_index=False))
        snap._stored = None
        return snap

    # -- summary and named artefacts ------------------------------------------------
    def write_summary(self, summary: dict[str, Any]) -> Path:
        """summary.json, with the data rows the task skipped as invalid (from the
        config), so every analysis's summary says what it left out."""
        skipped = (self.config.get("task") or {}).get("skipped_rows")
        return write_json_atomic(self.path / SUMMARY, {**summary, "skipped_rows": skipped} if skipped else summary)

    def read_summary(self) -> dict[str, Any]:
        path = self.path / SUMMARY
        if not path.is_file():
            raise FileNotFoundError(f"{self.path} has no {SUMMARY} yet (run not finished?)")
        summary = read_json_file(path)
        if not isinstance(summary, dict) or not summary:
            raise RunFolderError(f"{path}: not a run summary (expected a non-empty JSON object)")
        return summary

    def _artefact(self, name: str, suffix: str) -> Path:
        if not _NAME_RE.match(name) or name.endswith(".tmp"):
            raise ValueError(f"artefact name {name!r} must match {_NAME_RE.pattern} (no folders)")
        return self.artefacts_dir / f"{name}{suffix}"

    def _existing_artefact(self, name: str, suffix: str) -> Path:
        path = self._artefact(name, suffix)
        if not path.is_file():
            have = sorted(p.stem for p in self.artefacts_dir.glob(f"*{suffix}")) if self.artefacts_dir.is_dir() else []
            raise FileNotFoundError(f"{self.path}: no {suffix} artefact {name!r}; have {have}")
        return path

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        """Store a named DataFrame (a non-default index is kept and restored)."""
        path = self._artefact(name, ".parquet")
        self.artefacts_dir.mkdir(exist_ok=True)
        return _write_parquet_atomic(path, pa.Table.from_pandas(df))

    def read_table(self, name: str) -> pd.DataFrame:
        return _read_parquet(self._existing_artefact(name, ".parquet")).to_pandas()

    def write_json(self, name: str, obj: Any) -> Path:
        path = self._artefact(name, ".json")
        self.artefacts_dir.mkdir(exist_ok=True)
        return write_json_atomic(path, obj)

    def read_json(self, name: str) -> Any:
        return read_json_file(self._existing_artefact(name, ".json"))


def _with_later_columns(table: pa.Table) -> pa.Table:
    """A part's table in RECORD_SCHEMA: a part written before LATER_COLUMNS gets
    `correct_flexible` = its `correct` (the only rule then) and a null `correct_strict`."""
    if "correct_flexible" not in table.column_names:
        table = table.append_column(RECORD_SCHEMA.field("correct_flexible"), table["correct"])
    if "correct_strict" not in table.column_names:
        table = table.append_column(RECORD_SCHEMA.field("correct_strict"), pa.nulls(len(table), pa.bool_()))
    return table.select(list(RECORD_COLUMNS))


def load_runs(path: str | os.PathLike[str]) -> list[RunDir]:
    """The runs under `path` (a sweep folder, searched recursively, sorted by path), or
    `[RunDir(path)]` when `path` is itself a run."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    if (root / MANIFEST).is_file():
        return [RunDir(root)]
    runs: list[RunDir] = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        runs.extend(load_runs(sub))
    return runs
