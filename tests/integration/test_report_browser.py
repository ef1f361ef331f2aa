"""The report a person looks at: the Spark job's ``report.html`` opened in real headless Chromium.

The job's own tests read the HTML as text; this one checks what a reader would see. The input is a synthetic
decision log (:func:`spark_analysis.synthetic.generate`: a noisy tenant bursting over the live ``<default user>``
byte-rate quota) run through the job's command line with a local Spark master and ``--quotas`` set to that live
config, so every plot the report can draw is present: logged top offenders, usage vs quota, the logged throttle
heatmap, and the what-if replay's bar chart and heatmap. The page must load from ``file://`` with no request that
leaves the machine and no script or console error, every plot must decode and be painted on the page, and a
full-page screenshot is kept under the test's ``tmp_path``.
"""

from __future__ import annotations

import base64
import binascii
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.browser import BrowserMissing, PageVisit, require_chromium, visit

REPO = Path(__file__).resolve().parents[2]

SECTION_TOP = "Top offenders (logged decisions)"
SECTION_SERIES = "Usage vs quota over time"
SECTION_HEATMAP = "Throttle heatmap (logged)"
SECTION_WHATIF = "What-if replay of"  # followed by the --quotas path


def _job(tmp: Path) -> tuple[Path, dict[str, int]]:
    """Run ``python -m spark_analysis`` on a synthetic log; returns report.html and the plots it should hold.

    The expected plots are derived from the job's own Parquet output (who was throttled, in the log and in the
    replay), following ``spark_analysis/report.py``'s rules for when each plot is drawn.
    """
    try:
        import pyarrow.parquet as pq
        import pyspark  # noqa: F401 - the job below needs it; CI installs it, so its absence is a failure
    except ImportError as exc:
        pytest.fail(f"{exc.name} is missing: run scripts/setup --test (the spark extra)")

    from spark_analysis.synthetic import generate, live_config_yaml

    log_dir, out = tmp / "decisions", tmp / "out"
    info = generate(log_dir, 50_000, span_s=300, n_users=30, seed=3)
    quotas = tmp / "live.yaml"
    quotas.write_text(live_config_yaml(), encoding="utf-8")
    job_log = tmp / "job.log"
    with job_log.open("wb") as f:
        rc = subprocess.run(
            [
                sys.executable,
                "-m",
                "spark_analysis",
                str(log_dir),
                "--out",
                str(out),
                "--quotas",
                str(quotas),
                "--master",
                "local[2]",
                "--driver-memory",
                "1g",
                "--shuffle-partitions",
                "4",
            ],
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=480,
        ).returncode
    tail = "\n".join(job_log.read_text(errors="replace").splitlines()[-40:])
    assert rc == 0, f"python -m spark_analysis exited {rc} on {info['events']} synthetic events:\n{tail}"
    report = out / "report.html"
    assert report.is_file(), f"the job wrote no {report}:\n{tail}"

    logged = pq.read_table(out / "throttle_totals", columns=["throttle_ms"]).column("throttle_ms").to_pylist()
    replayed = pq.read_table(out / "whatif_summary", columns=["throttle_ms"]).column("throttle_ms").to_pylist()
    logged_throttled = any((v or 0) > 0 for v in logged)
    replay_throttled = any((v or 0) > 0 for v in replayed)
    # The point of this input is a report with every plot; if the generator stops throttling, say so here.
    assert logged_throttled and replay_throttled, (
        f"synthetic log throttled nobody (logged: {logged_throttled}, replayed: {replay_throttled}): "
        "the report would lack plots; adjust the generate() arguments"
    )
    expected = {SECTION_TOP: 1, SECTION_SERIES: 1, SECTION_HEATMAP: 1, SECTION_WHATIF: 2}
    return report, expected


def _section(heading: str | None) -> str | None:
    if heading and heading.startswith(SECTION_WHATIF):
        return SECTION_WHATIF
    return heading


def _png_problems(where: str, img: dict[str, Any]) -> list[str]:
    """The embedded PNG decoded a second time, by Pillow, which (unlike a browser) refuses a truncated file."""
    from PIL import Image

    prefix = "data:image/png;base64,"
    if not img["src"].startswith(prefix):
        return [f"{where} is not an embedded PNG (report.html should be self-contained)"]
    try:
        with Image.open(io.BytesIO(base64.b64decode(img["src"][len(prefix) :], validate=True))) as im:
            im.load()
            size = im.size
    except (OSError, ValueError, binascii.Error) as exc:
        return [f"{where}: its PNG does not decode in Pillow: {exc}"]
    if size != (img["naturalWidth"], img["naturalHeight"]):
        return [f"{where}: Pillow reads {size}, the browser {img['naturalWidth']}x{img['naturalHeight']}"]
    return []


def report_problems(page: PageVisit, expected_plots: dict[str, int]) -> list[str]:
    """Everything a reader would see wrong with the page; empty when it is fine.

    Collected rather than asserted one by one so a failure names every problem at once.
    """
    from PIL import Image

    problems: list[str] = []
    if page.external_requests:
        problems.append(f"requests that leave the machine: {page.external_requests}")
    if page.failed_requests:
        problems.append(f"failed requests: {page.failed_requests}")
    if page.page_errors:
        problems.append(f"uncaught script errors: {page.page_errors}")
    if page.console_errors:
        problems.append(f"console errors: {page.console_errors} (all console output: {page.console})")
    if page.title != "Decision log analysis":
        problems.append(f"page title is {page.title!r}, not the report's: did the page load?")

    got: dict[str | None, int] = {}
    for img in page.images:
        got[_section(img["section"])] = got.get(_section(img["section"]), 0) + 1
        where = f"plot {img['src'][:40]!r}... under {img['section']!r}"
        if img["decodeError"] or not img["complete"] or img["naturalWidth"] <= 0 or img["naturalHeight"] <= 0:
            problems.append(f"{where} did not decode: {img['decodeError'] or 'no pixels'}")
            continue
        if img["width"] < 100 or img["height"] < 50:
            problems.append(f"{where} is laid out at {img['width']}x{img['height']} px: not visible")
        # matplotlib's figures are opaque: a transparent last row is a PNG that arrived cut short.
        if img["canvasError"]:
            problems.append(f"{where}: its pixels cannot be read back ({img['canvasError']})")
        elif img["bottomOpaque"] < 0.99:
            problems.append(
                f"{where}: only {img['bottomOpaque']:.0%} of its bottom row is opaque in the browser: "
                "the PNG is truncated"
            )
        problems += _png_problems(where, img)
    if got != expected_plots:
        problems.append(f"plots per section: {got}, expected {expected_plots}")

    shot = page.screenshot
    if shot is None or not shot.is_file():
        problems.append(f"no screenshot at {shot}")
        return problems
    size_kb = shot.stat().st_size / 1024
    with Image.open(shot) as im:
        im.load()  # a truncated PNG raises here
        rgb = im.convert("RGB")
    colours = rgb.getcolors(maxcolors=4096)  # None: more than 4096 colours, i.e. plenty of content
    if size_kb < 50 or (colours is not None and len(colours) < 32):
        problems.append(
            f"screenshot {shot} looks blank: {size_kb:.0f} KB, "
            f"{len(colours) if colours else '>4096'} colours, {rgb.size[0]}x{rgb.size[1]} px"
        )
    if rgb.size[1] <= 900:
        problems.append(
            f"full-page screenshot is only {rgb.size[1]} px tall: the report should be longer than one screen"
        )
    # Each plot's box in the screenshot must hold a drawing, not a blank or single-colour rectangle.
    for img in page.images:
        box = (int(img["x"]), int(img["y"]), int(img["x"] + img["width"]), int(img["y"] + img["height"]))
        if box[2] > rgb.size[0] or box[3] > rgb.size[1] or box[2] <= box[0] or box[3] <= box[1]:
            problems.append(f"plot under {img['section']!r} at {box} is outside the {rgb.size} screenshot")
            continue
        painted = rgb.crop(box).getcolors(maxcolors=1 << 16)
        if painted is not None and len(painted) < 16:
            problems.append(f"plot under {img['section']!r} at {box} shows only {len(painted)} colours: not painted")
    return problems


def test_report_renders_in_a_real_browser(tmp_path):
    try:
        require_chromium()  # before the minute of Spark: a machine without the browser fails at once
    except BrowserMissing as exc:
        pytest.fail(str(exc))
    report, expected = _job(tmp_path)

    page = visit(report, tmp_path / "report.png", tmp_path / "chromium-profile")

    assert page.url.startswith("file://"), page.url
    assert page.requests and page.requests[0] == page.url, f"first request {page.requests[:1]}, not {page.url}"
    assert page.images, "the browser found no <img> in the report"
    problems = report_problems(page, expected)
    assert not problems, "report.html as Chromium shows it:\n  " + "\n  ".join(problems)
