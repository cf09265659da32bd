"""Which Hub commit an installed env package came from.

``envhub install`` has pip install each package from a folder named after its commit
(``.../build/<owner>--<name>/<commit>``), and pip records that folder in the distribution's
``direct_url.json`` (PEP 610). Reading it back needs neither the network nor a file of our own,
and it stays true for as long as that installation exists.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import metadata
from typing import Any

from envhub.types import EnvRef

_SOURCE = re.compile(r"/(?P<owner>[^/]+)--(?P<name>[^/]+)/(?P<commit>[0-9a-f]{40})/?$")


def install_source(distribution: str) -> tuple[str, str] | None:
    """(repo_id, commit) of an installed distribution that ``envhub install`` put there, or None."""
    try:
        text = metadata.distribution(distribution).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    return source_of_url(json.loads(text).get("url", "")) if text else None


def source_of_url(url: str) -> tuple[str, str] | None:
    """(repo_id, commit) of a ``direct_url.json`` URL that ``envhub install`` wrote, or None."""
    match = _SOURCE.search(url)
    return (f"{match['owner']}/{match['name']}", match["commit"]) if match else None


def env_ref(env: Any) -> EnvRef:
    """``env.ref`` with the commit filled in when the env's package was installed from the Hub."""
    ref: EnvRef = env.ref
    if ref.commit is not None:
        return ref
    module = type(env).__module__.split(".")[0]
    for distribution in _distributions(module):
        source = install_source(distribution)
        if source is not None:
            return ref.model_copy(update={"commit": source[1]})
    return ref


@functools.cache
def _distributions(module: str) -> tuple[str, ...]:
    """The distributions that provide top-level ``module``, read once per module: mapping every
    installed distribution's files costs ~0.7 s (measured), once per runner before this."""
    if module == "envhub":  # the built-in envs ship with envhub itself, never from the Hub
        return ()
    return tuple(metadata.packages_distributions().get(module, []))
