"""``envhub catalog`` on the local Hub server, through the real ``huggingface_hub`` client: three
packages pushed with their checks (a single-turn env with a leaderboard result, a tool env, a
multi-turn env); the page's embedded document, then the page in headless Chromium (search,
filters, an opened package, the copy button)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ALICE, BOB
from hub_server import HubServer
from index_server import IndexServer
from test_results import result_of
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.hub import push
from envhub.hub.result_push import push_result
from envhub.hub.results import read_results
from envhub.hub.trajectories import push_trajectories
from envhub.scaffold import create_package

PACKAGES = {  # repo -> (template, token)
    "alice/capital-cities": ("single-turn", ALICE),
    "bob/stock-lookup": ("tool", BOB),
    "alice/word-game": ("multi-turn", ALICE),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The three packages pushed (checked, their own tests left out), a result of
    alice/capital-cities pushed, and the page ``envhub catalog`` wrote: (page, CLI output)."""
    tmp = tmp_path_factory.mktemp("catalog")
    server = HubServer({"alice": ALICE, "bob": BOB}).start()
    index = IndexServer().start()  # push asks pip's index about each name: this one, not PyPI
    modules = {name.split("/")[1].replace("-", "_") for name in PACKAGES}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_ENDPOINT", server.url)
        patch.setenv("PIP_INDEX_URL", f"{index.url}/simple")
        patch.setenv("HF_HOME", str(tmp / "hf-home"))
        patch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        patch.setenv("ENVHUB_CACHE", str(tmp / "envhub-cache"))
        patch.delenv("HF_TOKEN", raising=False)
        patch.chdir(tmp)
        try:
            pushed = {
                repo: push(create_package(repo.split("/")[1], template, tmp / "src"),
                           token=token, run_tests=False)
                for repo, (template, token) in PACKAGES.items()
            }  # fmt: skip
            solve = sys.modules["capital_cities.env"].solve
            commit = pushed["alice/capital-cities"].commit
            result = result_of(tmp, tmp / "src" / "capital-cities", "0.1.0", commit, solve,
                               "alice", 1)  # fmt: skip
            ref = push_trajectories(tmp / "eval-alice-0.1.0-1", result, token=ALICE)
            push_result(result.model_copy(update={"trajectories": ref}), token=ALICE)
            shown = CliRunner().invoke(app, ["catalog", "--out", str(tmp / "catalog.html")])
            assert shown.exit_code == 0, shown.output
            yield tmp / "catalog.html", shown.output
        finally:
            server.stop()
            index.stop()
            for module in [m for m in sys.modules if m.split(".")[0] in modules]:
                del sys.modules[module]
            sys.path[:] = [p for p in sys.path if not p.startswith(str(tmp))]


def embedded(page: Path) -> dict[str, Any]:
    """The catalog document inside the page."""
    found = re.search(r'<script type="application/json" id="catalog-data">(.*?)</script>',
                      page.read_text(encoding="utf-8"), re.S)  # fmt: skip
    assert found is not None
    return json.loads(found.group(1))


def test_the_page_holds_each_package_as_the_hub_has_it(built: tuple[Path, str]) -> None:
    page, output = built
    assert output.startswith(f"Wrote {page} (3 packages;")
    text = page.read_text(encoding="utf-8")
    assert "<script src" not in text and "<link" not in text  # nothing to fetch: works offline
    document = embedded(page)
    assert document["skipped"] == []
    by_repo = {p["repo"]: p for p in document["packages"]}
    assert list(by_repo) == sorted(PACKAGES)
    assert {r: (p["kinds"], p["tools"], p["tags"]) for r, p in by_repo.items()} == {
        "alice/capital-cities": (["single-turn"], [], ["llm", "reinforcement-learning",
                                                      "single-turn"]),
        "alice/word-game": (["multi-turn"], [], ["game", "llm", "multi-turn",
                                                 "reinforcement-learning"]),
        "bob/stock-lookup": (["tool"], ["lookup"], ["llm", "reinforcement-learning", "tool",
                                                    "tool-use"]),
    }  # fmt: skip
    capital = by_repo["alice/capital-cities"]
    assert (capital["version"], capital["versions"]) == ("0.1.0", ["0.1.0"])
    assert capital["install"] == "envhub install alice/capital-cities@0.1.0 --trust"
    assert capital["description"].startswith("A single-turn envhub environment")
    assert capital["check"] == {"passed": True, "summary": "passed every gate (15)"}
    [env] = capital["envs"]
    assert (env["name"], env["audit"]["passed"], env["audit"]["findings"]) == (
        "capital-cities", True, 0)  # fmt: skip
    assert capital["performance"]["rows"][0][:3] == ["capital-cities", "reference", "200"]
    board = capital["leaderboard"]
    assert (board["version"], board["models"], board["others"]) == ("0.1.0", ["solve"], "")
    assert board["rows"][0][:4] == ["1", "solve", "1.000 [1.000, 1.000]", "1.000 [1.000, 1.000]"]
    [result] = read_results("alice/capital-cities")
    assert result.trajectories is not None
    assert board["trajectories"] == [result.trajectories.url]
    assert by_repo["bob/stock-lookup"]["leaderboard"]["rows"] == []


@pytest.fixture(scope="module")
def page(built: tuple[Path, str], browser: Any) -> Any:
    browser.get(built[0].as_uri())
    return browser


def shown(browser: Any) -> list[str]:
    """The repos of the packages the list shows."""
    return browser.execute_script(
        "return [...document.querySelectorAll('.package')].filter((e) => !e.hidden)"
        ".map((e) => e.dataset.repo)"
    )


def reset(browser: Any) -> None:
    browser.execute_script(
        "for (const id of ['kind', 'tool', 'tag']) document.getElementById(id).value = '';"
        "const s = document.getElementById('search'); s.value = '';"
        "s.dispatchEvent(new Event('input'));"
    )


def test_search_finds_a_package_by_a_tool_and_by_a_model_on_its_board(page: Any) -> None:
    from selenium.webdriver.common.by import By

    reset(page)
    assert shown(page) == sorted(PACKAGES)
    box = page.find_element(By.ID, "search")
    box.send_keys("lookup")
    assert shown(page) == ["bob/stock-lookup"]
    assert page.find_element(By.ID, "count").text == "1 of 3"
    box.clear()
    box.send_keys("SOLVE")  # the model on capital-cities' leaderboard; case does not matter
    assert shown(page) == ["alice/capital-cities"]
    box.send_keys(" nothing-like-this")
    assert shown(page) == [] and page.find_element(By.ID, "empty").is_displayed()


def test_filters_by_kind_tool_and_tag(page: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    reset(page)
    kinds = Select(page.find_element(By.ID, "kind"))
    assert [o.text for o in kinds.options] == ["any", "multi-turn", "single-turn", "tool"]
    kinds.select_by_value("multi-turn")
    assert shown(page) == ["alice/word-game"]
    kinds.select_by_value("")
    Select(page.find_element(By.ID, "tag")).select_by_value("reinforcement-learning")
    assert shown(page) == sorted(PACKAGES)
    Select(page.find_element(By.ID, "tool")).select_by_value("lookup")
    assert shown(page) == ["bob/stock-lookup"]


def test_an_opened_package_shows_its_details_and_copies_its_install_command(page: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    reset(page)
    page.execute_cdp_cmd("Browser.grantPermissions", {
        "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})  # fmt: skip
    box = page.find_element(By.CSS_SELECTOR, '.package[data-repo="alice/capital-cities"]')
    assert box.find_elements(By.CLASS_NAME, "details") == []  # drawn when first opened
    box.find_element(By.TAG_NAME, "summary").click()
    # drawn by the toggle event, which fires after the click returns
    details = WebDriverWait(page, 10).until(lambda _: box.find_element(By.CLASS_NAME, "details"))
    command = "envhub install alice/capital-cities@0.1.0 --trust"
    assert details.find_element(By.CLASS_NAME, "command").text == command
    assert "envhub check: passed every gate (15)" in details.text
    assert "Versions: 0.1.0" in details.text
    rows = details.find_elements(By.CSS_SELECTOR, "table")[1].find_elements(By.TAG_NAME, "tr")
    assert rows[1].text.startswith("1 solve 1.000 [1.000, 1.000]")  # the leaderboard
    assert rows[1].text.endswith(" dataset")  # a link to its trajectories
    link = rows[1].find_element(By.CLASS_NAME, "trajectories").get_attribute("href")
    assert link.startswith(f"{os.environ['HF_ENDPOINT']}/datasets/alice/capital-cities-solve-")
    assert "capital-cities single-turn - passed: " in details.text  # envs: kind, tools, audit
    button = details.find_element(By.CLASS_NAME, "copy")
    button.click()
    WebDriverWait(page, 5).until(lambda _: button.text != "copy")
    assert button.text == "copied"  # the permission granted above lets the page write it
    pasted = page.execute_async_script(
        "navigator.clipboard.readText().then(arguments[0], (e) => arguments[0]('! ' + e))"
    )
    assert pasted == command
    # Where the browser refuses the clipboard, the command is selected for Ctrl+C instead.
    page.execute_script(
        "navigator.clipboard.writeText = () => Promise.reject(new Error('denied'));"
        "getSelection().removeAllRanges(); arguments[0].textContent = 'copy';",
        button,
    )
    button.click()
    WebDriverWait(page, 5).until(lambda _: button.text != "copy")
    assert button.text == "selected: press Ctrl+C"
    assert page.execute_script("return getSelection().toString()") == command
    errors = [e for e in page.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
