"""What an untrusted checkpoint is checked for before anything of it loads: code it
would run (an `auto_map`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rnr_interp.models.errors import ModelSpecError

#: files of a checkpoint folder whose `auto_map` points the loader at Python code the
#: checkpoint ships (config, tokenizer, processor)
CODE_MAP_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def refuse_remote_code(folder: Path) -> None:
    """Refuse a checkpoint folder that needs code of its own to load (an `auto_map` in
    its config files): loading it would run that code. Every loader also passes
    trust_remote_code=False, so the library never asks; this says why in one line."""
    for name in CODE_MAP_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ModelSpecError(f"checkpoint {str(folder)!r}: {name} is not readable JSON ({first_line(exc)})") from None
        if isinstance(config, dict) and config.get("auto_map"):
            raise ModelSpecError(
                f"checkpoint {str(folder)!r} needs code of its own to load ({name} has an auto_map naming "
                f"{short_names(config['auto_map'])}); rnr never runs a checkpoint's code, use a checkpoint of a "
                "built-in architecture")


def short_names(auto_map: Any) -> str:
    names = sorted({str(v) for v in auto_map.values()}) if isinstance(auto_map, dict) else [str(auto_map)]
    text = ", ".join(names)
    return text if len(text) <= 80 else text[:77] + "..."


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
