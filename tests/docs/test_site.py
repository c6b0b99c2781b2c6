"""The built documentation site works opened from disk, in a real browser.

The site is built by ``bash docs/build.sh`` (``.ci/run`` runs this test after
it); these tests build nothing and skip, saying so, when it was not built.
The browser is the system's Chromium (the Debian package ``chromium``),
driven headless by Playwright: the site is opened as ``file://.../index.html``,
as the README says, and followed through its navigation, its search and its
assets, without a server and without a network.
"""

from __future__ import annotations

import html.parser
import importlib.util
import os
import pathlib
import shutil
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SITE = ROOT / "docs" / "_build" / "html"
CHROMIUM = os.environ.get("VLCC_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
#: The flags the browser runs with: headless, and nothing it would fetch for itself.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

pytestmark = pytest.mark.skipif(
    not (SITE / "index.html").is_file(),
    reason="the documentation site is not built: run bash docs/build.sh (needs the "
    '"docs" extra: pip install -e ".[docs]")',
)


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("href", "src"):
            if tag in ("a", "link", "script", "img") and attrs.get(name):
                self.links.append(attrs[name])


def _local_links(page: pathlib.Path):
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    for link in parser.links:
        parts = urllib.parse.urlsplit(link)
        if parts.scheme or parts.netloc or link.startswith(("#", "mailto:")):
            continue
        yield link, (page.parent / urllib.parse.unquote(parts.path)).resolve()


def test_every_link_of_the_site_names_a_file_not_a_folder():
    # From file://, a link to a folder shows the folder's listing, not its index.html.
    pages = sorted(p for p in SITE.rglob("*.html") if p.name != "404.html")  # served only
    assert len(pages) > 10
    bad = []
    for page in pages:
        for link, target in _local_links(page):
            if not target.is_file():
                bad.append(f"{page.relative_to(SITE)}: {link}")
    assert not bad, bad[:20]


def test_nothing_is_fetched_from_the_network():
    # Opened from disk, possibly offline: fonts and scripts come with the site.
    external = []
    for page in (SITE / "index.html", SITE / "getting-started.html"):
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        external += [
            link for link in parser.links if link.startswith(("http://", "https://", "//"))
        ]
    assert not [u for u in external if "unpkg" in u or "fonts.g" in u], external
    assert (SITE / "search" / "search_index.js").is_file()  # the index, as a script


@pytest.fixture(scope="module")
def browser():
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("needs Playwright: pip install playwright")
    if not os.path.isfile(CHROMIUM):
        pytest.skip(f"needs Chromium at {CHROMIUM}: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context()
    page = context.new_page()
    page.problems = []
    page.on("pageerror", lambda error: page.problems.append(f"script error: {error}"))
    page.on(
        "requestfailed",
        lambda request: page.problems.append(f"failed: {request.url} ({request.failure})"),
    )
    page.on(
        "request",
        lambda request: (
            request.url.startswith(("http:", "https:"))
            and page.problems.append(f"network request: {request.url}")
        ),
    )
    yield page
    context.close()


def test_the_site_opened_from_disk_navigates_to_a_page(page):
    page.goto((SITE / "index.html").as_uri())
    assert page.locator("h1").first.inner_text().strip()
    page.locator("nav.md-nav--primary a", has_text="Getting started").first.click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/getting-started.html"), page.url
    heading = page.locator("article h1").first.inner_text()
    assert heading.strip().startswith("Getting started"), heading
    assert "Index of" not in page.content()  # not a folder listing
    # The theme's stylesheet and scripts loaded: the header is laid out, JS ran.
    assert page.locator("html.js").count() == 1
    assert page.locator("header.md-header").first.bounding_box()["height"] > 20
    assert not page.problems, page.problems


def test_the_search_works_opened_from_disk(page):
    page.goto((SITE / "getting-started.html").as_uri())
    page.locator("label.md-search__icon, .md-search__input").first.click()
    page.locator("input.md-search__input").press_sequentially("Revolve", delay=20)  # keys
    results = page.locator(".md-search-result__item")
    results.first.wait_for(timeout=20_000)
    assert results.count() > 0
    results.first.locator("a").first.click()
    page.wait_for_load_state("load")
    assert page.url.startswith("file://") and ".html" in page.url, page.url
    assert not page.problems, page.problems
