"""An eval's trajectories on the Hub, as a ``datasets`` dataset (``envhub eval --push
--push-trajectories``).

They go to a dataset repo of their own, named from the env and the model
(``<pusher>/<env>-<model>-trajectories``), one parquet file per eval under ``data/``; the pushed
result links to that file at its commit (:class:`~envhub.hub.results.TrajectoriesRef`). A push
adds a file and rewrites none but the dataset card, so the repo holds every pushed eval of that
env and model: ``datasets.load_dataset(repo)`` reads them all, ``data_files=path`` one.

Each row is one episode: its task, sample, role, messages (role and text), reward, reward
components and info (JSON text), how it stopped, which env version and model played it, and the
whole trajectory as JSON (``Trajectory.model_validate_json`` gives it back exactly).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError
from envhub.hub import client
from envhub.hub.results import EvalResult, TrajectoriesRef

DATASET = "dataset"
_NAME_LIMIT = 96
"""The Hub's longest repo name."""


def dataset_repo(owner: str, env: str, model: str) -> str:
    """``owner/<env>-<model>-trajectories``, with the model's last path part and any character
    the Hub refuses in a name replaced by ``-``."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{env}-{model.rstrip('/').rsplit('/', 1)[-1]}")
    name = f"{slug.strip('-.')[: _NAME_LIMIT - len('-trajectories')]}-trajectories"
    return f"{owner}/{name}"


def rows(trajectories: list[Any], result: EvalResult) -> list[dict[str, Any]]:
    """One dataset row per trajectory (see the module docstring)."""
    return [
        {
            "task_index": t.task_index,
            "sample_index": t.sample_index,
            "task": t.info.get("task"),
            "role": t.role,
            "messages": [{"role": m.role, "content": m.content or ""} for m in t.messages],
            "reward": t.reward,
            "reward_components": json.dumps(t.reward_components, sort_keys=True),
            "stop_reason": t.stop_reason,
            "info": json.dumps(t.info, sort_keys=True, default=str),
            "env": result.env.name,
            "env_version": result.env.version,
            "env_commit": result.env.commit,
            "model": result.model,
            "trajectory": t.model_dump_json(),
        }
        for t in trajectories
    ]


def push_trajectories(
    folder: str | Path, result: EvalResult, *, token: str | None = None
) -> TrajectoriesRef:
    """Push the trajectories of the eval saved in ``folder`` (whose result is ``result``) to
    their dataset repo, created when missing; returns where they are.

    Raises:
        ConfigError: ``datasets`` is not installed, or the eval has no trajectories.
        HubAuthError, HubError: No token, or the Hub failed.
    """
    from huggingface_hub import CommitOperationAdd

    from envhub.rollout.io import read_trajectories

    trajectories = read_trajectories(Path(folder) / "trajectories.jsonl")
    if not trajectories:
        raise ConfigError(f"{folder} holds no trajectories to push")
    api = client.api(client.require_token(token, "pushing trajectories"))
    repo = dataset_repo(result.pushed_by, result.env.name, result.model)
    path = f"data/{result.date.replace('-', '').replace(':', '')}-{result.config_sha256[7:19]}"
    path += ".parquet"
    data = _parquet(rows(trajectories, result))
    card = _card(repo, result)
    with client.hub_errors("push the trajectories", repo):
        api.create_repo(repo, repo_type=DATASET, exist_ok=True)
        info = api.create_commit(
            repo,
            [CommitOperationAdd(path, data), CommitOperationAdd("README.md", card.encode())],
            commit_message=f"envhub trajectories: {result.model} on {result.env.name} "
            f"{result.env.version} ({len(trajectories)} episodes)",
            repo_type=DATASET,
        )
    return TrajectoriesRef(repo=repo, commit=str(info.oid), path=path, rows=len(trajectories))


def _parquet(table: list[dict[str, Any]]) -> bytes:
    try:
        import datasets
    except ImportError as e:
        raise ConfigError(
            "pushing trajectories needs the `datasets` library: pip install datasets"
        ) from e
    buffer = io.BytesIO()
    datasets.Dataset.from_list(table).to_parquet(buffer)
    return buffer.getvalue()


def _card(repo: str, result: EvalResult) -> str:
    """The dataset card: ``datasets``' config for ``data/*.parquet`` and where the env is."""
    env = result.env
    return (
        "---\n"
        "tags:\n- envhub\n- envhub-trajectories\n"
        "configs:\n- config_name: default\n  data_files: data/*.parquet\n"
        "---\n\n"
        f"# {repo.split('/', 1)[1]}\n\n"
        f"Episodes of `{result.model}` on the env `{env.name}` of "
        f"[{env.repo}]({client.endpoint()}/{env.repo}), pushed with `envhub eval --push "
        "--push-trajectories`: one parquet file per eval under `data/`, linked from its result "
        f"in the env repo's `results/` (see `envhub leaderboard {env.repo}`).\n"
    )


def load_trajectories(ref: TrajectoriesRef, *, token: str | None = None) -> Any:
    """The ``datasets.Dataset`` of the eval ``ref`` points at, read from the Hub at its commit."""
    import datasets
    from huggingface_hub import hf_hub_download

    with client.hub_errors("read the trajectories", ref.repo, ref.commit):
        local = hf_hub_download(
            ref.repo,
            ref.path,
            repo_type=DATASET,
            revision=ref.commit,
            endpoint=client.endpoint(),
            token=token,
        )
    return datasets.Dataset.from_parquet(local)
