"""Files written whole or not at all (a `*.tmp` beside, then `os.replace`), and run
files read back with one-line errors naming the file: JSON (depth-bounded) and Parquet."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import IO, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rnr_interp.records.schema import LATER_COLUMNS, RECORD_COLUMNS, RunFolderError

# -- atomic files -----------------------------------------------------------------


def fsync_dir(folder: Path) -> None:
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
        # O_NOFOLLOW: a link planted at the temp name is refused, not written through
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def json_default(obj: Any) -> Any:
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
    return json.dumps(obj, indent=2, default=json_default)


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    """Serialise first (a failing encode never touches the file), then write atomically."""
    data = (_to_json(obj) + "\n").encode()
    return _atomic_write(Path(path), lambda f: f.write(data))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    data = text.encode()
    return _atomic_write(Path(path), lambda f: f.write(data))


def write_parquet_atomic(path: Path, table: pa.Table) -> Path:
    return _atomic_write(path, lambda f: pq.write_table(table, f))


def parquet_bytes(table: pa.Table) -> bytes:
    """A table as the bytes of a Parquet file (to checksum before it is written)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    return _atomic_write(path, lambda f: f.write(data))


def remove_temp_files(*folders: Path) -> None:
    for folder in folders:
        if folder.is_dir():
            for tmp in folder.glob("*.tmp"):
                tmp.unlink(missing_ok=True)


# -- reading run files -------------------------------------------------------------


def first_line(exc: BaseException) -> str:
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


#: the largest JSON file read: a run folder's own are under a megabyte, a sweep grid with
#: inline steering vectors or clamp bases a few; a larger one is not data of ours
MAX_JSON_BYTES = 64 << 20


def _bounded_bytes(path: Path) -> bytes:
    """The bytes of `path`, when it is a regular file (links followed) of at most
    MAX_JSON_BYTES: a device (/dev/zero), a pipe or a huge file is refused before a byte is
    read, and one that grows after the check is cut off at the limit and refused."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise RunFolderError(f"{path}: not a regular file (a device, a pipe or a folder)")
    with open(path, "rb") as f:
        raw = f.read(MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:
        raise RunFolderError(f"{path}: more than the {MAX_JSON_BYTES:,} bytes a JSON file may hold")
    return raw


def read_json_file(path: Path) -> Any:
    """A JSON file's content, or RunFolderError naming the file and what is wrong
    (missing, not a regular file, too large, not UTF-8, not JSON, nested too deep)."""
    try:
        return parse_json(_bounded_bytes(Path(path)).decode("utf-8"))
    except JSONTooDeepError as exc:
        raise RunFolderError(f"{path}: {exc}") from None
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing") from None
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot be read ({exc.strerror or first_line(exc)})") from None
    except UnicodeDecodeError as exc:
        raise RunFolderError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise RunFolderError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


def read_parquet(path: Path, schema: pa.Schema | None = None, **kw: Any) -> pa.Table:
    """A Parquet file as a table. With `schema`, the file must hold every one of its
    columns with its type (extra columns are ignored). Damaged or foreign files raise
    RunFolderError naming the file."""
    try:
        found = pq.read_schema(path)
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing") from None
    except (pa.ArrowException, OSError) as exc:
        raise RunFolderError(f"{path}: not a readable Parquet file ({first_line(exc)})") from None
    records = schema is not None and tuple(schema.names[:len(RECORD_COLUMNS)]) == RECORD_COLUMNS
    if schema is not None:
        for field in schema:
            i = found.get_field_index(field.name)
            if i < 0 and records and field.name in LATER_COLUMNS:  # parts from before them: experiments/runs/gsm8k40
                continue
            if i < 0:
                raise RunFolderError(f"{path}: not a records part of this format (no column {field.name!r})")
            if not found.field(i).type.equals(field.type):
                raise RunFolderError(
                    f"{path}: not a records part of this format (column {field.name!r} is {found.field(i).type}, "
                    f"expected {field.type})"
                )
    if records:
        schema = pa.schema([f for f in schema if f.name not in LATER_COLUMNS or found.get_field_index(f.name) >= 0])
        if kw.get("columns") is not None:
            kw["columns"] = [c for c in kw["columns"] if c in schema.names]
    try:
        return pq.read_table(path, schema=schema, **kw)
    except (pa.ArrowException, OSError) as exc:
        raise RunFolderError(f"{path}: damaged Parquet file ({first_line(exc)})") from None
