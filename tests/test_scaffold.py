"""``envhub.scaffold``: every template renders to exactly its files, with every name filled in;
bad names, templates and destinations are refused without writing anything; each rendered env
passes ``check_env`` and its package's own tests; and the envhub wheel ships the templates."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

import envhub
from envhub import scaffold
from envhub.audit import audit_env
from envhub.checks.checker import check_env
from envhub.errors import ConfigError
from envhub.package import package_env_specs, read_pyproject
from envhub.registry import EnvSpec
from envhub.scaffold import (
    TEMPLATES,
    class_name,
    create_package,
    module_name,
    template_files,
    validate_name,
)

REPO = Path(__file__).resolve().parents[1]
TEMPLATE_SOURCES = REPO / "templates"

# Tests each rendered package ships (the count its own `pytest` run must report).
OWN_TESTS = {"single-turn": 6, "multi-turn": 7, "tool": 7, "code": 6, "agent": 7}
TAGS = {
    "single-turn": ["envhub", "single-turn", "reinforcement-learning", "llm"],
    "multi-turn": ["envhub", "multi-turn", "game", "reinforcement-learning", "llm"],
    "tool": ["envhub", "tool", "tool-use", "reinforcement-learning", "llm"],
    "code": ["envhub", "code", "reinforcement-learning", "llm"],
    "agent": ["envhub", "agent", "tool-use", "reinforcement-learning", "llm"],
}


def package_name(template: str) -> str:
    """One name per template, so that each rendered module is imported once per process."""
    return f"scaffold-{template}"


def expected_files(module: str, template: str = "single-turn") -> list[str]:
    agent = [f"{module}/agent.py"] if template == "agent" else []
    return [
        ".gitignore",
        "README.md",
        f"{module}/__init__.py",
        *agent,
        f"{module}/env.py",
        "pyproject.toml",
        "tests/test_env.py",
    ]


def listing(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each template rendered once for this module."""
    root = tmp_path_factory.mktemp("rendered")
    return {
        template: create_package(package_name(template), template, root) for template in TEMPLATES
    }


# -- names ------------------------------------------------------------------------------------


def test_templates_are_the_five_shipped_folders():
    assert list(TEMPLATES) == ["single-turn", "multi-turn", "tool", "code", "agent"]
    assert sorted(
        p.name for p in TEMPLATE_SOURCES.iterdir() if p.is_dir() and p.name != "__pycache__"
    ) == sorted(TEMPLATES)


@pytest.mark.parametrize(
    ("name", "module", "cls"),
    [
        ("capital-cities", "capital_cities", "CapitalCitiesEnv"),
        ("my-env", "my_env", "MyEnv"),
        ("a", "a", "AEnv"),
        ("game-2048", "game_2048", "Game2048Env"),
        ("x1y2", "x1y2", "X1y2Env"),
    ],
)
def test_module_and_class_names(name, module, cls):
    validate_name(name)
    assert (module_name(name), class_name(name)) == (module, cls)


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("My_Env", "my-env"),
        ("MyEnv", "my-env"),
        ("my env!", "my-env"),
        ("my--env", "my-env"),
        ("-env-", "env"),
        ("2048", "env-2048"),
        ("", "my-env"),
        ("JSON", "json-env"),
    ],
)
def test_invalid_names_are_refused_with_a_suggestion(name, suggestion):
    with pytest.raises(ConfigError) as raised:
        validate_name(name)
    assert str(raised.value) == (
        f"invalid env name {name!r}: use lowercase letters, digits and hyphens, starting with a "
        f"letter; try {suggestion!r}"
    )
    validate_name(suggestion)


@pytest.mark.parametrize(
    ("name", "clash"),
    [
        ("json", "the standard library"),
        ("class", "a Python keyword"),
        ("envhub", "envhub itself"),
        ("tests", "the package's own tests folder"),
        ("numpy", "the installed package 'numpy'"),
    ],
)
def test_names_whose_module_would_hide_another_are_refused(name, clash):
    with pytest.raises(ConfigError) as raised:
        validate_name(name)
    assert str(raised.value) == (
        f"invalid env name {name!r}: its module {name!r} would clash with {clash}; try '{name}-env'"
    )
    validate_name(f"{name}-env")


def test_invalid_name_writes_nothing(tmp_path):
    with pytest.raises(ConfigError, match="invalid env name 'Bad_Name'"):
        create_package("Bad_Name", directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            "tol",
            "unknown template 'tol'. Did you mean 'tool'? "
            "Templates: single-turn, multi-turn, tool, code, agent",
        ),
        (
            "multiturn",
            "unknown template 'multiturn'. Did you mean 'multi-turn'? "
            "Templates: single-turn, multi-turn, tool, code, agent",
        ),
        (
            "rocket",
            "unknown template 'rocket'. Templates: single-turn, multi-turn, tool, code, agent",
        ),
    ],
)
def test_unknown_template_is_refused(tmp_path, template, message):
    with pytest.raises(ConfigError) as raised:
        create_package("my-env", template, tmp_path)
    assert str(raised.value) == message
    assert list(tmp_path.iterdir()) == []


# -- rendering --------------------------------------------------------------------------------


@pytest.mark.parametrize("template", TEMPLATES)
def test_creates_exactly_the_template_files(tmp_path, template):
    path = create_package("my-env", template, tmp_path)
    assert path == tmp_path / "my-env"
    assert [p.name for p in tmp_path.iterdir()] == ["my-env"]
    assert listing(path) == expected_files("my_env", template)
    assert template_files("my-env", template) == expected_files("my_env", template)
    assert (path / "my_env" / "__init__.py").read_text() == (
        '"""my-env: an envhub environment."""\n\n'
        'from my_env.env import MyEnv\n\n__all__ = ["MyEnv"]\n'
    )


@pytest.mark.parametrize("template", TEMPLATES)
def test_pyproject_declares_the_env(rendered, template):
    name = package_name(template)
    module, cls = module_name(name), class_name(name)
    project = read_pyproject(rendered[template])["project"]
    assert (project["name"], project["version"]) == (name, "0.1.0")
    extra = "[harness]" if template == "agent" else ""  # the endpoint and the openai client
    assert project["dependencies"] == [f"envhub{extra}>={envhub.__version__}"]
    assert project["entry-points"] == {"envhub.envs": {name: f"{module}.env:{cls}"}}


@pytest.mark.parametrize("template", TEMPLATES)
def test_readme_has_hub_metadata_and_the_commands(rendered, template):
    name = package_name(template)
    text = (rendered[template] / "README.md").read_text()
    _, front_matter, body = text.split("---\n", 2)
    assert yaml.safe_load(front_matter) == {
        "license": "apache-2.0",
        "pretty_name": name,
        "tags": TAGS[template],
    }
    commands = re.findall(r"```bash\n(.*?)```", body, re.DOTALL)
    assert [c.splitlines()[-1].split(" -")[0] for c in commands] == [
        "envhub check .",
        "pytest",
        f"envhub eval {name}",
    ]


@pytest.mark.parametrize("template", TEMPLATES)
def test_every_placeholder_is_filled(rendered, template):
    for file in rendered[template].rglob("*"):
        if file.is_file():
            assert "{{" not in file.read_text(), file


def test_templates_use_only_known_placeholders():
    known = set(scaffold.template_values("x"))
    for file in TEMPLATE_SOURCES.rglob("*"):
        if not file.is_file() or file.suffix == ".pyc" or file.name == "__init__.py":
            continue
        used = set(re.findall(r"\{\{(.*?)\}\}", file.read_text()))
        if file.suffix == ".tmpl":
            assert used <= known, f"{file}: unknown placeholders {used - known}"
        else:
            assert not used, (
                f"{file} has placeholders but no .tmpl suffix, so they stay as they are"
            )


# -- destinations -----------------------------------------------------------------------------


def test_existing_package_is_refused_then_forced(tmp_path):
    path = create_package("my-env", "single-turn", tmp_path)
    (path / "notes.txt").write_text("mine")
    (path / "my_env" / "env.py").write_text("edited")
    with pytest.raises(ConfigError) as raised:
        create_package("my-env", "tool", tmp_path)
    assert str(raised.value) == (
        f"{path} already exists and is not empty; choose another name or folder, "
        "or use --force (force=True) to write into it"
    )
    assert (path / "my_env" / "env.py").read_text() == "edited"

    assert create_package("my-env", "tool", tmp_path, force=True) == path
    assert listing(path) == sorted([*expected_files("my_env"), "notes.txt"])
    assert (path / "notes.txt").read_text() == "mine"
    assert "class MyEnv(ToolEnv):" in (path / "my_env" / "env.py").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["my-env"]  # no staging folder left


def test_existing_empty_folder_is_used(tmp_path):
    (tmp_path / "my-env").mkdir()
    create_package("my-env", "multi-turn", tmp_path)
    assert listing(tmp_path / "my-env") == expected_files("my_env")


def test_destination_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "my-env").write_text("")
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        create_package("my-env", directory=tmp_path, force=True)


def test_directory_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "envs").write_text("")
    with pytest.raises(ConfigError) as raised:
        create_package("my-env", directory=tmp_path / "envs")
    assert str(raised.value) == f"{tmp_path / 'envs'} is not a folder"
    with pytest.raises(ConfigError) as raised:
        create_package("my-env", directory=tmp_path / "envs" / "deeper")
    assert (
        str(raised.value)
        == f"cannot create a package in {tmp_path / 'envs' / 'deeper'}: Not a directory"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["envs"]


def test_missing_parent_folders_are_created(tmp_path):
    path = create_package("my-env", directory=tmp_path / "a" / "b")
    assert path == tmp_path / "a" / "b" / "my-env"
    assert listing(path) == expected_files("my_env")


def test_failure_while_rendering_leaves_nothing_behind(tmp_path, monkeypatch):
    calls = []

    def failing_render(text: str, values: dict[str, str]) -> str:
        calls.append(text)
        if len(calls) == 3:  # some files are already written by then
            raise OSError("disk full")
        return text

    monkeypatch.setattr(scaffold, "render_text", failing_render)
    with pytest.raises(OSError, match="disk full"):
        create_package("my-env", "tool", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_forced_write_blocked_by_a_folder_changes_nothing(tmp_path):
    path = create_package("my-env", "single-turn", tmp_path)
    (path / "README.md").unlink()
    (path / "README.md").mkdir()
    (path / "pyproject.toml").write_text("mine")
    with pytest.raises(
        ConfigError, match="cannot write README.md into .*: something of that name is in the way"
    ):
        create_package("my-env", "single-turn", tmp_path, force=True)
    assert (path / "pyproject.toml").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["my-env"]


# -- the rendered envs work -------------------------------------------------------------------


@pytest.mark.parametrize("template", TEMPLATES)
def test_rendered_env_passes_check_env(rendered, template, unload):
    name = package_name(template)
    unload.append(module_name(name))
    specs = package_env_specs(rendered[template])
    assert specs == {
        name: EnvSpec(name, f"{module_name(name)}.env:{class_name(name)}", name, "0.1.0")
    }
    env = specs[name].load()()
    report = check_env(env)
    details = {r.name: r.detail for r in report.results}
    assert report.passed
    assert (details["null policy at floor"], details["reference policy at top"]) == ("0.0", "1.0")
    tools = {"tool": "lookup", "agent": "price"}  # the agent's: those of its latest call
    assert details["tool schemas"] == tools.get(template, "no tools")


@pytest.mark.parametrize("template", TEMPLATES)
def test_rendered_env_passes_the_reward_audit(rendered, template, unload):
    name = package_name(template)
    unload.append(module_name(name))
    env = package_env_specs(rendered[template])[name].load()()
    report = audit_env(env)
    # The single-turn template pays 0.1 for an `Answer:` line alone and declares it.
    assert (report.floor, report.declared) == (
        (0.1, True) if template == "single-turn" else (0.0, False)
    )
    assert report.passed and report.findings == []
    # Every hack class is tried, the reference's mutants included (each template has one).
    tools = ["tool-calls"] if template == "tool" else []
    assert report.hacks == [
        "degenerate", "format-only", *tools, "length", "non-commitment", "stuffing",
        "abstention", *(["checker"] if tools else []), "form-without-answer",
        *([] if tools else ["checker"]), "calibration",
    ]  # fmt: skip
    assert {"junk-tools", "tool-hacks"} <= set(report.policies) or template != "tool"
    assert {"ref:no-answer", "ref:candidates", "ref:padded", "reference"} <= set(report.policies)


@pytest.mark.parametrize("template", TEMPLATES)
def test_rendered_package_passes_its_own_tests(rendered, template):
    path = rendered[template]
    env = {**os.environ, "PYTHONPATH": str(path)}
    env.pop("PYTEST_ADDOPTS", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path / "tests")],
        cwd=path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"{OWN_TESTS[template]} passed in [\d.]+s", summary), summary


# -- packaging --------------------------------------------------------------------------------


def test_every_code_package_is_listed_for_the_wheel():
    """Each folder with an ``__init__.py`` under a mapped source folder is a listed package.

    An editable install finds unlisted subpackages anyway, so only a wheel install (a GPU
    machine, a user's ``pip install envhub``) would miss one, as it once missed
    ``envhub.trainer.critic``. Templates' folders are data and are checked by the wheel test."""
    setuptools = read_pyproject(REPO)["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in setuptools["package-dir"].items():
        if package == "envhub.templates":
            continue
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder).parts
            if "__pycache__" not in relative:
                found.add(".".join((package, *relative)))
    missing = found - listed
    assert not missing, f"add to pyproject's [tool.setuptools] packages: {sorted(missing)}"


def test_wheel_ships_every_template_file(tmp_path):
    """Build envhub's wheel (from a copy of the sources, so the tree stays clean) and find
    every file of templates/ in it."""
    source = tmp_path / "src"
    source.mkdir()
    for file in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / file).exists():
            shutil.copy(REPO / file, source / file)
    for folder in set(read_pyproject(REPO)["tool"]["setuptools"]["package-dir"].values()):
        shutil.copytree(
            REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("envhub-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("envhub/templates/")}
    sources = {f"envhub/templates/{f}" for f in listing(TEMPLATE_SOURCES) if "__pycache__" not in f}
    assert shipped == sources
    assert {f"envhub/templates/{t}/.gitignore" for t in TEMPLATES} <= shipped
