"""The built docs site in headless Chromium (the ``browser`` fixture of tests/conftest.py),
served over HTTP on 127.0.0.1: every navigation entry opens its page under its own heading,
every link between pages and every picture resolves, and the search box finds pages."""

from __future__ import annotations

import functools
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from .test_build import mkdocs_config, nav_pages


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass


@pytest.fixture(scope="module")
def site_url(built_site) -> Iterator[str]:
    assert built_site.returncode == 0, built_site.log
    handler = functools.partial(_QuietHandler, directory=str(built_site.folder))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def pages(site_url: str, browser: Any) -> dict[str, dict[str, Any]]:
    """Each navigation entry of the home page, followed in the browser: what it showed."""
    from selenium.webdriver.common.by import By

    browser.get(site_url + "index.html")
    entries = browser.execute_script(
        "return Array.from(document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]'))"
        ".map(a => [a.href, a.textContent.trim()]);"
    )
    seen: dict[str, dict[str, Any]] = {}
    for href, label in entries:
        page = href.split("#")[0]
        if page in seen or not page.startswith(site_url):
            continue
        browser.get(page)
        seen[page] = {
            "label": label,
            "h1": [h.text for h in browser.find_elements(By.TAG_NAME, "h1")],
            "active": browser.execute_script(
                "const a = document.querySelector('nav.md-nav--primary .md-nav__link--active');"
                "return a ? a.textContent.trim() : null;"
            ),
            "links": browser.execute_script(
                "return Array.from(document.querySelectorAll('article a[href]')).map(a => a.href);"
            ),
            "broken_images": browser.execute_script(
                "return Array.from(document.images)"
                ".filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src);"
            ),
            "severe": [e for e in browser.get_log("browser") if e["level"] == "SEVERE"],
        }
    return seen


def test_every_nav_entry_opens_its_page_under_a_heading(pages, site_url) -> None:
    expected = [site_url + p.replace(".md", ".html") for p in nav_pages(mkdocs_config()["nav"])]
    assert sorted(pages) == sorted(expected)
    for url, shown in pages.items():
        assert len(shown["h1"]) == 1 and shown["h1"][0].strip(), f"{url}: {shown['h1']}"
        assert shown["active"] == shown["label"], f"{url} is not the active nav entry"
        assert shown["broken_images"] == [], url
        assert shown["severe"] == [], f"{url}: console errors {shown['severe']}"


def test_links_between_pages_resolve(pages, site_url) -> None:
    targets = {link.split("#")[0] for shown in pages.values() for link in shown["links"]}
    internal = sorted(t for t in targets if t.startswith(site_url))
    assert len(internal) > 30
    for target in internal:
        try:
            with urllib.request.urlopen(target, timeout=30) as answer:
                assert answer.status == 200, target
        except urllib.error.HTTPError as error:
            pytest.fail(f"{target}: {error}")


def test_the_search_box_finds_pages(site_url, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(site_url + "index.html")
    browser.find_element(By.CSS_SELECTOR, "label.md-search__icon, .md-search__input").click()
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.send_keys("bubblewrap")
    results = WebDriverWait(browser, 60).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, ".md-search-result__item a[href]")
    )
    hrefs = [r.get_attribute("href") for r in results]
    assert any("guides/sandboxes.html" in href for href in hrefs), hrefs
