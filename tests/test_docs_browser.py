"""The docs site in a real browser: math typeset (MathML built at build time), nothing fetched from elsewhere.

Builds the pages with math (the two sources, derive) with the site's own theme, Markdown extensions and hooks, opens
them in headless Chromium and checks that every formula is laid out as mathematics (a fraction's numerator above its
denominator), that no raw LaTeX is left in the text, that the console stays free of errors and that every resource
comes from the site itself (the site works offline). Skipped where Chromium, its driver, Selenium or MkDocs is absent;
``.ci/run`` installs them and requires the test to run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from test_report_browser import CHROMIUM, DRIVER, REQUIRED, browser  # noqa: F401 - the fixture is shared

ROOT = Path(__file__).resolve().parent.parent
MATH_PAGES = ("SOURCES.md", "derive.md")

pytestmark = pytest.mark.skipif(
    not REQUIRED and (CHROMIUM is None or DRIVER is None), reason="headless Chromium or chromedriver absent"
)

INSPECT_MATH = """
const maths = Array.from(document.querySelectorAll('math'));
const boxes = maths.map(m => { const r = m.getBoundingClientRect(); return [r.width, r.height]; });
const fractions = Array.from(document.querySelectorAll('mfrac')).map(f => {
  const [num, den] = Array.from(f.children).map(c => c.getBoundingClientRect());
  return [num.bottom, den.top, num.height, den.height];
});
const text = document.querySelector('article') ? document.querySelector('article').innerText : document.body.innerText;
const resources = performance.getEntriesByType('resource').map(r => r.name);
return {count: maths.length, boxes: boxes, fractions: fractions, text: text, resources: resources};
"""

RAW_LATEX = ("$$", "\\frac", "\\sum", "\\mathrm", "\\sqrt")


def build_math_pages(out: Path) -> Path:
    """The math pages built with mkdocs.yml's theme, extensions and hooks (other pages and plugins left out)."""
    import yaml
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    docs = out / "docs"
    docs.mkdir(parents=True)
    for name in MATH_PAGES:
        shutil.copy(ROOT / "docs" / name, docs / name)
    raw = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config = {key: raw[key] for key in ("site_name", "theme", "markdown_extensions", "use_directory_urls")}
    config.update(
        docs_dir=str(docs),
        site_dir=str(out / "site"),
        nav=list(MATH_PAGES),
        plugins=[],
        hooks=[str(ROOT / "tools" / "docs_hooks.py")],
        validation={"links": {"not_found": "ignore", "unrecognized_links": "ignore"}},
    )
    (out / "mkdocs.yml").write_text(yaml.safe_dump(config))
    build(load_config(str(out / "mkdocs.yml")))
    return out / "site"


def inspect_math(driver, page: Path) -> dict:
    driver.get(page.resolve().as_uri())
    found = driver.execute_script(INSPECT_MATH)
    site = page.resolve().parent.as_uri() + "/"
    found["raw_latex"] = [token for token in RAW_LATEX if token in found["text"]]
    found["flat_fractions"] = [f for f in found["fractions"] if not (f[0] <= f[1] + 1 and f[2] > 0 and f[3] > 0)]
    found["empty_math"] = [b for b in found["boxes"] if b[0] <= 0 or b[1] <= 0]
    found["console_errors"] = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    found["foreign_resources"] = [name for name in found["resources"] if not name.startswith(site.rsplit("/", 2)[0])]
    return found


@pytest.mark.slow
def test_docs_math_is_typeset_offline_in_chromium(browser, tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("latex2mathml")
    site = build_math_pages(tmp_path)
    for name in MATH_PAGES:
        seen = inspect_math(browser, site / name.replace(".md", ".html"))
        assert seen["count"] >= 5 and seen["fractions"], (name, seen["count"])
        assert not seen["raw_latex"] and not seen["flat_fractions"] and not seen["empty_math"], (name, seen)
        assert not seen["console_errors"] and not seen["foreign_resources"], (name, seen)

    # The same inspection catches LaTeX left raw, and a formula that is not laid out as mathematics.
    page = site / "SOURCES.html"
    planted = page.with_name("planted.html")
    planted.write_text(
        page.read_text().replace(
            "</article>",
            (
                "<p>$$ y = \\frac{a}{b} $$</p><math><mfrac><mrow style='display:block'><mi>a</mi></mrow>"
                "<mrow style='position:relative; top:-3em'><mi>b</mi></mrow></mfrac></math></article>"
            ),
        )
    )
    caught = inspect_math(browser, planted)
    assert "$$" in caught["raw_latex"] and "\\frac" in caught["raw_latex"]
    assert caught["flat_fractions"], caught["fractions"]
