"""Reading data files row by row, shared by every loader.

Each format module splits into `parse_row(obj, index) -> Question` (one row as a dict,
the same shape whether it came from a local file or a Hugging Face dataset) and file
iteration here. Row parsers raise `RowError` with the problem only; the iteration that
knows the file and line turns it into a `DataFormatError`.
"""

from __future__ import annotations

import bz2
import json
import os
import stat
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from rnr_interp.records import JSONTooDeepError, parse_json

from .base import LETTERS, DataFormatError, Question

RowParser = Callable[[dict[str, Any], int], Question]


class RowError(ValueError):
    """A row that does not fit its format; the caller adds file and line."""


BOM = "\ufeff"
#: the environment variable that raises the data size bound, in MB
MAX_DATA_MB_VAR = "RNR_MAX_DATA_MB"
#: the bound without it: some thirty times the largest benchmark read here (HellaSwag, 7.8 MB decompressed)
DEFAULT_MAX_DATA_MB = 256
#: the longest line of a data file (a row of a JSONL file, a question of a text file)
MAX_LINE_BYTES = 16 << 20


def max_data_bytes() -> int:
    """The most bytes a data file (decompressed) may hold: RNR_MAX_DATA_MB, else 256 MB."""
    raw = os.environ.get(MAX_DATA_MB_VAR, str(DEFAULT_MAX_DATA_MB))
    try:
        mb = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_DATA_MB_VAR}={raw!r}: expected a number of MB") from None
    return max(mb, 1) << 20


def checked_data_file(path: str | Path) -> Path:
    """`path`, when it is a regular file (links followed) no larger than
    `max_data_bytes()`: a device (/dev/zero), a pipe or an oversized file is refused
    before a byte is read."""
    p = Path(path)
    try:
        info = p.stat()
    except OSError as e:
        raise DataFormatError(p, None, f"cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise DataFormatError(p, None, "not a regular file (a device, a pipe or a socket): data must be a file")
    limit = max_data_bytes()
    if info.st_size > limit:
        raise DataFormatError(p, None, f"{info.st_size:,} bytes, more than the {limit >> 20} MB a data file may hold "
                              f"(set {MAX_DATA_MB_VAR} to raise it)")
    return p


def _read_bytes(p: Path) -> bytes:
    raw = checked_data_file(p).read_bytes()
    if p.suffix != ".bz2":
        return raw
    limit, data = max_data_bytes(), bytearray()
    while raw:  # stream after stream, as bz2.decompress reads them, but never past the limit
        stream = bz2.BZ2Decompressor()
        try:
            data += stream.decompress(raw, max_length=limit + 1 - len(data))
        except (OSError, ValueError, EOFError) as e:  # a damaged stream
            raise DataFormatError(p, None, f"not a readable bzip2 file ({e})") from None
        if len(data) > limit:
            raise DataFormatError(p, None, f"decompresses to more than the {limit >> 20} MB a data file may hold "
                                  f"(set {MAX_DATA_MB_VAR} to raise it)")
        if not stream.eof:
            raise DataFormatError(p, None, "not a readable bzip2 file (Compressed file ended before the end-of-stream marker was reached)")
        raw = stream.unused_data
    return bytes(data)


def read_lines(path: str | Path) -> list[str]:
    """The file's lines, read as UTF-8 (bz2 when the name ends in .bz2), each without
    a leading byte-order mark (editors write one at the start; concatenated files
    carry one in the middle).

    Splits on '\\n' only: `str.splitlines` would also split on characters such as
    U+2028 that can occur inside a question and shift every later record. Bytes that
    are not UTF-8 raise DataFormatError naming the line and column."""
    p = Path(path)
    lines = []
    for line_no, raw in enumerate(_read_bytes(p).split(b"\n"), 1):
        if len(raw) > MAX_LINE_BYTES:
            raise DataFormatError(p, line_no, f"a line of {len(raw):,} bytes; a data file's lines hold at most {MAX_LINE_BYTES:,}")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataFormatError(p, line_no, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
        lines.append(line.removesuffix("\r").removeprefix(BOM))
    if lines and lines[-1] == "":  # the final newline ends the last line, it starts none
        lines.pop()
    return lines


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) for each non-blank line of a JSON-lines file."""
    for line_no, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        try:
            obj = parse_json(line)
        except json.JSONDecodeError as e:
            raise DataFormatError(path, line_no, f"not valid JSON ({e.msg} at column {e.colno})") from None
        except JSONTooDeepError as e:
            raise DataFormatError(path, line_no, str(e)) from None
        if not isinstance(obj, dict):
            raise DataFormatError(path, line_no, f"expected a JSON object, got {type(obj).__name__}")
        yield line_no, obj


def iter_records(path: str | Path, size: int) -> Iterator[tuple[int, list[str]]]:
    """(1-based first line, lines) for a file of fixed-size multi-line records.
    Trailing blank lines are ignored; a short final record is an error."""
    lines = read_lines(path)
    while lines and not lines[-1].strip():
        lines.pop()
    for start in range(0, len(lines), size):
        record = lines[start : start + size]
        if len(record) < size:
            raise DataFormatError(
                path, start + 1, f"truncated record: {len(record)} of {size} lines before end of file"
            )
        yield start + 1, record


#: what to do with a row that does not parse: "refuse" the file, or "skip" the row
ON_INVALID = ("refuse", "skip")
#: the rows skipped while a `collecting_invalid_rows` block loads a task (None: refuse)
_SKIPPED: ContextVar[list[dict[str, Any]] | None] = ContextVar("skipped_rows", default=None)


@contextmanager
def collecting_invalid_rows(on_invalid: str) -> Iterator[list[dict[str, Any]] | None]:
    """Within the block, `parse_all` drops an invalid row ("skip") into the list this
    yields, as {"row", "id", "reason"}, instead of refusing the file ("refuse", the
    default everywhere, yields None). Problems of the file as a whole (not UTF-8, not
    JSON lines, duplicate ids) still refuse it."""
    if on_invalid not in ON_INVALID:
        raise ValueError(f"--on-invalid must be one of {', '.join(ON_INVALID)}, got {on_invalid!r}")
    skipped: list[dict[str, Any]] | None = [] if on_invalid == "skip" else None
    token = _SKIPPED.set(skipped)
    try:
        yield skipped
    finally:
        _SKIPPED.reset(token)


def invalid_rows() -> list[dict[str, Any]] | None:
    """The rows skipped so far in the current skipping block (None: invalid rows refuse)."""
    return _SKIPPED.get()


def row_id(obj: Any) -> str | None:
    """The id a row names itself by, when it has a usable one (for the skipped list)."""
    value = obj.get("id") if isinstance(obj, dict) else None
    return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def invalid_row(path: str | Path, line_no: int, obj: Any, problem: str) -> None:
    """Refuse the file at this row (DataFormatError), or, inside a skipping
    `collecting_invalid_rows` block, record the row and return."""
    skipped = _SKIPPED.get()
    if skipped is None:
        raise DataFormatError(path, line_no, problem)
    skipped.append({"row": line_no, "id": row_id(obj), "reason": problem})


def parse_all(
    path: str | Path, rows: Iterable[tuple[int, dict[str, Any]]], parse_row: RowParser
) -> list[Question]:
    """Parse numbered rows; the row's index (0-based) feeds default ids. An invalid
    row refuses the file, or is skipped (see `collecting_invalid_rows`)."""
    out = []
    for index, (line_no, obj) in enumerate(rows):
        try:
            out.append(check_question(parse_row(obj, index)))
        except RowError as e:
            invalid_row(path, line_no, obj, str(e))
    return out


def check_question(q: Question) -> Question:
    """Refuse a question whose gold answer is ambiguous: a gold option whose text (up
    to spacing; case can matter, as in "Rr" vs "rr") is also another option's, so a
    model choosing the twin would be graded wrong for the same answer."""
    if q.choices is not None and q.gold_index is not None:
        key = " ".join(q.choices[q.gold_index].split())
        twins = [i for i, c in enumerate(q.choices) if i != q.gold_index and " ".join(c.split()) == key]
        if twins:
            raise RowError(
                f"ambiguous gold: option {LETTERS[q.gold_index]} (the gold) and option {LETTERS[twins[0]]} "
                f"have the same text {q.choices[q.gold_index]!r}"
            )
    return q


# -- field access for row parsers --------------------------------------------
def get_str(obj: dict[str, Any], key: str, *, allow_empty: bool = False) -> str:
    if key not in obj:
        raise RowError(f"missing field {key!r}")
    value = obj[key]
    if not isinstance(value, str):
        raise RowError(f"field {key!r} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise RowError(f"field {key!r} is empty")
    return value


def get_str_list(obj: dict[str, Any], key: str, n: int | None = None) -> list[str]:
    value = obj.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RowError(f"field {key!r} must be a list of strings")
    if n is not None and len(value) != n:
        raise RowError(f"field {key!r} must have {n} entries, has {len(value)}")
    return value


def get_index(obj: dict[str, Any], key: str, n: int) -> int:
    """An option index 0..n-1 given as an int or a digit string (HF exports use both)."""
    if key not in obj:
        raise RowError(f"missing field {key!r}")
    value = obj[key]
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise RowError(f"field {key!r} must be an option index 0..{n - 1}, got {obj[key]!r}")
    return value
