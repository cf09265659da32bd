"""``envhub.make("owner/name@version")``: an env from a Hub package, installed at an exact commit.

The reference resolves through ``envhub.lock`` (in the current folder) when the lock has the repo,
else on the Hub. If that commit is already installed, the env is made without touching the
network again for the package; otherwise it is installed, which needs ``trust_remote_code=True``,
through ``envhub install``'s guard (refused when it would shadow an installed distribution, a
module or a project on pip's indexes, or change installed distributions unless
``allow_changes=True``).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from envhub import registry
from envhub.errors import ConfigError, EnvNotFoundError
from envhub.hub import client
from envhub.hub.install import Resolved, install, resolve
from envhub.hub.lock import LOCK_FILE, read_lock
from envhub.hub.provenance import install_source


def make_from_hub(
    reference: str,
    *,
    trust_remote_code: bool = False,
    allow_changes: bool = False,
    token: str | None = None,
    **kwargs: Any,
) -> Any:
    """Construct the env of Hub package ``reference`` with ``kwargs`` (see the module docstring).

    Args:
        reference: ``owner/name[@version|@commit]``; ``owner/name@rev:env`` picks one env of a
            package that has several.
        trust_remote_code: Install the package if that commit is not installed yet (installing
            runs its code).
        allow_changes: Install even when its dependencies would upgrade, downgrade or
            reinstall installed distributions (as ``envhub install --allow-changes``).
        token: Hugging Face token, for private repos.
        **kwargs: Arguments for the env's constructor.

    Returns:
        The new env.

    Raises:
        HubNotFoundError: No such repo or version on the Hub.
        ConfigError: ``reference`` is malformed, or its commit is not installed and
            ``trust_remote_code`` is not set, or the install guard refused it, or the package has
            several envs and ``reference`` names none.
        EnvNotFoundError: The package has no env of the name asked for.
    """
    text, _, env_name = reference.partition(":")
    ref = client.parse_ref(text)
    locked = read_lock(LOCK_FILE).get(ref.repo_id)
    expected = None
    if locked is not None and locked.matches(ref.revision):
        resolved, expected = (
            Resolved(ref.repo_id, locked.revision, locked.commit),
            locked.content_hash,
        )
    else:
        resolved = resolve(ref, token)
    distribution = _installed_distribution(resolved)
    if distribution is None:
        if not trust_remote_code:
            raise ConfigError(
                f"{ref} (commit {resolved.commit[:12]}) is not installed, "
                "and installing runs its code: "
                f"run `envhub install {ref.repo_id}@{resolved.commit}` to review and install it, "
                "or pass trust_remote_code=True"
            )
        result = install(
            client.HubRef(ref.repo_id, resolved.commit),
            trust=True,
            lock_file=None,
            token=token,
            expected_hash=expected,
            allow_changes=allow_changes,
        )
        distribution = result.entry.distribution
    return registry.make(_pick_env(distribution, env_name, ref.repo_id), **kwargs)


def _installed_distribution(resolved: Resolved) -> str | None:
    """The installed distribution that ``envhub install`` put there from ``resolved``'s commit."""
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and install_source(name) == (resolved.repo_id, resolved.commit):
            return name
    return None


def _pick_env(distribution: str, wanted: str, repo_id: str) -> str:
    names = sorted(
        ep.name
        for ep in metadata.distribution(distribution).entry_points
        if ep.group == registry.ENTRY_POINT_GROUP
    )
    if wanted:
        if wanted not in names:
            raise EnvNotFoundError(f"{repo_id} has no env {wanted!r}; it has: {', '.join(names)}")
        return wanted
    if len(names) == 1:
        return names[0]
    default = repo_id.split("/")[1]
    if default in names:
        return default
    raise ConfigError(
        f"{repo_id} has several envs ({', '.join(names)}); pick one: {repo_id}@VERSION:ENV"
    )
