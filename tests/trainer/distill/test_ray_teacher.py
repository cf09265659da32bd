"""A local teacher in a Ray actor (the Megatron backend's kind), on a real local Ray cluster:
it scores exactly as the same checkpoint in this process, refuses another vocabulary with the
same message, reports its death by name, and is gone after ``aclose``. A Megatron run with it
trains in ``tests/e2e/test_train_megatron.py``."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")

import transformers  # noqa: E402

from envhub.errors import ConfigError, EngineError  # noqa: E402
from envhub.trainer.cluster.ray_runtime import LOCAL_SYSTEM_CONFIG  # noqa: E402
from envhub.trainer.distill.choice import make_teacher  # noqa: E402
from envhub.trainer.distill.config import TeacherConfig  # noqa: E402
from envhub.trainer.distill.ray_teacher import RayTeacher  # noqa: E402
from envhub.trainer.distill.teachers import LocalTeacher  # noqa: E402

SEQUENCES = [[1, 17, 230, 5, 99], [400, 12], [7, 8, 9, 10, 11, 12, 13, 14]]


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, _system_config=LOCAL_SYSTEM_CONFIG)
    yield
    ray.shutdown()


def test_the_actor_scores_as_the_checkpoint_in_this_process(
    cluster: None, tiny_model_dir: Path
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)

    async def both() -> tuple[list[list[float]], list[list[float]], str]:
        remote, here = (
            RayTeacher(str(tiny_model_dir), 64),
            LocalTeacher(str(tiny_model_dir), "cpu", 64),
        )
        await remote.start(tokenizer)
        await here.start(tokenizer)
        try:
            return (
                await remote.logprobs(SEQUENCES),
                await here.logprobs(SEQUENCES),
                remote.describe(),
            )
        finally:
            await remote.aclose()
            await here.aclose()

    got, expected, described = asyncio.run(both())
    assert [len(x) for x in got] == [4, 1, 7]
    assert got == expected  # same device, same dtype, same micro-batches: the same numbers
    assert described == f"{tiny_model_dir} (Ray actor on node {ray.util.get_node_ip_address()})"


def test_another_vocabulary_is_refused_with_the_local_teachers_message(
    cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    tokenizer = transformers.AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<teacher-only>"])
    tokenizer.save_pretrained(other)
    teacher = RayTeacher(str(other))
    with pytest.raises(ConfigError, match=r"reads token 49152 as '<teacher-only>'") as caught:
        asyncio.run(teacher.start(transformers.AutoTokenizer.from_pretrained(tiny_model_dir)))
    assert "Traceback" not in str(caught.value)  # the reason, not Ray's report of it
    asyncio.run(teacher.aclose())


def test_a_dead_teacher_is_named(cluster: None, tiny_model_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    teacher = RayTeacher(str(tiny_model_dir))
    asyncio.run(teacher.start(tokenizer))
    actor = teacher._actor
    ray.kill(actor, no_restart=True)
    with pytest.raises(
        EngineError, match=rf"^the teacher {tiny_model_dir} \(Ray actor\) failed to score: died"
    ):
        asyncio.run(teacher.logprobs(SEQUENCES))
    asyncio.run(teacher.aclose())
    assert teacher._actor is None


def test_beside_ranks_on_ray_a_local_teacher_is_an_actor(tiny_model_dir: Path) -> None:
    config = TeacherConfig(kind="local", model=str(tiny_model_dir), gpus=0.5)
    budget = SimpleNamespace(backend=SimpleNamespace(micro_batch_tokens=512))

    def backend(device: str, group: object) -> SimpleNamespace:
        return SimpleNamespace(device=SimpleNamespace(type=device), group=group, config=budget)

    on_gpus = make_teacher(config, backend("cuda", object()))
    on_cpus = make_teacher(config, backend("cpu", object()))
    in_process = make_teacher(config, backend("cpu", None))
    assert isinstance(on_gpus, RayTeacher) and (on_gpus.gpus, on_gpus.micro_batch_tokens) == (
        0.5,
        512,
    )
    assert isinstance(on_cpus, RayTeacher) and on_cpus.gpus == 0.0
    assert isinstance(in_process, LocalTeacher)
    with pytest.raises(ValueError, match="gpus is a local teacher's, not server"):
        TeacherConfig(kind="server", url="http://127.0.0.1:1", gpus=1)


@pytest.mark.gpu
def test_on_a_gpu_the_actor_takes_it_and_scores_as_the_gpu_here(
    cluster: None, tiny_model_dir: Path
) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gpus = ray.cluster_resources().get("GPU", 0.0)  # the cluster found the machine's
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)

    async def both() -> tuple[list[list[float]], list[list[float]], float]:
        remote = RayTeacher(str(tiny_model_dir), 64, gpus=0.5)
        here = LocalTeacher(str(tiny_model_dir), "cuda", 64)
        await remote.start(tokenizer)
        await here.start(tokenizer)
        try:
            free = ray.available_resources().get("GPU", 0.0)
            return await remote.logprobs(SEQUENCES), await here.logprobs(SEQUENCES), free
        finally:
            await remote.aclose()
            await here.aclose()

    got, expected, free = asyncio.run(both())
    assert free == gpus - 0.5  # the actor holds half of a GPU
    for a, b in zip(got, expected, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
