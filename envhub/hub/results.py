"""Eval results on the Hub: ``envhub eval ... --push`` records one on the env package's repo.

A result is one JSON file (:class:`EvalResult`) under ``results/`` of the repo, named by its
date, who pushed it and a hash of its content, so a push adds a file and never rewrites one. It
is pinned: it names the env version and the commit it was measured on, and a push is refused
unless that commit is the one the version's tag points at. It is attributable: ``by`` is who
ran it (``--by``, default the pusher) and ``pushed_by`` the Hub user whose token pushed it. Its
episodes may go with it, as a dataset in a repo of their own (:mod:`envhub.hub.trajectories`),
which the result links to.

Whoever may write to the repo commits the result to ``main`` together with the card's
leaderboard section, regenerated (:mod:`envhub.hub.result_push`); anyone else opens a pull
request holding the result alone, which counts once the repo's owner merges it.

pass@k and the mean reward come with a 95% interval over tasks: mean ± 1.96 standard errors of
the per-task values (normal approximation; ``None`` with fewer than two tasks).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from envhub.errors import ConfigError
from envhub.hub import client
from envhub.hub.files import RESULTS

FORMAT = 1
Interval = tuple[float, float]


class EnvPin(BaseModel):
    """The env a result was measured on, exactly."""

    model_config = ConfigDict(frozen=True)

    repo: str
    """The env package's Hub repo (``owner/name``)."""
    name: str
    """The env's name."""
    version: str
    """The package version (a tag of ``repo``); leaderboards group results by it."""
    commit: str
    """The commit the version's tag points at, which the eval's env was installed from."""


class Estimate(BaseModel):
    """A mean over tasks with its 95% interval."""

    model_config = ConfigDict(frozen=True)

    value: float
    ci95: Interval | None = None
    """mean ± 1.96 standard errors over tasks; ``None`` with fewer than two tasks."""


class TrajectoriesRef(BaseModel):
    """Where an eval's trajectories are on the Hub: one parquet file of a dataset repo."""

    model_config = ConfigDict(frozen=True)

    repo: str
    """The dataset repo (``owner/<env>-<model>-trajectories``)."""
    commit: str
    path: str
    """The file of this eval's rows (``data/*.parquet``)."""
    rows: int

    @property
    def url(self) -> str:
        """The file's page on the Hub."""
        return f"{client.endpoint()}/datasets/{self.repo}/blob/{self.commit}/{self.path}"


class EvalResult(BaseModel):
    """One eval of one model on one env version, as ``results/*.json`` holds it."""

    model_config = ConfigDict(frozen=True)

    format: int = FORMAT
    env: EnvPin
    model: str
    """The model's id as the server named it."""
    model_revision: str | None = None
    """The model's revision, when given (``--model-revision``)."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Temperature, top-p, max tokens per turn."""
    engine: dict[str, Any] = Field(default_factory=dict)
    """What sampled: engine, mode, its software version, the chat template's sha256."""
    episodes: int
    tasks: int
    samples_per_task: int
    seed: int | None = None
    pass_threshold: float
    reward: Estimate
    """Mean reward (interval over the tasks' mean rewards)."""
    pass_at: dict[int, Estimate]
    components: dict[str, float] = Field(default_factory=dict)
    """Mean of each reward component."""
    outcomes: dict[str, int] = Field(default_factory=dict)
    date: str
    """When the result was made, UTC, ISO 8601."""
    envhub_version: str
    config_sha256: str
    """sha256 of ``config`` as canonical JSON (sorted keys, no spaces)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """The eval's ``config.json``, less the server's address."""
    by: str
    """Who ran the eval (``--by``, default the pusher)."""
    pushed_by: str
    """The Hub user whose token pushed it (``whoami``)."""
    trajectories: TrajectoriesRef | None = None
    """Its episodes as a ``datasets`` dataset, when pushed with them (``--push-trajectories``)."""

    def path(self) -> str:
        """Its file in the repo: ``results/<date>-<by>-<12 hex of its content's sha256>.json``."""
        stamp = self.date.replace("-", "").replace(":", "")[:15]
        safe_by = "".join(c if c.isalnum() or c in "._-" else "_" for c in self.by)
        return f"{RESULTS}/{stamp}Z-{safe_by}-{sha256_hex(self.to_json())[:12]}.json"

    def to_json(self) -> str:
        """The file's text (without ``trajectories`` when there are none, as results pushed
        without them have always been written)."""
        leave_out = {"trajectories"} if self.trajectories is None else None
        return self.model_dump_json(indent=2, exclude=leave_out) + "\n"


@dataclass(frozen=True)
class Pushed:
    """Where a pushed result went."""

    path: str
    commit: str
    pull_request: str | None = None
    """The pull request's address when the pusher may not write to the repo (counted once
    merged), else ``None`` (on ``main``)."""


def sha256_hex(text: str) -> str:
    """The hex sha256 of ``text`` (UTF-8)."""
    return hashlib.sha256(text.encode()).hexdigest()


def config_sha256(config: dict[str, Any]) -> str:
    """``sha256:<hex>`` of ``config`` as canonical JSON."""
    return "sha256:" + sha256_hex(json.dumps(config, sort_keys=True, separators=(",", ":")))


def _interval(values: list[float], low: float = -math.inf, high: float = math.inf) -> Estimate:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Estimate(value=mean)
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values))
    return Estimate(value=mean, ci95=(max(low, mean - half), min(high, mean + half)))


def estimates(trajectories: list[Any], pass_threshold: float, ks: list[int]) -> dict[str, Any]:
    """``{"reward": Estimate, "pass_at": {k: Estimate}}`` over the tasks (a task's samples of
    one role together, as :func:`envhub.evaluation.summarize` groups them)."""
    from envhub.evaluation import pass_at_k

    by_task: dict[tuple[str, str | None], list[Any]] = defaultdict(list)
    for t in trajectories:
        by_task[(t.group_id, t.role_name)].append(t)
    rewards = [statistics.fmean(t.reward for t in ts) for ts in by_task.values()]
    passes = [[t.reward >= pass_threshold - 1e-9 for t in ts] for ts in by_task.values()]
    pass_at = {k: _interval([pass_at_k(len(p), sum(p), k) for p in passes], 0.0, 1.0) for k in ks}
    return {"reward": _interval(rewards or [0.0]), "pass_at": pass_at}


def build_result(
    folder: str | Path,
    *,
    repo_id: str,
    pushed_by: str,
    by: str | None = None,
    model_revision: str | None = None,
    now: datetime | None = None,
) -> EvalResult:
    """The result of the eval saved in ``folder`` (``summary.json``, ``config.json``,
    ``trajectories.jsonl``), for ``repo_id``.

    Raises:
        ConfigError: The eval's env is not pinned to a Hub commit, or it played several envs.
    """
    from envhub.rollout.io import read_trajectories
    from envhub.version import __version__

    folder = Path(folder)
    summary = json.loads((folder / "summary.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    config.pop("base_url", None)
    pin = _pin(config.get("env_refs", []), repo_id)
    trajectories = read_trajectories(folder / "trajectories.jsonl")
    ks = sorted(int(k) for k in summary.get("pass_at", {}))
    sampler = dict((config.get("samplers") or [{}])[0])
    sampler.pop("sampling", None)
    stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return EvalResult(
        env=pin, model=str(config.get("model")), model_revision=model_revision,
        sampling=config.get("sampling", {}), engine=sampler, episodes=summary["episodes"],
        tasks=summary["tasks"], samples_per_task=summary["samples_per_task"],
        seed=config.get("seed"), pass_threshold=summary["pass_threshold"],
        **estimates(trajectories, summary["pass_threshold"], ks),
        components=summary.get("components", {}), outcomes=summary.get("outcomes", {}),
        date=stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), envhub_version=__version__,
        config_sha256=config_sha256(config), config=config, by=by or pushed_by,
        pushed_by=pushed_by,
    )  # fmt: skip


def _pin(env_refs: list[dict[str, Any]], repo_id: str) -> EnvPin:
    if len(env_refs) != 1:
        raise ConfigError(
            f"a result is of one env version; this eval recorded {len(env_refs)}: {env_refs}"
        )
    ref = env_refs[0]
    if not ref.get("commit") or not ref.get("version"):
        raise ConfigError(
            f"the eval's env {ref.get('name')!r} is not pinned to a Hub commit: a result must "
            f"name the code it measured. Install the env from the Hub "
            f"(`envhub install {repo_id}@VERSION`) and evaluate that"
        )
    return EnvPin(repo=repo_id, name=ref["name"], version=ref["version"], commit=ref["commit"])


def repo_of(env: str, commit: str | None) -> str | None:
    """The Hub repo of an eval's env: ``env`` itself when it is ``owner/name[@rev][:env]``,
    else the repo the installed distribution at ``commit`` came from (``None``: unknown)."""
    from importlib import metadata

    from envhub.hub.provenance import install_source

    if client.is_hub_ref(env.partition(":")[0]):
        return client.parse_ref(env.partition(":")[0]).repo_id
    for dist in metadata.distributions() if commit else ():
        source = install_source(dist.metadata["Name"] or "")
        if source is not None and source[1] == commit:
            return source[0]
    return None


def read_text(api: Any, repo_id: str, revision: str, path: str) -> str | None:
    """The text of ``path`` in ``repo_id`` at ``revision``; ``None`` when there is none."""
    from huggingface_hub import errors, hf_hub_download

    try:
        local = hf_hub_download(repo_id, path, revision=revision, repo_type=client.REPO_TYPE,
                                endpoint=api.endpoint, token=api.token)  # fmt: skip
    except errors.EntryNotFoundError:
        return None
    return Path(local).read_text(encoding="utf-8")


def read_results(
    repo_id: str, *, revision: str = "main", token: str | None = None, api: Any = None
) -> list[EvalResult]:
    """Every result under ``results/`` of ``repo_id`` at ``revision`` (files that are not
    results are left out)."""
    from huggingface_hub import errors

    api = api or client.api(token)
    with client.hub_errors("read the results", repo_id, revision):
        try:
            entries = api.list_repo_tree(repo_id, path_in_repo=RESULTS, revision=revision,
                                         repo_type=client.REPO_TYPE)  # fmt: skip
            paths = sorted(e.path for e in entries if e.path.endswith(".json"))
        except errors.EntryNotFoundError:
            return []
        texts = [read_text(api, repo_id, revision, p) for p in paths]
    return [r for r in map(_parse, texts) if r is not None]


def _parse(text: str | None) -> EvalResult | None:
    from pydantic import ValidationError

    try:
        return EvalResult.model_validate_json(text or "")
    except ValidationError:
        return None
