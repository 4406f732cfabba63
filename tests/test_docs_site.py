"""The documentation site builds, and the README stays short.

``mkdocs build --strict`` (mkdocs.yml at the repository root) turns every warning into an
error: a broken link or image, a nav entry without its page, a module the API reference
names that griffe cannot read. The site must hold the home page, the agents' pages and the
figures that ``docs/figures`` (a link to ``results/figures``) brings in. The README keeps
its results summary near the top, so a reader sees the figures before the reference.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MINATAR_MARKER = "<!-- minatar-summary:begin -->"  # benchmarks/report.py SUMMARY_BEGIN
README_MAX_LINES = 250
RESULTS_WITHIN = 100  # the results summary starts within the README's first lines

# what the build needs: mkdocs, the material theme, mkdocstrings with its python handler
DOCS_PACKAGES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def missing_docs_packages() -> list[str]:
    missing = []
    for name in DOCS_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = missing_docs_packages()
    if missing:
        pytest.fail(f"the documentation build needs {', '.join(missing)}, which do not "
                    "import: install them with pip install --no-build-isolation -e "
                    "\".[docs]\" (the test extra includes it)", pytrace=False)
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, (
        f"mkdocs build --strict failed (exit {build.returncode}):\n"
        f"{build.stdout[-4000:]}\n{build.stderr[-6000:]}")
    return out


def test_the_site_builds_strictly_with_its_pages(site: Path) -> None:
    home = site / "index.html"
    assert home.is_file(), "the built site has no home page"
    for agent in ("impala", "apex", "r2d2", "seed"):
        page = site / "agents" / agent / "index.html"
        assert page.is_file(), f"the built site has no page for {agent}"
    api = (site / "api" / "agents" / "index.html").read_text()
    assert "ImpalaConfig" in api, "the API reference does not document agents.impala"


def test_the_figures_are_in_the_site_and_the_pages_show_them(site: Path) -> None:
    figure = site / "figures" / "minatar.png"
    assert figure.is_file() and figure.stat().st_size > 0, (
        "results/figures/minatar.png did not reach the site (docs/figures links to it)")
    home = (site / "index.html").read_text()
    shown = re.findall(r'<img[^>]+src="([^"]+\.png)"', home)
    assert "figures/minatar.png" in shown, f"the home page shows no MinAtar figure: {shown}"
    for src in shown:
        assert (site / src).is_file(), f"the home page shows {src}, which the site lacks"


def test_readme_is_short_and_starts_with_its_results() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: the reference "
        "belongs in docs/")
    marker = [i for i, line in enumerate(lines, 1) if line.strip() == MINATAR_MARKER]
    assert marker, f"README.md lacks {MINATAR_MARKER} (benchmarks/report.py writes there)"
    assert marker[0] <= RESULTS_WITHIN, (
        f"README.md's results summary ({MINATAR_MARKER}) starts on line {marker[0]}, "
        f"after its first {RESULTS_WITHIN}")


def test_readme_links_into_docs_name_existing_files() -> None:
    """README's links into the site point at the markdown files, so they work on GitHub."""
    links = re.findall(r"\]\((docs/[^)#\s]*)", README.read_text())
    assert links, "README.md links to no page of docs/"
    for link in links:
        assert (ROOT / link).exists(), f"README.md links to {link}, which does not exist"
        assert link.endswith(".md"), f"README.md links to {link}, not a markdown file"
