"""The reproduction driver: run the parts in order under one root, resumably, time each
part, then read the findings and write the index report (also when stopped, from the
runs finished by then).

The root holds one folder per part (``1_audit`` ... ``6_validation``, each a folder of
ordinary run folders), ``reproduce.json`` (the profile, and per part its status and the
wall seconds it has cost so far, summed over invocations until it finishes),
``findings.json`` and ``index.html``. Rerunning with the same profile skips finished
parts and resumes the others run by run; another profile is refused, naming the keys
that differ. A part that fails is recorded with its error and the next part runs.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from rnr_interp.records import read_json_file, write_json_atomic
from rnr_interp.reproduce.findings import as_records, findings
from rnr_interp.reproduce.parts import PARTS, Context, Part
from rnr_interp.reproduce.profiles import Profile

STATE = "reproduce.json"
FINDINGS = "findings.json"
DONE, FAILED, PENDING = "done", "failed", "not run"


@dataclass
class Reproduction:
    root: Path
    profile: Profile
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def open(cls, root: Path, profile: Profile) -> "Reproduction":
        """The root's state, new or resumed; a root made with another profile is refused."""
        state = read_json_file(root / STATE) if (root / STATE).is_file() else {}
        if state:
            # compared as stored (JSON has lists where the profile has tuples)
            old, new = state.get("profile", {}), json.loads(json.dumps(profile.config()))
            if unknown := sorted(new.keys() - old.keys()):
                raise ValueError(f"{root} was made before the profile setting(s) {', '.join(unknown)} existed (an earlier "
                                 "rnr_interp 0.1); use another --out")
            differ = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
            if differ:
                raise ValueError(f"{root} was made with profile {state.get('profile_name')!r} and other sizes "
                                 f"(differing: {', '.join(differ)}); use another --out or the same profile")
        parts = state.get("parts", {})
        for part in PARTS:
            parts.setdefault(part.name, {"title": part.title, "status": PENDING, "seconds": 0.0})
        return cls(root, profile, parts)

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.root / STATE, {"profile_name": self.profile.name, "profile": self.profile.config(),
                                              "why": self.profile.why, "parts": self.parts})

    def run_part(self, part: Part, ctx: Context) -> None:
        entry = self.parts[part.name]
        start = time.monotonic()
        try:
            part.run(ctx, self.root / part.name)
            entry.update(status=DONE, error=None)
            entry.pop("traceback", None)  # an earlier invocation's failure no longer applies
        except KeyboardInterrupt:
            entry.update(status=FAILED, error="interrupted")
            entry.pop("traceback", None)  # an earlier invocation's, not this stop's
            raise
        except Exception as exc:  # one part's failure must not cost the others
            entry.update(status=FAILED, error=f"{type(exc).__name__}: {exc}",
                         traceback=traceback.format_exc(limit=6))
        finally:
            spent = time.monotonic() - start
            entry["seconds"] = round(float(entry.get("seconds", 0.0)) + spent, 1)
            # A part resumed on another machine: its cost says where each share was spent.
            by_device, device = entry.setdefault("seconds_by_device", {}), device_label()
            by_device[device] = round(float(by_device.get(device, 0.0)) + spent, 1)
            self.save()


def device_label() -> str:
    """Where this process's models run, as a cost row names it."""
    import torch

    from rnr_interp.models import resolve_device

    device = resolve_device()
    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"cpu ({torch.get_num_threads()} threads)"


def default_parts(profile: Profile) -> list[str]:
    """The parts a run that names none runs: all but the profile's opt-in ones."""
    return [p.name for p in PARTS if p.name not in profile.opt_in]


def reproduce(profile: Profile, root: str | Path, *, parts: Sequence[str] | None = None,
              checkpoints: dict[str, Path] | None = None, progress: bool = False,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or resume) the chosen parts (default: all but the profile's opt-in ones), then
    findings and the index report (also when stopped); returns the state (per-part status
    and cost) with the findings."""
    root = Path(root)
    wanted = list(parts) if parts else default_parts(profile)
    unknown = [p for p in wanted if p not in {q.name for q in PARTS}]
    if unknown:
        raise ValueError(f"unknown part {unknown[0]!r}; parts: {', '.join(p.name for p in PARTS)}")
    state = Reproduction.open(root, profile)
    state.save()
    ctx = Context(profile, root, progress=progress, checkpoints=dict(checkpoints or {}), log=log)
    try:
        with _terminate_as_interrupt():
            for part in PARTS:
                entry = state.parts[part.name]
                if part.name not in wanted:
                    continue
                if entry["status"] == DONE:
                    log(f"{part.name}: done before ({entry['seconds']:.0f} s), skipped")
                    continue
                log(f"{part.name}: {part.title}")
                state.run_part(part, ctx)
                log(f"{part.name}: {entry['status']} after {entry['seconds']:.0f} s"
                    + (f" ({entry['error']})" if entry.get("error") else ""))
    except KeyboardInterrupt:
        # A stopped run's finished work still reaches the findings and the index (a few
        # seconds; the TERM handler is back to the default, so a second `kill` ends it).
        log("interrupted: writing the findings and the index from the finished runs")
        write_outcome(root, profile, state)
        raise
    rows, page = write_outcome(root, profile, state)
    return {"parts": state.parts, "findings": rows, "index": str(page)}


def write_outcome(root: Path, profile: Profile, state: Reproduction) -> tuple[list[dict[str, Any]], Path]:
    """The findings table, its Markdown page (old values beside new where they changed) and
    the index page, from the run folders under `root` as they are."""
    from rnr_interp.report.findings_page import write_findings_page
    from rnr_interp.report.reproduction import write_reproduction_report

    previous = read_json_file(root / FINDINGS) if (root / FINDINGS).is_file() else []
    rows = as_records(findings(root))
    write_json_atomic(root / FINDINGS, rows)
    write_findings_page(root, profile.name, profile.model, state.parts, rows, previous)
    return rows, write_reproduction_report(root, profile.name, profile.model, profile.why, state.parts, rows)


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (`kill`, a batch scheduler's time limit) stops the run as Ctrl-C does, so
    the running part is recorded as interrupted with the time it cost. A job started in
    the background ignores SIGINT, so TERM is how such a run is stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
