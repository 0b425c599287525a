"""Run folders (`RunDir`): create or resume, write record parts and tables, read them
back checked to belong to the run; `load_runs`. (`--out` checks: `outdir.py`.)"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Iterable

import pandas as pd
import pyarrow as pa

from rnr_interp.records.schema import (
    ARTEFACTS_DIR, DEFAULT_GRADING, GRADINGS, JOURNAL, MANIFEST, RECORDS_DIR, RECORD_KEY,
    RECORD_SCHEMA, RECORDS_VERSION, RECORDS_VERSION_KEY, RunFolderError, SUMMARY, TASK_FILE, TOKEN_COLUMNS, record_schema,
    short_repr,
)
from rnr_interp.records.files import (
    fsync_dir, parquet_bytes, read_json_file, read_parquet, remove_temp_files, write_bytes_atomic, write_json_atomic,
    write_parquet_atomic,
)
from rnr_interp.records.journal import Journal
from rnr_interp.records.config import (
    ConfigMismatchError, comparable, comparable_hash, config_diff, config_grading, config_hash, run_environment,
    normalise, package_versions,
)
from rnr_interp.records.lock import WriterLock, writer_lock
from rnr_interp.records.outdir import make_folder, remove_empty
from rnr_interp.records.summaries import COMPARE, Summary, SummaryError, parse_summary, summary_type

# -- run folders ----------------------------------------------------------------------

_PART_RE = re.compile(r"^part-(\d+)\.parquet$")
#: the manifest's entry holding each records part's sha256 (part file name -> hex)
PARTS_SHA256 = "parts_sha256"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class RunDir:
    """An existing run folder. `RunDir(path)` opens it for reading (it never deletes
    anything); `RunDir.create(path, config)` starts or resumes one for writing."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not (self.path / MANIFEST).is_file():
            raise FileNotFoundError(f"{self.path} is not a run folder (no {MANIFEST})")
        self._manifest: dict[str, Any] = self._read_manifest()
        self._attach_stored_task()
        # (question_id, probe) groups stored in parts; loaded on first use
        self._stored: set[tuple[str, str]] | None = None
        # the writer lock, for a RunDir from `create`
        self._lock: WriterLock | None = None
        # parts whose checksum was verified: path -> (size, mtime_ns) then
        self._verified: dict[Path, tuple[int, int]] = {}

    def _read_manifest(self) -> dict[str, Any]:
        path = self.path / MANIFEST
        manifest = read_json_file(path)
        if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict) \
                or not isinstance(manifest.get("config_hash"), str):
            raise RunFolderError(f"{path}: not a run manifest (needs a 'config' object and a 'config_hash')")
        version = manifest.get(RECORDS_VERSION_KEY, 0)  # none recorded: 0 (every run under experiments/runs)
        if not isinstance(version, int) or isinstance(version, bool) or version > RECORDS_VERSION:
            raise RunFolderError(f"{path}: records version {short_repr(version, 20)}; this rnr_interp reads versions up "
                                 f"to {RECORDS_VERSION} (upgrade it to read this run)")
        # A config edited after the run started (a K, a probe, a seed, the questions)
        # describes records made under another one. Where the data file lives may be
        # edited (PROVENANCE_KEYS): manifests that carry `comparable_hash` allow that.
        # Manifests without it are checked against `config_hash` (experiments/runs/gsm8k40 has none).
        key, hashed = ("comparable_hash", comparable_hash) if "comparable_hash" in manifest else ("config_hash", config_hash)
        if manifest[key] != hashed(manifest["config"]):
            raise RunFolderError(f"{path}: its config does not match its {key} (edited after the run started, or "
                                 "hashed by an earlier rnr_interp 0.1 with task.questions_hash in: rerun it); "
                                 "the records were made under another config, so the folder is refused")
        return manifest

    def _attach_stored_task(self) -> None:
        """`config["task"]["stored_file"]`: this folder's TASK_FILE when it has one whose
        checksum the manifest holds (a file edited since is refused naming it); a path
        the manifest itself names is dropped, never followed."""
        task = self.config.get("task")
        if not isinstance(task, dict):
            return
        task.pop("stored_file", None)
        path = self.path / TASK_FILE
        if not path.is_file():
            return
        expected = self.manifest.get("task_sha256")
        if file_sha256(path) != expected:
            raise RunFolderError(f"{path}: its content does not match the checksum in {MANIFEST} "
                                 f"({'none stored' if expected is None else 'edited after the run started?'}); "
                                 "the run's questions cannot be trusted, so the folder is refused")
        task["stored_file"] = str(path)

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
        config, stored_task = _split_stored_task(config)
        config = normalise(config)
        if "grading" in config and config["grading"] is None:
            # Unspecified: the folder's own grading when resuming it, else the default.
            stored = cls(root).config if (root / MANIFEST).is_file() else None
            config["grading"] = config_grading(stored) if stored is not None else DEFAULT_GRADING
        if config.get("grading", DEFAULT_GRADING) not in GRADINGS:
            raise ValueError(f"grading must be one of {', '.join(GRADINGS)}, got {config['grading']!r}")
        digest = config_hash(config)
        created = make_folder(root)
        try:
            lock = writer_lock(root)
            if (root / MANIFEST).is_file():
                run = cls(root)
                differ = config_diff(comparable(run.config), comparable(config))
                if differ:
                    raise ConfigMismatchError(root, differ, comparable(run.config), config)
                if not resume:
                    raise FileExistsError(f"{root} already holds this run; pass resume=True to continue it")
                run.stored_groups()  # every part must be the run's own before anything is added
                run._lock = lock
                if PARTS_SHA256 not in run.manifest:
                    # a run from before parts had checksums (every run under experiments/runs):
                    # its parts (checked above) get them
                    run._update_manifest({PARTS_SHA256: {p.name: file_sha256(p) for p in run.parts()}})
                if stored_task is not None and not (root / TASK_FILE).is_file():
                    raise RunFolderError(f"{root} holds no {TASK_FILE}: written before runs stored their questions "
                                         "(an earlier rnr_interp 0.1); rerun it into a new folder")
                remove_temp_files(root, run.records_dir, run.artefacts_dir)
                return run
            records = root / RECORDS_DIR
            if records.is_dir() and any(_PART_RE.match(p.name) for p in records.iterdir()):
                raise FileExistsError(f"{root} holds records but no {MANIFEST}; refusing to mix runs")
            records.mkdir(exist_ok=True)
            created.append(records)
            remove_temp_files(root, records)
            manifest = {
                "config": config,
                "config_hash": digest,
                "comparable_hash": comparable_hash(config),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "versions": package_versions(),
                "environment": run_environment(),
                RECORDS_VERSION_KEY: RECORDS_VERSION,
                "record_columns": record_schema(bool(config.get("save_logprobs"))).names,
                PARTS_SHA256: {},
            }
            if stored_task is not None:
                manifest["task_sha256"] = file_sha256(write_json_atomic(root / TASK_FILE, stored_task))
            # The manifest goes last: its presence is what marks the folder as a run.
            write_json_atomic(root / MANIFEST, manifest)
        except BaseException:
            # Drop our reference, not the lock: another RunDir of this process may hold
            # it; the lock goes when the last one does.
            # The lock of a folder made just now has no other holder: dropping it here
            # removes its file, so the folders made can go too.
            lock = None
            remove_empty(created)
            raise
        run = cls(root)
        run._lock = lock
        return run

    def _update_manifest(self, entries: dict[str, Any]) -> None:
        """Rewrite the manifest (atomically; the writer's) with `entries` added."""
        self._manifest.update(entries)
        write_json_atomic(self._writable(self.path / MANIFEST), _without_stored_file(self._manifest))

    def _writable(self, path: Path) -> Path:
        """`path`, when its folder resolves inside this run folder: a `records/` or
        `artefacts/` that is a link out of the run is refused, never written through."""
        folder, root = path.parent.resolve(), self.path.resolve()
        if folder != root and not folder.is_relative_to(root):
            raise RunFolderError(f"{path.parent} resolves to {folder}, outside the run folder {self.path}; "
                                 "nothing is written there")
        return path

    def _write_part(self, path: Path, table: pa.Table) -> Path:
        """A records part, its checksum in the manifest first: a kill between the two
        leaves a checksum of no file, never a part without one."""
        data = parquet_bytes(table)
        self._writable(path)
        self._update_manifest({PARTS_SHA256: {**self.manifest.get(PARTS_SHA256, {}), path.name: hashlib.sha256(data).hexdigest()}})
        return write_bytes_atomic(path, data)

    def _check_part(self, part: Path) -> None:
        """Refuse a part whose bytes are not those the run wrote (its checksum in the
        manifest). Runs from before parts had checksums hold none (every run under
        experiments/runs): their parts are read as before (each row's run_id is still
        checked), unverified."""
        sums = self.manifest.get(PARTS_SHA256)
        if sums is None:
            return
        try:
            stat = part.stat()
        except OSError as exc:
            raise RunFolderError(f"{part}: cannot be read ({exc.strerror})") from None
        if self._verified.get(part) == (stat.st_size, stat.st_mtime_ns):
            return
        if isinstance(sums, dict) and part.name not in sums:  # written since this RunDir read the manifest?
            fresh = read_json_file(self.path / MANIFEST)
            sums = fresh.get(PARTS_SHA256) if isinstance(fresh, dict) else None
        if not isinstance(sums, dict) or part.name not in sums:
            raise RunFolderError(f"{part}: not a part this run wrote (no checksum for it in {MANIFEST}); "
                                 f"move the file out of {self.path} to use the folder")
        if file_sha256(part) != sums[part.name]:
            raise RunFolderError(f"{part}: its content does not match its checksum in {MANIFEST} (edited after it was "
                                 "written?); the run's records cannot be trusted, so the folder is refused")
        self._verified[part] = (stat.st_size, stat.st_mtime_ns)

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
    def kind(self) -> str | None:
        """The analysis kind its config names (`records.summaries`), None for none."""
        return self.config.get("kind")

    def require_kind(self, kind: str, remedy: str = "") -> None:
        """RunFolderError naming the folder's own kind (and `remedy`) unless it is a `kind` run."""
        if self.kind != kind:
            raise RunFolderError(f"{self.path} is not a {kind} run (its kind: {self.kind!r})" + (f": {remedy}" if remedy else ""))

    @property
    def grading(self) -> str:
        """The grading the run's headline and its records' `correct` use."""
        return config_grading(self.config)

    @property
    def saves_tokens(self) -> bool:
        """Whether the run's parts hold the per-token columns (TOKEN_COLUMNS)."""
        return bool(self.config.get("save_logprobs"))

    @property
    def record_schema(self) -> pa.Schema:
        return record_schema(self.saves_tokens)

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
        edited, are refused naming the part), and its bytes those whose checksum the
        manifest holds (`_check_part`). `kw` goes to pyarrow (columns, filters)."""
        ids = read_parquet(part, RECORD_SCHEMA, columns=["run_id"])["run_id"]
        foreign = set(ids.unique().to_pylist()) - {self.run_id}
        if foreign == {"budget_control"} and self.kind == COMPARE:
            raise RunFolderError(f"{part}: budget-control rows written before every writer stamped its run's id "
                                 "(an earlier rnr_interp 0.1); rerun the comparison into a new folder")
        if foreign:
            raise RunFolderError(
                f"{part}: rows of another run (run_id {short_repr(sorted(foreign)[0], 20)}, this run's is "
                f"{self.run_id[:12]}...); move the file out of {self.path} to use the folder")
        self._check_part(part)
        return read_parquet(part, self.record_schema, **kw)

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
        as do missing or unknown columns, values that do not fit the run's
        `record_schema`, and a key (question_id, probe, candidate, intervention)
        repeated in the batch. Every row is written with this run's `run_id`, whatever
        it held: that is what marks a part as the run's own when it is read back. In a
        run that saves tokens, a row without TOKEN_COLUMNS (nothing generated) holds nulls there.
        """
        if not rows:
            return None
        schema = self.record_schema
        expected = set(schema.names)
        if self.saves_tokens:
            rows = [{**dict.fromkeys(TOKEN_COLUMNS), **row} for row in rows]
        for i, row in enumerate(rows):
            if row.keys() != expected:
                missing, extra = sorted(expected - row.keys()), sorted(row.keys() - expected)
                raise ValueError(
                    f"row {i} (question {row.get('question_id')!r}): missing columns {missing}, "
                    f"unknown columns {extra}"
                )
        rows = [{**row, "run_id": self.run_id} for row in rows]
        try:
            table = pa.Table.from_pylist(list(rows), schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise ValueError(f"rows do not fit RECORD_SCHEMA{' + TOKEN_FIELDS' if self.saves_tokens else ''}: {err}") from err
        # Arrow does not enforce nullable=False on conversion.
        nulls = [f.name for f in schema if not f.nullable and table[f.name].null_count]
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
        path = self._write_part(self._next_part_path(), table)
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
        tables = [_with_later_columns(self._read_part(p, filters=filters), self.record_schema) for p in self.parts()]
        table = pa.concat_tables(tables) if tables else self.record_schema.empty_table()
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
        table = pa.Table.from_pandas(self.read_records(), schema=self.record_schema, preserve_index=False)
        merged = self._write_part(self._next_part_path(), table)
        for part in old:
            part.unlink()
        fsync_dir(self.records_dir)
        if PARTS_SHA256 in self.manifest:
            self._update_manifest({PARTS_SHA256: {merged.name: self.manifest[PARTS_SHA256][merged.name]}})
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
            snap._write_part(snap._next_part_path(), pa.Table.from_pandas(records, schema=snap.record_schema, preserve_index=False))
        snap._stored = None
        return snap

    # -- summary and named artefacts ------------------------------------------------
    def write_summary(self, summary: Summary | Mapping[str, Any]) -> Summary:
        """summary.json through its kind's typed summary (`records.summaries`; a mapping
        is checked as one of the run's kind), with the data rows the task skipped as
        invalid (from the config), so every analysis's summary says what it left out.
        Returns the summary as written."""
        kind = self.config.get("kind", summary.kind if isinstance(summary, Summary) else summary.get("kind"))
        cls = summary_type(kind, f"{self.path}")
        if isinstance(summary, Summary) and not isinstance(summary, cls):
            raise SummaryError(f"{self.path}: a {summary.kind} summary for a {kind} run")
        # a typed summary is checked too: a dataclass made directly takes any values
        typed = cls.of(summary.to_json() if isinstance(summary, Summary) else summary, f"{self.path / SUMMARY}")
        skipped = (self.config.get("task") or {}).get("skipped_rows")
        if skipped:
            typed = typed.but(skipped_rows=skipped)
        write_json_atomic(self._writable(self.path / SUMMARY), typed.to_json())
        return typed

    def read_summary(self) -> Summary:
        """summary.json as its kind's typed summary, checked (`SummaryError` naming the
        field that does not fit)."""
        path = self.path / SUMMARY
        if not path.is_file():
            raise FileNotFoundError(f"{self.path} has no {SUMMARY} yet (run not finished?)")
        return parse_summary(read_json_file(path), self.kind, str(path))

    def has_summary(self) -> bool:
        """Whether the run has finished: its summary is written."""
        return (self.path / SUMMARY).is_file()

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
        path = self._writable(self._artefact(name, ".parquet"))
        self.artefacts_dir.mkdir(exist_ok=True)
        return write_parquet_atomic(path, pa.Table.from_pandas(df))

    def read_table(self, name: str) -> pd.DataFrame:
        return read_parquet(self._existing_artefact(name, ".parquet")).to_pandas()

    def write_json(self, name: str, obj: Any) -> Path:
        path = self._writable(self._artefact(name, ".json"))
        self.artefacts_dir.mkdir(exist_ok=True)
        return write_json_atomic(path, obj)

    def read_json(self, name: str) -> Any:
        return read_json_file(self._existing_artefact(name, ".json"))


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _split_stored_task(config: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """(config without `task.stored`, what `task.stored` held): the run's questions go
    to TASK_FILE, not into the hashed config. A config read from another run (a
    snapshot) brings that run's TASK_FILE as `task.stored_file`."""
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(task, dict) or not ({"stored", "stored_file"} & task.keys()):
        return config, None
    stored = task.get("stored")
    if stored is None and task.get("stored_file"):
        stored = read_json_file(Path(task["stored_file"]))
    return {**config, "task": {k: v for k, v in task.items() if k not in ("stored", "stored_file")}}, stored


def _without_stored_file(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest as written: without the `task.stored_file` an open RunDir adds."""
    task = manifest["config"].get("task")
    if not isinstance(task, dict) or "stored_file" not in task:
        return manifest
    return {**manifest, "config": {**manifest["config"], "task": {k: v for k, v in task.items() if k != "stored_file"}}}


def _with_later_columns(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A part's table in `schema` (the run's): a part written before LATER_COLUMNS
    (experiments/runs/gsm8k40's) gets `correct_flexible` = its `correct` (the only rule
    then) and a null `correct_strict`."""
    if "correct_flexible" not in table.column_names:
        table = table.append_column(RECORD_SCHEMA.field("correct_flexible"), table["correct"])
    if "correct_strict" not in table.column_names:
        table = table.append_column(RECORD_SCHEMA.field("correct_strict"), pa.nulls(len(table), pa.bool_()))
    return table.select(schema.names)


def load_runs(path: str | os.PathLike[str], *kinds: str) -> list[RunDir]:
    """The runs under `path` (a sweep folder, searched recursively, sorted by path), or
    `[RunDir(path)]` when `path` is itself a run; only those of `kinds` when given."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    if (root / MANIFEST).is_file():
        runs = [RunDir(root)]
    else:
        runs = [run for sub in sorted(p for p in root.iterdir() if p.is_dir()) for run in load_runs(sub)]
    return [run for run in runs if run.kind in kinds] if kinds else runs
