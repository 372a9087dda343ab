"""Drive the running UI in a real browser (Playwright with the system's Chromium): start
`rackplan ui` on a free port, run a what-if simulation of DeepSeek-V4-Flash on AgentX sessions,
a small search over two loads, and the deploy page for each Kubernetes flavor; read what the
page shows (and whether the results are in the first viewport after a run), and take
screenshots. Used by tests/app/test_browser.py and by `python -m app.screenshots`.

Chromium is the distribution's (`apt-get install chromium`), found on PATH or named by
$RACKPLAN_CHROMIUM; Playwright's own browser downloads are never used.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Browser, FloatRect, Locator, Page, ViewportSize, sync_playwright

CHROMIUM_VAR = "RACKPLAN_CHROMIUM"
CHROMIUM_NAMES = ("chromium", "chromium-browser")
VIEWPORT: ViewportSize = {"width": 1400, "height": 1000}
START_TIMEOUT_S = 90.0
RUN_TIMEOUT_MS = 240_000


def chromium() -> str | None:
    """The Chromium executable: $RACKPLAN_CHROMIUM, else chromium on PATH; None when absent."""
    given = os.environ.get(CHROMIUM_VAR)
    if given:
        return given if Path(given).is_file() else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def free_port() -> int:
    """A TCP port nothing listens on now, on localhost."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def serve(cwd: Path, port: int | None = None) -> Iterator[str]:
    """`rackplan ui` running in `cwd` (where its runs/ folder goes) until the block ends;
    yields its URL. The server and its children are stopped as one process group."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(cwd / "ui.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "ui", "--port", str(port)],
                            cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = (cwd / "ui.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"rackplan ui did not come up on {url}:\n{tail}")
            time.sleep(0.5)
        yield url
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@contextmanager
def browser(executable: str) -> Iterator[Browser]:
    """Headless Chromium from `executable`."""
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True)
        try:
            yield b
        finally:
            b.close()


def settle(page: Page, timeout_ms: int = RUN_TIMEOUT_MS) -> None:
    """Wait until the app's script has run to its end."""
    page.wait_for_timeout(400)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]',
                           timeout=timeout_ms)


def number(page: Page, label: str, value: float) -> None:
    """Type a value into the number input with this label and commit it."""
    box = page.get_by_label(label, exact=True)
    box.fill(str(value))
    box.press("Enter")
    settle(page)


def choose_option(page: Page, label: str, option: str) -> None:
    """Pick `option` in the select box labelled `label`."""
    page.locator('[data-testid="stSelectbox"]').filter(has_text=label).click()
    page.get_by_role("option", name=option, exact=True).click()
    settle(page)


def in_view(page: Page, element: Locator) -> bool:
    """Whether the element lies wholly within the first viewport (the page not scrolled)."""
    box = element.first.bounding_box()
    size = page.viewport_size or VIEWPORT
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= size["height"]


def choose_radio(page: Page, group: str, option: str) -> None:
    """Pick `option` in the radio group labelled `group`."""
    radios = page.locator('[data-testid="stRadio"]').filter(has_text=group)
    radios.get_by_text(option, exact=True).click()
    settle(page)


@dataclass
class Seen:
    """What the browser saw, and the screenshots it took."""

    cards: dict[str, str] = field(default_factory=dict)
    charts: int = 0
    whatif_in_view: bool = False
    """The what-if results' heading and first metric card lay in the first viewport."""
    chosen: str = ""
    search_in_view: bool = False
    """The search's heading of results and its chosen plan lay in the first viewport."""
    search_charts: int = 0
    tables: int = 0
    reasons: str = ""
    manifests: dict[str, str] = field(default_factory=dict)
    """Kubernetes flavor -> the text of its manifests on the deploy page (collapsed ones too)."""
    zip_button: bool = False
    screenshots: dict[str, Path] = field(default_factory=dict)


def _text_when_filled(page: Page, locator: Locator, seconds: float = 15.0) -> str:
    """The locator's text once it has any, waiting up to `seconds` (empty if it never does)."""
    text = ""
    for _ in range(int(seconds / 0.1)):
        text = locator.text_content() or ""
        if text.strip():
            break
        page.wait_for_timeout(100)
    return text


def _shot(page: Page, seen: Seen, out: Path, name: str, top: Locator,
          bottom: Locator | None = None) -> None:
    """Screenshot from the top of `top` to the bottom of `bottom` (default: of `top`). The
    viewport grows to the page's whole height first, since Streamlit scrolls inside the page
    and a screenshot holds only what is on screen."""
    out.mkdir(parents=True, exist_ok=True)
    height = page.evaluate("() => Math.max(...Array.from(document.querySelectorAll("
                           "'[data-testid=stMain], [data-testid=stMainBlockContainer]'), "
                           "e => e.scrollHeight))")
    page.set_viewport_size({"width": VIEWPORT["width"], "height": int(height) + 100})
    page.wait_for_timeout(600)
    a, b = top.first.bounding_box(), (bottom or top).first.bounding_box()
    body = page.locator('[data-testid="stMainBlockContainer"]').bounding_box()
    if a is None or b is None or body is None:
        raise RuntimeError(f"screenshot {name}: the element to frame is not visible")
    path = out / f"{name}.png"
    clip: FloatRect = {"x": max(body["x"] - 16, 0), "y": max(a["y"] - 16, 0),
            "width": body["width"] + 32, "height": b["y"] + b["height"] - a["y"] + 32}
    page.screenshot(path=str(path), clip=clip)
    page.set_viewport_size(VIEWPORT)
    seen.screenshots[name] = path


def what_if(page: Page, url: str, out: Path, seen: Seen, requests: int = 200) -> None:
    """Run the DeepSeek-V4-Flash P/D example on AgentX session traffic (enough measured turns
    for later turn depths to show)."""
    page.goto(url)
    page.get_by_role("heading", name="What-if").wait_for()
    settle(page)
    choose_option(page, "Start from an example deployment", "deepseek-v4-flash-gb300-pd")
    choose_radio(page, "Traffic", "agentx")
    number(page, "Requests", requests)
    page.get_by_role("button", name="Run simulation").click()
    page.get_by_text("Throughput / GPU").first.wait_for(timeout=RUN_TIMEOUT_MS)
    settle(page)
    results = page.get_by_role("heading", name="Results")
    metrics = page.locator('[data-testid="stMetric"]')
    seen.whatif_in_view = in_view(page, results) and in_view(page, metrics)
    for metric in metrics.all():
        label = metric.locator('[data-testid="stMetricLabel"]').inner_text().strip()
        seen.cards[label] = metric.locator('[data-testid="stMetricValue"]').inner_text().strip()
    page.locator(".js-plotly-plot").first.wait_for()
    seen.charts = page.locator(".js-plotly-plot").count()
    tabs = page.locator('[data-testid="stTabs"]').last
    _shot(page, seen, out, "whatif", results, tabs)
    for tab in ("Timelines", "Prefix cache", "Step time", "Experts"):
        tabs.get_by_role("tab", name=tab).click()
        page.wait_for_timeout(800)
        _shot(page, seen, out, "whatif-" + tab.lower().replace(" ", "-"), tabs)


def search(page: Page, out: Path, seen: Seen, trials: int = 12, requests: int = 200,
           loads: str = "64,256") -> None:
    """Run a small Pareto search from the Search page (the CLI's default model, hardware and
    AgentX traffic, TTFT SLO only, no refinement rounds) over two loads, so that the load
    curves are drawn."""
    page.get_by_role("link", name="Search").click()
    page.get_by_role("heading", name="Search").wait_for()
    settle(page)
    number(page, "Requests", requests)
    number(page, "tok/s/user p90 at least (0: none)", 0)
    number(page, "Trials", trials)
    number(page, "Refinement rounds", 0)  # the trials alone: each simulation here takes seconds
    box = page.get_by_label(re.compile("^Search the load too"))
    box.fill(loads)
    box.press("Enter")
    settle(page)
    choose_radio(page, "Objective", "pareto")
    page.get_by_role("button", name="Run search").click()
    alerts = page.locator('[data-testid="stAlert"]')
    done = alerts.filter(has_text="Chosen plan (trial")
    done.or_(alerts.filter(has_text="No plan met the SLOs")).first.wait_for(
        timeout=RUN_TIMEOUT_MS)
    settle(page)
    seen.chosen = (done.first.locator('[data-testid="stMarkdownContainer"]').inner_text()
                   .strip() if done.count() else "")
    results = page.get_by_role("heading", name="Results")
    seen.search_in_view = in_view(page, results) and in_view(page, alerts)
    seen.search_charts = page.locator(".js-plotly-plot").count()
    why = page.locator('[data-testid="stExpander"]').filter(
        has_text="Why the other trials did not become the plan")
    if why.count():
        why.first.locator("summary").click()
        page.wait_for_timeout(500)
    reasons = (why.first if why.count() else page).locator('[data-testid="stDataFrame"]').first
    reasons.wait_for()
    # the grid draws on a canvas; its text is in the accessible table beside it, which a
    # loaded machine may fill a while after the expander opens
    seen.reasons = _text_when_filled(page, reasons)
    seen.tables = page.locator('[data-testid="stDataFrame"]').count()
    _shot(page, seen, out, "search", results,
          page.locator('[data-testid="stMainBlockContainer"]'))


def deploy(page: Page, out: Path, seen: Seen, flavors: tuple[str, ...] = (
        "llm-d", "dynamo", "kserve")) -> None:
    """Open the Deploy page with the plan the search chose, as each Kubernetes flavor's
    manifests (the screenshot shows the first flavor)."""
    page.get_by_role("link", name="Deploy").click()
    page.get_by_role("heading", name="Deploy").wait_for()
    settle(page)
    choose_option(page, "Target", "kubernetes")
    codes = page.locator('[data-testid="stCode"]')
    before = ""
    for n, flavor in enumerate(flavors):
        if n:
            choose_option(page, "Flavor", flavor)
        codes.first.wait_for()
        seen.manifests[flavor] = before = _new_text(page, codes, before)
        if n == 0:
            seen.zip_button = page.get_by_role(
                "button", name=re.compile("Download the folder")).count() == 1
            _shot(page, seen, out, "deploy", page.get_by_role("heading", name="Deploy"),
                  page.locator('[data-testid="stMainBlockContainer"]'))


def _new_text(page: Page, codes: Locator, before: str,
              timeout_ms: int = RUN_TIMEOUT_MS) -> str:
    """The code blocks' text once it is no longer `before` (the previous flavor's): on a
    loaded machine the rerun a selection starts may begin after `settle` has looked."""
    def text() -> str:
        return "\n".join(c.text_content() or "" for c in codes.all())

    waited = 0
    while text() == before and waited < timeout_ms:
        page.wait_for_timeout(200)
        waited += 200
        if waited % 2000 == 0:
            settle(page)
    settle(page)  # the rerun drawn to its end
    return text()


def tour(url: str, executable: str, out: Path) -> Seen:
    """What-if, then search, then deploy, in one browser session."""
    seen = Seen()
    with browser(executable) as b:
        page = b.new_page(viewport=VIEWPORT)
        page.set_default_timeout(60_000)
        what_if(page, url, out, seen)
        search(page, out, seen)
        deploy(page, out, seen)
    return seen
