"""Harbor tasks in their own images: the container back end's side of a task.

With ``sandbox="container"`` (or ``"podman"``/``"docker"``) a :class:`~envhub.harbor.env.HarborEnv`
builds each task's ``environment/Dockerfile`` as written, every ``RUN`` step for real (network
at build time, as Harbor allows), once per content (:meth:`ContainerSandbox.build
<envhub.sandbox.container.ContainerSandbox.build>`), and runs its episodes in containers of that
image; a task with ``[environment] docker_image`` and no Dockerfile runs in that image, one with
neither in the back end's default image. Nothing in the Dockerfile is refused then but a task
of several containers (``docker-compose.yaml``).

**The image map** (``image_map: {"ubuntu:24.04": "localhost/envhub-base:bookworm"}``; keys
may be patterns, ``python:*``): a base image that cannot be pulled here runs on a stand-in,
named in every result (:attr:`TaskImage.stand_ins`). A ``FROM`` (or ``docker_image``) that the
map names is replaced before the build; the others are used as written, and a missing one
fails the build with the engine's message.

**The default map** (:data:`DEFAULT_IMAGE_MAP`) comes after the caller's: it sends the official
``python:*`` images to ``localhost/envhub-python:bookworm`` (``scripts/container_base.sh``
builds it: Debian 12's Python with pip, venv and a ``python`` command), only where that image
exists and the engine does not have the task's own (a pulled ``python:3.12-slim`` is used as
written).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envhub.errors import ConfigError
from envhub.harbor.dockerfile import map_images, mapped_image

if TYPE_CHECKING:
    from envhub.harbor.task import HarborTask
    from envhub.sandbox.base import Sandbox
    from envhub.sandbox.container import ContainerSandbox

PYTHON_STAND_IN = "localhost/envhub-python:bookworm"
DEFAULT_IMAGE_MAP = {"python:*": PYTHON_STAND_IN}
"""Stand-ins used where the caller's map names none (see the module docstring)."""
CONTAINER_BACKENDS = ("container", "podman", "docker")
"""The ``sandbox=`` names that run tasks in containers (``container``: whichever engine runs)."""


@dataclass(frozen=True)
class TaskImage:
    """The image a task's episodes run in."""

    tag: str
    """The engine's name of it."""
    source: str
    """Where it came from: ``environment/Dockerfile``, ``docker_image ...``, or the default."""
    stand_ins: dict[str, str] = field(default_factory=dict)
    """Base images replaced by the image map: the task's -> the one used."""

    def describe(self) -> str:
        """``IMAGE (from SOURCE; stand-in X for Y)``."""
        swaps = "; ".join(f"stand-in {new} for {old}" for old, new in self.stand_ins.items())
        return f"{self.tag} (from {self.source}{'; ' + swaps if swaps else ''})"


def sandbox_named(sandbox: Sandbox | str | None, **kwargs: Any) -> Sandbox | None:
    """``sandbox`` as a back end: a name (``local``, ``e2b``, or one of
    :data:`CONTAINER_BACKENDS`) made into one; an object or ``None`` as it is. ``local`` is
    ``None``: workspace envs' own local sandbox (:func:`~envhub.workspace_env.default_sandbox`,
    which shows the verifier's pytest)."""
    if sandbox is None or not isinstance(sandbox, str) or sandbox == "local":
        return None if sandbox == "local" else sandbox
    if sandbox in CONTAINER_BACKENDS:
        from envhub.sandbox.container import ContainerSandbox

        engine = None if sandbox == "container" else sandbox
        return ContainerSandbox(engine=engine, **kwargs)
    from envhub.sandbox import make_sandbox

    return make_sandbox(sandbox, **kwargs)


def build_task_image(
    task: HarborTask, sandbox: ContainerSandbox, image_map: dict[str, str]
) -> TaskImage:
    """The image of ``task``'s episodes (built now if need be; see the module docstring).

    Raises:
        SandboxError: The build failed (its output's end).
    """
    environment = task.environment_dir
    dockerfile = environment / "Dockerfile"
    lookup = image_lookup(image_map, sandbox)
    if dockerfile.is_file():
        text, stand_ins = map_images(dockerfile.read_text(encoding="utf-8"), lookup)
        tag = sandbox.build(environment, text, network=True)
        return TaskImage(tag, "environment/Dockerfile", stand_ins)
    if task.image is not None:
        return _named(task.image, f"docker_image {task.image}", lookup)
    return TaskImage(sandbox.image, "the back end's default image")


def image_lookup(
    image_map: dict[str, str], sandbox: ContainerSandbox
) -> Callable[[str], str | None]:
    """An image's stand-in: the caller's ``image_map`` first, then :data:`DEFAULT_IMAGE_MAP`
    where its stand-in exists and the engine lacks the image (each engine answer kept)."""
    has: dict[str, bool] = {}

    def exists(image: str) -> bool:
        if image not in has:
            has[image] = sandbox.engine.image_exists(image)
        return has[image]

    def lookup(image: str) -> str | None:
        chosen = mapped_image(image_map, image)
        if chosen is not None:
            return chosen
        default = mapped_image(DEFAULT_IMAGE_MAP, image)
        return default if default is not None and exists(default) and not exists(image) else None

    return lookup


def _named(image: str, source: str, lookup: Callable[[str], str | None]) -> TaskImage:
    """The image a task names outright, or its stand-in."""
    stand_in = lookup(image)
    return TaskImage(stand_in or image, source, {image: stand_in} if stand_in else {})


def build_verifier_image(
    task: HarborTask, sandbox: ContainerSandbox, image_map: dict[str, str], agents: TaskImage
) -> TaskImage:
    """The image a task's tests run in when they run apart (``[verifier] environment_mode =
    "separate"``: :mod:`envhub.harbor.separate`): its ``[verifier.environment]
    docker_image``, else its ``tests/Dockerfile`` built (context ``tests/``), else the agent's
    image ``agents`` again; the image map applies as to the agent's.

    Raises:
        SandboxError: The build failed (its output's end).
    """
    separate = task.separate
    assert separate is not None
    lookup = image_lookup(image_map, sandbox)
    if separate.dockerfile is not None:
        text, stand_ins = map_images(separate.dockerfile.read_text(encoding="utf-8"), lookup)
        tag = sandbox.build(separate.dockerfile.parent, text, network=True)
        return TaskImage(tag, "tests/Dockerfile", stand_ins)
    if separate.image is not None:
        return _named(
            separate.image, f"[verifier.environment] docker_image {separate.image}", lookup
        )
    return agents


def check_image_map(image_map: Any) -> dict[str, str]:
    """``image_map`` as a dict of image names.

    Raises:
        ConfigError: Not a mapping of strings to strings.
    """
    if image_map is None:
        return {}
    if not isinstance(image_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in image_map.items()
    ):
        raise ConfigError(
            f"image_map must map image names to image names, e.g. "
            f"{{'ubuntu:24.04': 'localhost/envhub-base:bookworm'}}; got {image_map!r}"
        )
    return dict(image_map)
