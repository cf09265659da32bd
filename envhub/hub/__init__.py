"""Env packages on the Hugging Face Hub: push, pull, install, load, pin, search.

``huggingface_hub`` is imported only inside the functions that talk to the Hub.
"""

from __future__ import annotations

from envhub.hub.client import REPO_TYPE, HubRef, is_hub_ref, parse_ref
from envhub.hub.install import (
    InstallResult,
    Pulled,
    Resolved,
    install,
    install_locked,
    pull,
    resolve,
    verify,
)
from envhub.hub.load import make_from_hub
from envhub.hub.lock import LOCK_FILE, LockEntry, read_lock
from envhub.hub.push import PushResult, push
from envhub.hub.search import HubPackage, search

__all__ = [
    "LOCK_FILE",
    "REPO_TYPE",
    "HubPackage",
    "HubRef",
    "InstallResult",
    "LockEntry",
    "PushResult",
    "Pulled",
    "Resolved",
    "install",
    "install_locked",
    "is_hub_ref",
    "make_from_hub",
    "parse_ref",
    "pull",
    "push",
    "read_lock",
    "resolve",
    "search",
    "verify",
]
