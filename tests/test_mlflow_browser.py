"""What the CLI logs, browsed in MLflow's own web UI with a real Chromium (Playwright).

Each test runs ``pipelines/abide_fedbn.py`` into a fresh sqlite store, serves that store
with ``mlflow server`` on 127.0.0.1 and clicks through the UI as a user would. Chromium
comes from the system (Debian: ``apt-get install chromium``); Playwright's own browser
download is not used. Without either the tests skip and say what to install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.mlflow_ui import mlflow_server
from tests.stores import sqlite_store

pytestmark = pytest.mark.integration

PIPELINE = Path(__file__).resolve().parent.parent / "pipelines" / "abide_fedbn.py"
EXPERIMENT = "abide-fedbn"
SITES = ("NYU", "UM", "USM", "UCLA")
ROUNDS = 2
# The UI renders client-side; on a busy 2-core machine a page can take a while.
UI_WAIT_MS = 30_000
INSTALL_HINT = ("this test needs Playwright (`pip install -e .[test]`) and a system Chromium "
                "(`apt-get install -y chromium`; `playwright install` is not used)")


def _find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright import sync_api
    except ImportError as exc:
        pytest.skip(f"Playwright cannot be imported ({exc}); {INSTALL_HINT}")
    executable = _find_chromium()
    if executable is None:
        pytest.skip(f"no chromium on PATH; {INSTALL_HINT}")
    driver = sync_api.sync_playwright().start()
    try:
        try:
            # Playwright already turns Chromium's sandbox off (it refuses to run as root, as
            # in CI); a small /dev/shm in containers would crash its renderers.
            launched = driver.chromium.launch(
                executable_path=executable, args=["--disable-dev-shm-usage"])
        except sync_api.Error as exc:
            first_line = str(exc).strip().splitlines()[0]
            pytest.skip(f"chromium at {executable} did not start under Playwright "
                        f"({first_line}); {INSTALL_HINT}")
        try:
            yield launched
        finally:
            launched.close()
    finally:
        driver.stop()


@pytest.fixture()
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    tab = context.new_page()
    tab.set_default_timeout(UI_WAIT_MS)
    # expect() has a timeout of its own (5 s unless set): the same wait for its checks
    from playwright.sync_api import expect

    expect.set_options(timeout=UI_WAIT_MS)
    try:
        yield tab
    finally:
        # Kept next to the store, so a failure can be looked at afterwards; only an aid,
        # so a page that can no longer be captured must not turn into a teardown error.
        try:
            tab.screenshot(path=str(tmp_path / "last-page.png"))
        except Exception:  # noqa: BLE001
            pass
        context.close()


def _cli_has(option: str) -> bool:
    """Tell whether the CLI's ``--help`` lists ``option`` (options are still being added)."""
    from fedbn_med.cli import build_parser

    return option in build_parser().format_help()


def _log_run(store: Path, data_dir: Path, workdir: Path, *options: str) -> str:
    """Run the real CLI (in-process engine, two rounds) into the sqlite ``store``; return
    what it printed."""
    env = {**os.environ, "FEDBN_MED_DATA": str(workdir / "data"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(PIPELINE), "--engine", "inprocess", "--rounds", str(ROUNDS),
           "--tracking-uri", sqlite_store(store), "--data-dir", str(data_dir),
           "--workdir", str(workdir / "work"), "--quiet", *options]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}"
    return done.stdout


def _printed_page(printed: str, base: str) -> str:
    """Return the MLflow address the CLI printed, on the test's server."""
    found = re.search(r"then open http://127\.0\.0\.1:\d+(/#/experiments/\S+)", printed)
    assert found, f"the CLI printed no MLflow address:\n{printed[-1500:]}"
    return base + found.group(1)


def _open_runs_table(page: Any, base: str, printed: str) -> None:
    """Open the address the CLI printed, as a user would: it shows the runs at once."""
    from playwright.sync_api import expect

    page.goto(_printed_page(printed, base))
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
    expect(page.get_by_text("Traces", exact=True).first).to_be_visible()  # the side bar
    expect(page.get_by_text("Detect Issues")).to_have_count(0)  # not the GenAI overview


def _run_row(page: Any, run_name: str) -> Any:
    """Return the one runs-table row whose run-name link reads ``run_name``."""
    from playwright.sync_api import expect

    row = page.get_by_role("row").filter(
        has=page.get_by_role("link", name=_named(run_name)))
    expect(row).to_have_count(1)
    return row


def _named(label: str) -> re.Pattern[str]:
    """Match a federation run's name: ``fedbn · NYU,UM,USM,UCLA · inprocess · <time>``."""
    return re.compile(rf"^{re.escape(label)} · ")


def _table_row(page: Any, header: str) -> list[str]:
    """Return the cells beside row header ``header`` in the compare view's tables."""
    from playwright.sync_api import expect

    row = page.get_by_role("row").filter(
        has=page.get_by_role("rowheader", name=header, exact=True))
    expect(row).to_be_visible()
    return [text.strip() for text in row.get_by_role("cell").all_inner_texts()]


def test_parent_site_runs_and_round_chart_are_browsable(page, small_cohort, tmp_path):
    from playwright.sync_api import expect

    store = tmp_path / "mlflow.db"
    printed = _log_run(store, small_cohort, tmp_path)
    with mlflow_server(store, tmp_path / "artifacts") as base:
        _open_runs_table(page, base, printed)
        parent = _run_row(page, "fedbn")
        site_links = page.get_by_role("link", name=re.compile(r"^site-"))
        expect(site_links).to_have_count(0)  # folded under their parent until expanded
        parent.get_by_role("button").first.click()  # the row's expand toggle
        expect(site_links).to_have_count(len(SITES))
        for site in SITES:
            expect(page.get_by_role("link", name=f"site-{site}", exact=True)).to_be_visible()

        page.get_by_role("link", name="site-NYU", exact=True).click()
        expect(page.get_by_role("heading", name="site-NYU", exact=True)).to_be_visible()
        expect(page.get_by_role("link", name=_named("fedbn"))).to_be_visible()  # parent run
        page.get_by_role("tab", name="Model metrics").click()
        card = page.get_by_test_id("experiment-view-compare-runs-card").filter(
            has=page.get_by_role("heading", name="test_accuracy", exact=True))
        expect(card).to_have_count(1)
        expect(card.locator("svg.main-svg").first).to_be_visible()
        expect(card.get_by_text("Step", exact=True)).to_be_visible()  # x axis: the round
        expect(card.get_by_text("site-NYU (test_accuracy)")).to_be_visible()
        expect(card.locator(".scatterlayer .point")).to_have_count(ROUNDS)  # one per round

        # The parent run's headline is the console's: the selected round's site mean.
        console_mean = next(line for line in printed.splitlines() if line.startswith("| mean |"))
        accuracy = float(console_mean.split("|")[3].split()[0])  # "54.2" or "54.2 [..]"
        page.goto(_printed_page(printed, base))
        page.get_by_role("link", name=_named("fedbn")).click()
        headline = page.get_by_role("row").filter(
            has=page.get_by_text("mean_test_accuracy", exact=True))
        expect(headline).to_have_count(1)
        shown = float(headline.inner_text().split()[-1])
        assert round(100 * shown, 1) == accuracy, (shown, console_mean)


def test_compare_view_shows_strategies_side_by_side(page, small_cohort, tmp_path):
    from playwright.sync_api import expect

    store = tmp_path / "mlflow.db"
    options = ["--compare", "fedavg,fedbn", "--folds", "1"]
    if _cli_has("--seeds"):
        options += ["--seeds", "1"]
    printed = _log_run(store, small_cohort, tmp_path, *options)
    with mlflow_server(store, tmp_path / "artifacts") as base:
        _open_runs_table(page, base, printed)
        for name in ("fedavg", "fedbn"):
            _run_row(page, name).get_by_role(
                "checkbox", name=re.compile("row selection")).check()
        page.get_by_role("button", name="Compare", exact=True).click()
        expect(page.get_by_role("heading", name=re.compile(r"Comparing 2 Runs"))).to_be_visible()

        names = _table_row(page, "Run Name:")
        assert sorted(name.split(" · ")[0] for name in names) == ["fedavg", "fedbn"]
        # The same columns, in the same order, hold each run's strategy parameter.
        assert _table_row(page, "strategy") == [name.split(" · ")[0] for name in names]
        assert _table_row(page, "rounds") == [str(ROUNDS)] * 2

        page.get_by_role("switch", name="Parameters - Show diff only").click()
        expect(page.get_by_role("rowheader", name="rounds", exact=True)).to_have_count(0)
        assert _table_row(page, "strategy") == [name.split(" · ")[0] for name in names]
