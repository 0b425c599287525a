"""Static images (SVG, PNG) of plotly figures, rendered offline by the system Chromium.

plotly's own exporter, kaleido, also drives a Chrome; rather than add it as a
dependency, this module does what it does: load a page holding the plotly.js that ships
with the plotly package and the figures' JSON, let `Plotly.toImage` turn each figure
into a data URL, and read the URLs back from the DOM Chromium dumps. Nothing is fetched
from the network: the page has no external resources and host resolution is disabled.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse
from pathlib import Path
from typing import Iterable, Sequence

import plotly.graph_objects as go

#: where Chromium is looked for, after $RNR_CHROMIUM
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FORMATS = ("svg", "png")


class ChromiumNotFound(RuntimeError):
    pass


def find_chromium() -> str | None:
    """$RNR_CHROMIUM, else the first of CHROMIUM_CANDIDATES that exists."""
    if env := os.environ.get("RNR_CHROMIUM"):
        return env if Path(env).is_file() else None
    for name in CHROMIUM_CANDIDATES:
        if path := shutil.which(name):
            return path
    return None


def headless(url: str, *flags: str, user_data_dir: str | os.PathLike[str], timeout: float = 120,
             chromium: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on `url` with flags that keep it off the network and let it
    run as root in a container (no sandbox, no GPU); `flags` add e.g. --dump-dom."""
    binary = chromium or find_chromium()
    if binary is None:
        raise ChromiumNotFound("no Chromium found: install it (apt-get install -y chromium) or set RNR_CHROMIUM")
    cmd = [
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
        "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-extensions", "--hide-scrollbars",
        '--host-resolver-rules=MAP * ~NOTFOUND', f"--user-data-dir={user_data_dir}", *flags, url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _script_json(obj: object) -> str:
    # "</" inside a <script> would end it early (sample texts can hold anything).
    return json.dumps(obj).replace("</", "<\\/")


def _export_page(figures: Sequence[go.Figure], formats: Sequence[str], width: int, height: int, scale: float) -> str:
    from plotly.offline import get_plotlyjs

    specs = _script_json([json.loads(fig.to_json()) for fig in figures])
    return f"""<!doctype html><html><head><meta charset="utf-8"><script>{get_plotlyjs()}</script></head><body>
<script>
const figs = {specs}, formats = {json.dumps(list(formats))};
function put(id, text) {{ const el = document.createElement("pre"); el.id = id; el.textContent = text; document.body.appendChild(el); }}
(async () => {{
  for (const [i, fig] of figs.entries()) for (const fmt of formats) {{
    try {{ put(`img-${{i}}-${{fmt}}`, await Plotly.toImage(fig, {{format: fmt, width: {width}, height: {height}, scale: {scale}}})); }}
    catch (e) {{ put(`err-${{i}}-${{fmt}}`, String(e)); }}
  }}
  put("done", "");
}})();
</script></body></html>"""


def _decode(data_url: str) -> bytes:
    head, _, payload = data_url.partition(",")
    return base64.b64decode(payload) if head.endswith(";base64") else urllib.parse.unquote(payload).encode()


def export_figures(figures: Iterable[tuple[str, go.Figure]], folder: str | os.PathLike[str],
                   formats: Sequence[str] = FORMATS, scale: float = 2.0, timeout: float = 180) -> list[Path]:
    """Write each (name, figure) as folder/name.svg and/or .png, in one Chromium run.
    Raises ChromiumNotFound without a browser, RuntimeError if a figure fails to render."""
    named = list(figures)
    if bad := set(formats) - set(FORMATS):
        raise ValueError(f"formats must be among {FORMATS}, got {sorted(bad)}")
    if not named:
        return []
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    width, height = (int(named[0][1].layout.width or 820), int(named[0][1].layout.height or 460))
    with tempfile.TemporaryDirectory(prefix="rnr-export-") as tmp:
        page = Path(tmp) / "export.html"
        page.write_text(_export_page([fig for _, fig in named], formats, width, height, scale), encoding="utf-8")
        # Virtual time runs ahead while the page idles, so the budget is rarely waited out.
        done = headless(page.as_uri(), "--virtual-time-budget=60000", "--dump-dom",
                        user_data_dir=Path(tmp) / "profile", timeout=timeout)
    found = dict(re.findall(r'<pre id="((?:img|err)-\d+-\w+)">([^<]*)</pre>', done.stdout))
    if 'id="done"' not in done.stdout:
        raise RuntimeError(f"Chromium did not finish exporting (exit {done.returncode}): {done.stderr[-500:]}")
    written: list[Path] = []
    for i, (name, _) in enumerate(named):
        for fmt in formats:
            if (url := found.get(f"img-{i}-{fmt}")) is None:
                raise RuntimeError(f"figure {name!r} did not export as {fmt}: {found.get(f'err-{i}-{fmt}', 'no output')}")
            path = out / f"{name}.{fmt}"
            path.write_bytes(_decode(html.unescape(url)))  # the DOM dump escapes text
            written.append(path)
    return written
