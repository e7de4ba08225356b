"""The study report in a real browser: headless Chromium (Debian's ``chromium`` + ``chromium-driver``) via Selenium.

Every figure must load (``naturalWidth > 0``), every table must render rows, the console must stay free of errors,
and every resource must come from the report's own directory (the report works offline). Skipped where Chromium, its
driver or Selenium is absent; ``.ci/run`` installs them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from test_study import _quiet, tiny_study_toml

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
DRIVER = shutil.which("chromedriver")

REQUIRED = os.environ.get("AXIOMFORMER_REQUIRE_BROWSER") == "1"
"""Set by ``.ci/run``: there a missing browser, driver or Selenium is a failure, not a skip."""

pytestmark = pytest.mark.skipif(
    not REQUIRED and (CHROMIUM is None or DRIVER is None), reason="headless Chromium or chromedriver absent"
)

INSPECT = """
const images = Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth]);
const tables = Array.from(document.querySelectorAll('table')).map(t => [t.tBodies.length ? t.tBodies[0].rows.length : 0,
                                                                       t.getBoundingClientRect().height]);
const resources = performance.getEntriesByType('resource').map(r => r.name);
return {images: images, tables: tables, resources: resources};
"""


@pytest.fixture(scope="module")
def browser():
    if REQUIRED:
        assert CHROMIUM and DRIVER, "AXIOMFORMER_REQUIRE_BROWSER=1 but chromium or chromedriver is not installed"
        from selenium import webdriver
    else:
        webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,2000",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    yield driver
    driver.quit()


def inspect_page(driver, page: Path) -> dict:
    """Open ``page`` and list its problems: broken images, empty tables, console errors, resources from elsewhere."""
    driver.get(page.resolve().as_uri())
    found = driver.execute_script(INSPECT)
    folder = page.resolve().parent.as_uri() + "/"
    return {
        "images": found["images"],
        "tables": found["tables"],
        "broken_images": [src for src, complete, width in found["images"] if not complete or width == 0],
        "empty_tables": [i for i, (rows, height) in enumerate(found["tables"]) if rows == 0 or height <= 0],
        "console_errors": [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"],
        "foreign_resources": [name for name in found["resources"] if not name.startswith(folder)],
    }


@pytest.mark.slow
def test_study_report_renders_in_chromium(browser, tmp_path):
    from axiomformer.study import load_config, run_study

    config = tmp_path / "tiny.toml"
    config.write_text(tiny_study_toml())
    out = tmp_path / "study"
    run_study(load_config(config), out, progress=False, console=_quiet())
    report = out / "report.html"

    seen = inspect_page(browser, report)
    figures = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert figures and sorted(Path(src).name for src, _, _ in seen["images"]) == figures
    assert seen["tables"] and not seen["empty_tables"]
    assert not seen["broken_images"] and not seen["console_errors"] and not seen["foreign_resources"], seen
    browser.save_screenshot(str(out / "report.png"))
    assert (out / "report.png").stat().st_size > 0

    # The same inspection catches a broken figure, an empty table, a console error and a remote script.
    planted = out / "planted.html"
    planted.write_text(
        report.read_text().replace(
            "</body>",
            (
                '<img src="figures/missing.png"><table><tbody></tbody></table>'
                "<script>console.error('planted')</script>"
                '<script src="https://cdn.example.invalid/lib.js"></script></body>'
            ),
        )
    )
    caught = inspect_page(browser, planted)
    assert caught["broken_images"] == ["figures/missing.png"]
    assert caught["empty_tables"] == [len(seen["tables"])]
    assert any("planted" in message for message in caught["console_errors"])
    assert any(name.startswith("https://cdn.example.invalid") for name in caught["foreign_resources"])
