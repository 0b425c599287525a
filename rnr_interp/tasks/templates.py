"""Jinja templates from files a user hands in (a task config's `doc_to_text`, ...):
rendered in a sandbox, with bounds on time, memory and output.

A task config is untrusted input (docs/reliability.md, "What is trusted"). lm-eval renders
its templates in a plain `jinja2.Environment`, where `{{ lipsum.__globals__.os... }}`
runs a shell command; here they render in jinja2's `ImmutableSandboxedEnvironment` with
lm-eval's settings (StrictUndefined, trailing newlines kept) and its one filter
(`regex_replace`), so no attribute starting with `_` (`__class__`, `__globals__`, ...)
is reachable, nothing is mutated, and neither modules nor the process environment are
in scope. `lipsum` (whose only use is text of any length) is left out of the globals.

The sandbox bounds no work, so the rendering of a whole task runs in a forked child
process (`bounded_call`) with an address-space and a CPU limit, and each render stops
after `MAX_RENDER_SECONDS` of CPU: a loop over `range(10**9)` or a string of four
billion characters is refused in one line naming the field instead of filling memory.
"""

from __future__ import annotations

import os
import pickle
import re
import resource
import signal
import threading
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Callable, Iterator, Sequence, TypeVar

from jinja2 import StrictUndefined, Template
from jinja2.sandbox import ImmutableSandboxedEnvironment

T = TypeVar("T")

#: CPU seconds one template may take to render one row (real ones take microseconds)
MAX_RENDER_SECONDS = 2.0
#: characters one rendered field may hold (a prompt of a few thousand tokens is 20 kB)
MAX_RENDER_CHARS = 1_000_000
#: memory the child that renders a task may add to what its parent holds
MAX_RENDER_MEMORY = 1 << 30
#: CPU seconds the child that renders a task may take in all
MAX_CHILD_SECONDS = 600


class TemplateLimitError(ValueError):
    """A template (or the rendering of a whole task) went past one of the bounds."""


class _RenderTimeout(Exception):
    """Raised inside a render by the CPU timer (caught and reworded with the field)."""


def regex_replace(string: str, pattern: str, repl: str, count: int = 0) -> str:
    """lm-eval 0.4.13's `regex_replace` filter (`re.sub`)."""
    return re.sub(pattern, repl, string, count=count)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with `*` and `**` refused when their result would exceed the output
    bound (these allocate before any timer can stop them)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > MAX_RENDER_CHARS:
                    raise TemplateLimitError(f"'*' would build {len(seq) * times:,} items (the limit is {MAX_RENDER_CHARS:,})")
        if operator == "**" and isinstance(left, int) and isinstance(right, int) \
                and abs(right) * max(abs(left), 2).bit_length() > 64 * 1024:
            raise TemplateLimitError(f"'**' would build a number of more than {64 * 1024:,} bits")
        return super().call_binop(context, operator, left, right)


@lru_cache(maxsize=1)
def sandbox() -> BoundedSandbox:
    """The one environment every user template renders in."""
    env = BoundedSandbox(undefined=StrictUndefined, keep_trailing_newline=True)
    env.filters["regex_replace"] = regex_replace
    env.globals.pop("lipsum", None)
    return env


@lru_cache(maxsize=256)
def _compiled(template: str) -> Template:
    return sandbox().from_string(template)


@contextmanager
def _cpu_timer(seconds: float) -> Iterator[None]:
    """Raise _RenderTimeout in this thread after `seconds` of the process's CPU time
    (only the main thread receives signals: elsewhere the child's limits bound it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise _RenderTimeout

    previous = signal.signal(signal.SIGVTALRM, expired)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


def render(template: str, doc: dict[str, Any], field: str) -> str:
    """`template` rendered with the row's columns in the sandbox, within the CPU and
    output bounds; a template that breaks one is refused naming `field`. Other errors
    (an undefined column, a blocked attribute: `SecurityError`) propagate as jinja2's."""
    try:
        with _cpu_timer(MAX_RENDER_SECONDS):
            out = _compiled(template).render(**doc)
    except _RenderTimeout:
        raise TemplateLimitError(f"{field} took more than {MAX_RENDER_SECONDS:g} s of CPU to render one row "
                                 "(a template's loops are bounded)") from None
    except MemoryError:
        raise TemplateLimitError(f"{field} needs more than {MAX_RENDER_MEMORY >> 20} MB to render one row") from None
    except TemplateLimitError as e:
        raise TemplateLimitError(f"{field}: {e}") from None
    if len(out) > MAX_RENDER_CHARS:
        raise TemplateLimitError(f"{field} renders {len(out):,} characters for one row (the limit is {MAX_RENDER_CHARS:,})")
    return out


def render_each(render_one: Callable[[Any], str], items: Sequence[Any], what: str) -> list[str]:
    """`render_one(item)` for every item, in a bounded child (`bounded_call`), each
    within MAX_RENDER_SECONDS of CPU and MAX_RENDER_CHARS: for templates that come with
    a model (a checkpoint's chat template), which render in their own sandbox but
    unbounded. Any failure is one line naming `what`."""
    def work() -> list[str]:
        out = []
        for item in items:
            try:
                with _cpu_timer(MAX_RENDER_SECONDS):
                    text = render_one(item)
            except _RenderTimeout:
                raise TemplateLimitError(f"{what} took more than {MAX_RENDER_SECONDS:g} s of CPU to render one prompt") from None
            except MemoryError:
                raise TemplateLimitError(f"{what} needs more than {MAX_RENDER_MEMORY >> 20} MB to render one prompt") from None
            except Exception as e:  # noqa: BLE001 - jinja2's SecurityError, an OverflowError, a template's own raise
                raise ValueError(f"{what} does not render ({type(e).__name__}: {e})") from None
            if len(text) > MAX_RENDER_CHARS:
                raise TemplateLimitError(f"{what} renders {len(text):,} characters for one prompt (the limit is {MAX_RENDER_CHARS:,})")
            out.append(text)
        return out

    return bounded_call(work, f"rendering {what}")


def _virtual_memory() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def bounded_call(fn: Callable[[], T], what: str, *, memory: int = MAX_RENDER_MEMORY, seconds: int = MAX_CHILD_SECONDS) -> T:
    """`fn()` run in a forked child that may add at most `memory` bytes to this
    process's address space and take `seconds` of CPU; its result (or the exception
    it raised) comes back pickled. A child killed by a limit is refused in one line
    naming `what`. Where there is no fork or no /proc (not Linux), `fn()` runs here."""
    if not hasattr(os, "fork") or not os.path.exists("/proc/self/statm"):
        return fn()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        try:
            os.close(read_end)
            limit = _virtual_memory() + memory
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
            try:
                payload: tuple[str, Any] = ("ok", fn())
            except BaseException as e:  # noqa: BLE001 - handed to the parent, which raises it
                payload = ("error", e)
            try:
                data = pickle.dumps(payload)
            except Exception as e:  # noqa: BLE001 - an exception that does not pickle
                data = pickle.dumps(("error", ValueError(f"{what}: {type(payload[1]).__name__}: {e}")))
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(data)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        raise TemplateLimitError(f"{what} was stopped ({how}): it went past {memory >> 20} MB of memory or "
                                 f"{seconds} s of CPU")
    kind, value = pickle.loads(data)  # noqa: S301 - written by our own child, above
    if kind == "error":
        if isinstance(value, MemoryError):
            raise TemplateLimitError(f"{what} needs more than {memory >> 20} MB of memory") from None
        raise value
    return value
