"""docs/records.md is generated from the code that defines run folders, and says what
the code says."""

from pathlib import Path

from rnr_interp.records.reference import records_reference
from rnr_interp.records.schema import COLUMNS, RECORD_SCHEMA

DOC = Path(__file__).resolve().parents[1] / "docs" / "records.md"


def test_docs_records_md_is_the_code_s_reference():
    assert DOC.read_text() == records_reference(), \
        "docs/records.md is out of date: python -m rnr_interp.records.reference > docs/records.md"


def test_every_record_column_is_described():
    assert [c[0] for c in COLUMNS] == RECORD_SCHEMA.names and all(doc for *_, doc in COLUMNS)
    for name, *_ in COLUMNS:
        assert f"| `{name}` |" in DOC.read_text()
