"""Open a local HTML file in real headless Chromium and record what a person's browser would have done with it.

Why a real browser: a report can be valid-looking HTML and still show a reader broken images (a truncated base64
PNG), a blank page (a script error) or nothing at all offline (a plot or font fetched from a CDN). Only a browser
decodes the images, runs the scripts and issues the requests, so the checks are made on what it did, not on the
HTML text.

Chromium is Debian's ``chromium`` package (``scripts/setup --test`` installs it), driven by Playwright's Python API
through ``executable_path``: Playwright's own browser downloads are not used (this network cannot reach them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")

CHROMIUM_ARGS = [
    "--no-sandbox",  # root in a container: the setuid/namespace sandbox is unavailable
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # The network is closed here: without these Chromium keeps retrying its own background connections, which
    # are refused, and each launch gets slower.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
"""URL schemes that never leave the machine; a self-contained page requests nothing else."""

# Per <img>: whether it decoded (HTMLImageElement.decode() rejects a broken image), its intrinsic and laid-out
# size, the <h2> it sits under (so a caller can tell which report section each plot belongs to), and how much of
# its bottom pixel row is opaque. Chromium shows a truncated PNG without complaint, the rows it never received
# left transparent: an opaque plot whose last row is transparent arrived cut short.
_IMAGES_JS = """
async () => {
  let section = null;
  const out = [];
  for (const el of document.querySelectorAll('h2, img')) {
    if (el.tagName === 'H2') { section = el.textContent.trim(); continue; }
    let decodeError = null, bottomOpaque = null, canvasError = null;
    try { await el.decode(); } catch (e) { decodeError = String(e); }
    if (!decodeError && el.naturalWidth > 0) {
      try {
        const c = document.createElement('canvas');
        c.width = el.naturalWidth; c.height = el.naturalHeight;
        const g = c.getContext('2d');
        g.drawImage(el, 0, 0);
        const row = g.getImageData(0, el.naturalHeight - 1, el.naturalWidth, 1).data;
        let opaque = 0;
        for (let i = 3; i < row.length; i += 4) if (row[i] === 255) opaque++;
        bottomOpaque = opaque / el.naturalWidth;
      } catch (e) { canvasError = String(e); }
    }
    const r = el.getBoundingClientRect();
    out.push({section, src: el.currentSrc, complete: el.complete, decodeError, bottomOpaque, canvasError,
              naturalWidth: el.naturalWidth, naturalHeight: el.naturalHeight,
              x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height});
  }
  return out;
}
"""


class BrowserMissing(RuntimeError):
    """Chromium or Playwright is not installed: the test environment was not set up with ``scripts/setup --test``."""


@dataclass
class PageVisit:
    """What loading one page did: every request, console message and uncaught error, its images and a screenshot."""

    url: str
    requests: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    console: list[tuple[str, str]] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)
    screenshot: Path | None = None
    title: str = ""

    @property
    def external_requests(self) -> list[str]:
        """Requests for anything not on this machine (also those the route blocked before they went out)."""
        seen = [u for u in self.requests if not u.startswith(LOCAL_SCHEMES)]
        return sorted(set(seen) | set(self.blocked))

    @property
    def console_errors(self) -> list[str]:
        return [text for kind, text in self.console if kind == "error"]


def require_chromium() -> Path:
    """The Chromium binary, or :class:`BrowserMissing` saying how to install it (CI installs it, so no skip)."""
    if not CHROMIUM.exists():
        raise BrowserMissing(f"{CHROMIUM} is missing: run scripts/setup --test (it installs Debian's chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        raise BrowserMissing(f"the Python package playwright is missing ({exc}): run scripts/setup --test") from None
    return CHROMIUM


def visit(path: Path, screenshot: Path, profile: Path, *, timeout_ms: int = 60_000) -> PageVisit:
    """Load ``path`` as a ``file://`` URL in headless Chromium with a fresh profile; screenshot the full page.

    Requests to anything but local schemes are recorded and aborted (not left to time out on the closed
    network), so a page that reaches out is reported at once and the run stays fast.
    """
    from playwright.sync_api import sync_playwright

    binary = require_chromium()
    url = path.resolve().as_uri()
    result = PageVisit(url=url)
    profile.mkdir(parents=True, exist_ok=True)
    if any(profile.iterdir()):
        raise ValueError(f"browser profile directory {profile} is not empty: each visit needs a fresh profile")

    def route(r) -> None:
        if r.request.url.startswith(LOCAL_SCHEMES):
            r.continue_()
        else:
            result.blocked.append(r.request.url)
            r.abort("blockedbyclient")

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(binary),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
            device_scale_factor=1,
        )
        try:
            context.route("**/*", route)
            page = context.new_page()
            page.set_default_timeout(timeout_ms)
            page.on("request", lambda req: result.requests.append(req.url))
            page.on("requestfailed", lambda req: result.failed_requests.append(f"{req.url}: {req.failure}"))
            page.on("console", lambda msg: result.console.append((msg.type, msg.text)))
            page.on("pageerror", lambda exc: result.page_errors.append(str(exc)))
            response = page.goto(url, wait_until="load")
            if response is not None and not response.ok:
                raise AssertionError(f"loading {url} answered {response.status}")
            page.wait_for_load_state("networkidle")
            result.title = page.title()
            result.images = page.evaluate(_IMAGES_JS)
            page.screenshot(path=str(screenshot), full_page=True)
            result.screenshot = screenshot
        finally:
            context.close()
    return result
