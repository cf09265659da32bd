"""Performance numbers from ``envhub check`` to the card, through the Hub, to ``envhub search``.

The Hub part is the real ``huggingface_hub`` client against the local Hub server, which returns
each card's front matter in its listings as the Hub does (``cardData``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import ALICE
from hub_server import HubServer
from huggingface_hub import HfApi
from typer.testing import CliRunner

from envhub.checks.package import check_package
from envhub.cli.app import app
from envhub.cli.console import console
from envhub.cli.search import speed
from envhub.evaluation.perf import (
    Machine,
    Performance,
    SandboxStart,
    format_ms,
    format_rate,
    machine,
    summary,
)
from envhub.hub import push, search
from envhub.hub.card import render_card, split_front_matter

REPO = "alice/capital-cities"
runner = CliRunner()

CAPITALS = Performance(
    policy="reference", episodes=200, steps=200, mean_reward=1.0, episodes_per_s=6780.0,
    reset_p50_ms=0.0767, step_p50_ms=0.0371, step_p99_ms=0.211, cpu_ms_per_episode=0.143,
    peak_rss_mb=57.6, sandbox=None,
)  # fmt: skip
CODE = Performance(
    policy="reference", episodes=7, steps=7, mean_reward=1.0, episodes_per_s=3.16,
    reset_p50_ms=0.193, step_p50_ms=300.0, step_p99_ms=771.0, cpu_ms_per_episode=43.3,
    peak_rss_mb=159.0,
    sandbox=SandboxStart(backend="local", cold_start_ms=57.0, warm_start_ms=84.1),
)  # fmt: skip
MACHINE = Machine(
    cpu="AMD EPYC", cores=2, ram_gb=23.5, os="Linux 6.1.0", python="3.11.7", envhub="0.1.0"
)

CARD = """\
---
license: mit
tags:
- envhub
library_name: envhub
envhub:
  performance:
    machine:
      cpu: AMD EPYC
      cores: 2
      ram_gb: 23.5
      os: Linux 6.1.0
      python: 3.11.7
      envhub: 0.1.0
    envs:
      capitals:
        policy: reference
        episodes: 200
        steps: 200
        mean_reward: 1.0
        episodes_per_s: 6780.0
        reset_p50_ms: 0.0767
        step_p50_ms: 0.0371
        step_p99_ms: 0.211
        cpu_ms_per_episode: 0.143
        peak_rss_mb: 57.6
        sandbox: null
      code:
        policy: reference
        episodes: 7
        steps: 7
        mean_reward: 1.0
        episodes_per_s: 3.16
        reset_p50_ms: 0.193
        step_p50_ms: 300.0
        step_p99_ms: 771.0
        cpu_ms_per_episode: 43.3
        peak_rss_mb: 159.0
        sandbox:
          backend: local
          cold_start_ms: 57.0
          warm_start_ms: 84.1
---

# Capitals

<!-- envhub:begin (written by envhub push; edits here are replaced) -->
## Install with envhub

```bash
envhub install alice/capitals@0.1.0 --trust
```

Envs: `capitals`, `code`. In Python: `envhub.make("alice/capitals@0.1.0", trust_remote_code=True)`.

### Checks of version 0.1.0

REPORT

### Performance of version 0.1.0

Measured by `envhub check` on the pushing machine: AMD EPYC, 2 cores, 23.5 GiB RAM, \
Linux 6.1.0, Python 3.11.7, envhub 0.1.0. Each env is played by its scripted policy \
(`reference`; `null`, the empty reply, where it has none); step times are `env.step` alone, \
rewards included.

| env | policy | episodes | episodes/s | reset p50 | step p50 | step p99 | CPU / episode \
| peak RSS | sandbox cold start |
|---|---|---|---|---|---|---|---|---|---|
| capitals | reference | 200 | 6780 | 76.7 µs | 37.1 µs | 211 µs | 143 µs | 57.6 MiB | — |
| code | reference | 7 | 3.16 | 193 µs | 300 ms | 771 ms | 43.3 ms | 159 MiB | 57 ms |
<!-- envhub:end -->
"""


def _card(readme: str, **numbers: object) -> str:
    return render_card(readme, repo_id="alice/capitals", version="0.1.0",
                       envs={"capitals": "c:E", "code": "c:C"}, description="d",
                       report_markdown="REPORT\n", **numbers)  # fmt: skip


def test_the_card_shows_the_numbers_in_a_table_and_in_its_front_matter() -> None:
    numbers = {"performance": {"capitals": CAPITALS, "code": CODE}, "machine": MACHINE}
    assert _card("---\nlicense: mit\n---\n# Capitals\n", **numbers) == CARD


def test_a_card_without_numbers_drops_stale_ones_and_keeps_other_envhub_keys() -> None:
    stale = {"envhub": {"performance": {"machine": MACHINE, "envs": {"capitals": CAPITALS}}}}
    readme = f"---\n{yaml.safe_dump(stale)}---\n# Capitals\n"
    meta, body = split_front_matter(_card(readme))
    assert meta == {"tags": ["envhub"], "library_name": "envhub"}
    assert "### Performance" not in body
    stale["envhub"]["owner_note"] = "kept"
    meta, _ = split_front_matter(_card(f"---\n{yaml.safe_dump(stale)}---\n# Capitals\n"))
    assert meta["envhub"] == {"owner_note": "kept"}


def test_check_package_reports_the_performance_of_each_env(package: Path) -> None:
    report = check_package(package, run_tests=False)
    assert report.passed, report.failures
    row = next(r for r in report.results if r.name == "capital-cities: performance")
    measured = report.performance["capital-cities"]
    assert row.passed and row.detail == summary(measured)
    assert set(measured) == set(Performance.__annotations__) and measured["sandbox"] is None
    assert (measured["policy"], measured["mean_reward"]) == ("reference", 1.0)
    assert report.machine == machine()
    assert report.to_dict()["performance"] == {
        "machine": report.machine,
        "envs": report.performance,
    }

    quick = check_package(package, run_tests=False, performance=False)
    assert [r.name for r in quick.results if r.name.endswith("performance")] == []
    assert "performance" not in quick.to_dict() and quick.performance == {}


def test_a_crash_on_a_task_the_contract_does_not_play_fails_the_measurement(
    package: Path,
) -> None:
    env = package / "capital_cities" / "env.py"
    solved = '    return f"Answer: {_ANSWERS[messages[-1].content]}"\n'
    kenya = '    if "Kenya" in messages[-1].content:\n        raise RuntimeError("no Kenya")\n'
    assert solved in env.read_text()
    env.write_text(env.read_text().replace(solved, kenya + solved))
    report = check_package(package, run_tests=False)
    # The contract plays tasks 0, 3 and 7 of 8; the measurement's second episode is Kenya's, 4.
    assert [r.name for r in report.failures] == ["capital-cities: performance"]
    assert report.failures[0].detail == (
        "measuring capital_cities.env:CapitalCitiesEnv failed: RuntimeError: no Kenya"
    )
    assert report.performance == {} and "performance" not in report.to_dict()


def test_an_env_that_fails_a_gate_is_not_measured(package: Path) -> None:
    pyproject = package / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))
    report = check_package(package, run_tests=False)
    assert [r.name for r in report.failures] == ["capital-cities: version"]
    row = next(r for r in report.results if r.name == "capital-cities: performance")
    assert row.passed and row.detail == "not measured: capital-cities fails 1 gate(s)"
    assert report.performance == {} and report.machine == {}


def test_push_puts_the_numbers_on_the_card_and_search_shows_them(
    hub: HubServer, package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = push(package, token=ALICE, run_tests=False)
    files = hub.repos[("model", REPO)].commits[result.commit].files
    measured = json.loads(files["envhub.json"])["check"]["performance"]
    assert list(measured["envs"]) == ["capital-cities"] and measured["machine"] == machine()
    meta, body = split_front_matter(files["README.md"].decode())
    assert meta["envhub"] == {"performance": measured}
    assert "| env | policy | episodes | episodes/s |" in body

    (found,) = search("capital")
    assert found.performance == measured
    numbers = measured["envs"]["capital-cities"]
    rate, step = format_rate(numbers["episodes_per_s"]), format_ms(numbers["step_p50_ms"])
    assert speed(found) == f"{rate} ep/s, step p50 {step}"
    lines = _terminal(monkeypatch, ["search", "capital"], width=200)
    assert lines[1].split() == ["repo", "updated", "visibility", "performance", "tags"]
    assert [cell.strip() for cell in lines[2].split("  ") if cell.strip()] == [
        REPO, found.last_modified[:10], "public", speed(found),
        "llm, reinforcement-learning, single-turn",
    ]  # fmt: skip


def test_search_shows_the_slowest_env_and_moves_it_under_the_name_at_80_columns(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    performance = {"machine": MACHINE, "envs": {"wordle": CAPITALS, "wordle-code": CODE}}
    _publish(hub, "alice/wordle-in-seven-languages", {"tags": ["envhub", "games"],
             "envhub": {"performance": performance}})  # fmt: skip
    _publish(hub, "alice/capital-cities", {"tags": ["envhub"]})  # pushed before envhub measured
    date = _updated(hub, "alice/capital-cities")
    assert _updated(hub, "alice/wordle-in-seven-languages") == date
    assert _terminal(monkeypatch, ["search"], width=80) == [
        "envhub packages on the Hub",
        "repo                             updated     visibility",
        f"alice/capital-cities             {date}  public",
        f"alice/wordle-in-seven-languages  {date}  public",
        "    3.16 ep/s, step p50 300 ms (wordle-code, slowest of 2)",
        "    tags: games",
    ]
    assert _terminal(monkeypatch, ["search"], width=160)[1:] == [
        "repo                             updated     visibility  performance"
        "                                             tags",
        f"alice/capital-cities             {date}  public",
        f"alice/wordle-in-seven-languages  {date}  public      "
        "3.16 ep/s, step p50 300 ms (wordle-code, slowest of 2)  games",
    ]


def _publish(hub: HubServer, repo_id: str, meta: dict[str, object]) -> None:
    """A repo whose card has ``meta`` as front matter, uploaded with the real client."""
    api = HfApi(endpoint=hub.url, token=ALICE)
    api.create_repo(repo_id)
    card = f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n# {repo_id}\n"
    api.upload_file(path_or_fileobj=card.encode(), path_in_repo="README.md", repo_id=repo_id)


def _updated(hub: HubServer, repo_id: str) -> str:
    repo = hub.repos[("model", repo_id)]
    return repo.commits[repo.branches["main"]].date[:10]


def _terminal(monkeypatch: pytest.MonkeyPatch, args: list[str], width: int) -> list[str]:
    """What the command prints on a terminal ``width`` columns wide, trailing spaces left off."""
    monkeypatch.setattr(console, "_width", None)  # the console keeps the width it first read
    result = runner.invoke(app, args, env={"COLUMNS": str(width), "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return [line.rstrip() for line in result.stdout.splitlines()]
