"""How the engine and the trainer share the CPU cores (``trainer/cores.py``): the split chosen
by hand for 1, 2, 4 and 16 cores and for measured phases, synchronous runs and GPU placements
left as they were, the header's words, and the overlap bound's arithmetic."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.trainer.config import validate_config
from envhub.trainer.cores import (
    BIND_ENV,
    CoreSplit,
    PhaseTimes,
    async_advice,
    choose_split,
    engine_share,
    overlap_bound,
    overlap_gain,
    phases_of_run,
    process_group_cpu_seconds,
    split_step,
)


def _config(staleness: int = 1, **overrides: object) -> object:
    """A vLLM run's config; the split is asked for (``cpu_cores: auto``) unless overridden."""
    data: dict = {
        "envs": [{"name": "arithmetic"}],
        "rollout": {"engine": "vllm", "max_staleness": staleness, "vllm": {"cpu_cores": "auto"}},
    }
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return validate_config(data)


def _split(config: object, cores: int, **kwargs: object) -> CoreSplit:
    return choose_split(config, on_gpu=False, cores=range(cores), environ={}, **kwargs)


# -- the split, from the machine ----------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "engine", "trainer"),
    [(2, (1,), 1), (4, (2, 3), 2), (16, tuple(range(8, 16)), 8)],
)
def test_an_async_run_gives_the_engine_the_last_half_of_the_cores(
    cores: int, engine: tuple[int, ...], trainer: int
) -> None:
    split = _split(_config(), cores)

    assert (split.engine, split.trainer_threads, split.mode) == (engine, trainer, "async")
    assert split.engine_env() == {BIND_ENV: ",".join(map(str, engine))}
    assert split.update_threads(engine_busy=True) == trainer
    assert split.update_threads(engine_busy=False) == cores  # the engine's cores would idle
    assert split.source == "from the machine, fixed before vLLM starts"


def test_one_core_cannot_be_split_and_the_header_says_async_cannot_gain() -> None:
    split = _split(_config(), 1)

    assert (split.engine, split.trainer_threads, split.mode) == (None, None, "shared")
    assert split.engine_env() == {}
    assert split.update_threads(engine_busy=True) is None
    assert split.describe() == "engine and trainer share 1 core (async; one core, nothing to split)"
    assert async_advice(_config(), split, None) == (
        "async cannot gain here: vLLM and the trainer share one core, so overlapping them "
        "saves nothing; set rollout.max_staleness: 0"
    )


def test_the_machine_is_this_process_affinity() -> None:
    split = choose_split(_config(), on_gpu=False, environ={})

    assert split.cores == tuple(sorted(os.sched_getaffinity(0)))


# -- synchronous runs and other placements are left as they were ----------------------------


@pytest.mark.parametrize("cores", [1, 2, 4, 16])
def test_a_synchronous_run_keeps_its_settings(cores: int) -> None:
    split = _split(_config(staleness=0), cores)

    assert split == CoreSplit(tuple(range(cores)))
    assert (split.engine_env(), split.update_threads(True), split.update_threads(False)) == (
        {},
        None,
        None,
    )
    assert split.describe() is None
    assert async_advice(_config(staleness=0), split, None) is None


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # the trainer on a GPU (the call says on_gpu)
        {"rollout__vllm__mode": "ray"},
        {"rollout__vllm__url": "http://127.0.0.1:8000"},
        {"backend__kind": "megatron"},
        {"rollout__engine": "hf", "rollout__max_staleness": 0},
    ],
)
def test_gpu_and_other_placements_are_left_as_they_were(overrides: dict) -> None:
    config = _config(**overrides)
    on_gpu = not overrides

    split = choose_split(config, on_gpu=on_gpu, cores=range(16), environ={})

    assert split == CoreSplit(tuple(range(16)), mode="placed")
    assert (split.engine_env(), split.update_threads(True), split.describe()) == ({}, None, None)


def test_a_gpu_engine_gets_no_cpu_binding_even_when_given_one() -> None:
    from envhub.trainer.engines.vllm import resolve_settings
    from envhub.trainer.engines.vllm_transport import server_env

    gpu = resolve_settings(_config(), "/m", on_gpu=True, cpu_bind="1")
    cpu = resolve_settings(_config(), "/m", on_gpu=False, cpu_bind="1")

    assert gpu == resolve_settings(_config(), "/m", on_gpu=True)  # the same as before
    assert BIND_ENV not in server_env(gpu)
    assert cpu.cpu_bind == "1" and server_env(cpu)[BIND_ENV] == "1"
    assert BIND_ENV not in server_env(resolve_settings(_config(), "/m", on_gpu=False))


# -- overrides ----------------------------------------------------------------------------


def test_the_config_sets_the_engine_share_and_torch_threads() -> None:
    asked = _split(_config(rollout__vllm__cpu_cores=3), 4)
    threads = _split(_config(rollout__vllm__cpu_cores=1, backend__threads=2), 4)
    too_many = _split(_config(rollout__vllm__cpu_cores=9), 4)

    assert (asked.engine, asked.trainer_threads, asked.source) == (
        (1, 2, 3),
        1,
        "rollout.vllm.cpu_cores",
    )
    assert (threads.engine, threads.update_threads(True), threads.update_threads(False)) == (
        (3,),
        2,
        2,  # backend.threads is the user's: kept while the engine idles too
    )
    assert (too_many.engine, too_many.trainer_threads) == ((1, 2, 3), 1)  # one left to train
    assert threads.describe() == ("engine 1 / trainer 2 (async, 4 cores; rollout.vllm.cpu_cores)")


def test_cpu_cores_zero_shares_them_and_a_sync_run_may_ask_for_a_split() -> None:
    shared = _split(_config(rollout__vllm__cpu_cores=0), 4)
    sync = _split(_config(staleness=0, rollout__vllm__cpu_cores=1), 4)

    assert (shared.engine, shared.trainer_threads, shared.mode) == (None, None, "shared")
    assert (sync.engine, sync.trainer_threads, sync.mode) == ((3,), 3, "sync")
    assert sync.describe() == "engine 1 / trainer 3 (sync, 4 cores)"


def test_a_binding_the_user_set_wins() -> None:
    split = choose_split(_config(), on_gpu=False, cores=range(4), environ={BIND_ENV: "0-1"})

    assert (split.engine, split.trainer_threads, split.mode) == (None, None, "shared")
    assert split.describe() == (
        f"engine and trainer share 4 cores (async; {BIND_ENV} is set, left as it is)"
    )


# -- the split, from measured phases ------------------------------------------------------

LATENCY = PhaseTimes(rollout=19.2, update=29.4, sync=2.0, generation_cpu=14.0)
"""Issue 44's latency run at k=0 on 2 cores, with 7 s of both cores' generation."""
BUSY_ENGINE = PhaseTimes(rollout=40.0, update=8.0, sync=0.0, generation_cpu=120.0)
"""A rollout that is nearly all generation (30 s of 4 cores), a short update."""


def test_the_predicted_step_of_a_split_by_hand() -> None:
    # 2 cores, 1 for the engine: the rollout's 7 s of generation takes 14 s on 1 core,
    # the update and sync take twice as long on the other.
    assert split_step(LATENCY, 2, 1) == pytest.approx(max(19.2 - 7 + 14, 31.4 * 2))
    # 4 cores: generation 30 s on 4 cores; on 3 it takes 40, the trainer's 8 s takes 32 on 1.
    assert split_step(BUSY_ENGINE, 4, 3) == pytest.approx(max(40 - 30 + 40, 32.0))
    assert split_step(BUSY_ENGINE, 4, 2) == pytest.approx(max(40 - 30 + 60, 16.0))


def test_measured_phases_choose_the_shortest_predicted_step() -> None:
    assert engine_share(2, LATENCY) == 1  # the only split
    assert engine_share(4, BUSY_ENGINE) == 3  # 50 s against 70 s (2) and 130 s (1)
    # 16 cores: the rollout takes 32.5 + 120/e s, the trainer 128/(16 - e) s: e = 11 gives
    # 43.4 s, 12 gives max(42.5, 32.0), 13 gives max(41.7, 42.7).
    assert engine_share(16, BUSY_ENGINE) == 12
    update_bound = PhaseTimes(rollout=10.0, update=30.0, sync=2.0, generation_cpu=16.0)
    assert engine_share(4, update_bound) == 1  # the trainer's 32 s needs the cores
    assert engine_share(1, LATENCY) == 1 and engine_share(1) == 1  # nothing to split

    split = _split(_config(), 4, phases=BUSY_ENGINE)
    assert (split.engine, split.trainer_threads) == ((1, 2, 3), 1)
    assert split.source == "from the earlier steps' phase times"


# -- the overlap bound --------------------------------------------------------------------


def test_the_overlap_bound_by_hand() -> None:
    # The async note's bf16 row: R 16.0, update 12.0, sync 1.4, generation 7.7 s of 2 cores.
    bf16 = PhaseTimes(rollout=16.0, update=12.0, sync=1.4, generation_cpu=15.4)

    assert bf16.generation(2) == pytest.approx(7.7)
    assert bf16.work(2) == pytest.approx(21.1)
    assert overlap_bound(bf16, 2) == pytest.approx(2 - 7.7 / 21.1)  # 1.635
    assert overlap_gain(bf16, 2) == pytest.approx(29.4 / 21.1)  # the 1.39x measured
    # R = W: perfect overlap reaches the bound.
    even = PhaseTimes(rollout=10.0, update=6.0, sync=0.0, generation_cpu=8.0)
    assert overlap_gain(even, 2) == pytest.approx(overlap_bound(even, 2)) == pytest.approx(1.6)
    # R > W: the rollout's wall time bounds the step.
    slow_tools = PhaseTimes(rollout=30.0, update=6.0, sync=0.0, generation_cpu=8.0)
    assert overlap_gain(slow_tools, 2) == pytest.approx(36 / 30)
    assert overlap_bound(PhaseTimes(0.0, 0.0, 0.0, 0.0), 2) == 1.0


def test_phases_that_overlap_cannot_speed_up_make_the_header_recommend_sync() -> None:
    split = _split(_config(), 2)
    # Generation is nearly all the CPU work.
    generation_bound = PhaseTimes(rollout=20.0, update=0.5, sync=0.0, generation_cpu=38.0)
    # The rollout is all generation on both cores (R = G): 2 - G/W says 1.52x, but nothing of
    # the rollout leaves the cores free for the update.
    all_generation = PhaseTimes(rollout=10.0, update=10.0, sync=1.0, generation_cpu=20.0)

    assert overlap_gain(generation_bound, 2) == pytest.approx(20.5 / 20)
    assert (overlap_bound(all_generation, 2), overlap_gain(all_generation, 2)) == pytest.approx(
        (2 - 10 / 21, 1.0)
    )
    assert async_advice(_config(), split, generation_bound) == (
        "async cannot gain here: the earlier synchronous steps took R = 20.0 s to roll out, "
        "19.0 s of it generation on all 2 cores, and W = 19.5 s of CPU work (update 0.5 + "
        "sync 0.0 + generation), so overlapping them is at most (R + update + sync) / "
        "max(R, W) = 1.02x faster; set rollout.max_staleness: 0"
    )
    assert "= 1.00x faster" in async_advice(_config(), split, all_generation)
    assert async_advice(_config(), split, LATENCY) is None  # perfect overlap: 1.32x
    assert async_advice(_config(), split, None) is None  # nothing measured yet
    assert async_advice(_config(staleness=0), _split(_config(staleness=0), 2), LATENCY) is None


def test_phases_come_from_the_synchronous_steps_a_run_already_took(tmp_path: Path) -> None:
    rows = [
        {"step": 0, "eval/reward": 0.5},  # the baseline evaluation
        {"step": 1, "time/rollout": 10.0, "time/update": 4.0, "time/logprobs": 1.0,
         "time/sync": 1.0, "engine/cpu_s": 12.0},
        {"step": 2, "time/rollout": 12.0, "time/update": 6.0, "time/sync": 1.0,
         "engine/cpu_s": 16.0},
        {"step": 3, "time/rollout": 0.0, "time/update": 9.0, "time/sync": 1.0,
         "engine/cpu_s": 16.0, "async/staleness_mean": 1.0},  # async: the wait is no rollout
        {"step": 4, "time/rollout": 5.0, "time/update": 2.0},  # no engine CPU time measured
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "time/'  # a torn line
    )

    assert phases_of_run(tmp_path) == PhaseTimes(
        rollout=11.0, update=5.5, sync=1.0, generation_cpu=14.0
    )
    assert phases_of_run(tmp_path / "missing") is None
    assert PhaseTimes.from_history(rows[3:]) is None


# -- measuring the engine, setting torch's threads --------------------------------------------


BURN_THEN_SLEEP = (
    "import time\n"
    "end = time.process_time() + 0.4\n"
    "while time.process_time() < end: pass\n"
    "print('burnt', flush=True)\n"
    "time.sleep(120)\n"
)


def test_a_process_group_cpu_time_counts_every_live_member() -> None:
    # A leader (as a vLLM server leads its group) and two children that each burn 0.4 s of CPU.
    burn = f"{shlex.quote(sys.executable)} -c {shlex.quote(BURN_THEN_SLEEP)}"
    leader = subprocess.Popen(
        ["sh", "-c", f"{burn} & {burn} & wait"],
        start_new_session=True, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert [leader.stdout.readline() for _ in range(2)] == ["burnt\n", "burnt\n"]
        seconds = process_group_cpu_seconds(leader.pid)
        assert seconds is not None and seconds >= 0.8
        assert seconds < 0.8 + 10  # two interpreters' start-up, not this test's process
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
        leader.stdout.close()
    assert (process_group_cpu_seconds(os.getpgrp()) or 0.0) > 0.0  # this test's own group


BALANCED_UPDATE = """
import json, threading
import torch
from envhub.trainer.config import validate_config
from envhub.trainer.cores import ThreadBalancer, choose_split

torch.set_num_threads(2)
looks = [0]  # how often the balancer asked whether the engine works
threads_in_backward = []


def engine_busy():
    looks[0] += 1
    return looks[0] <= 4  # the start and 3 tensors of the forward pass; then done


class Spy(torch.autograd.Function):
    # records torch's threads when the backward pass reaches it (the model's input)
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        threads_in_backward.append(torch.get_num_threads())
        return grad


model = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(4)), torch.nn.Tanh())


def update():
    x = Spy.apply(torch.ones(2, 8, requires_grad=True))
    threads_in_forward = torch.get_num_threads()
    model(x).sum().backward()
    return f"updated with {threads_in_forward} in the forward pass"


def split(staleness):
    rollout = {"engine": "vllm", "max_staleness": staleness, "vllm": {"cpu_cores": "auto"}}
    config = validate_config({"envs": [{"name": "arithmetic"}], "rollout": rollout})
    return choose_split(config, on_gpu=False, cores=range(2), environ={})


balancer = ThreadBalancer(split(1), engine_busy)
unchanged = ThreadBalancer(split(0), lambda: True)
seen = []


def worker():
    before = torch.get_num_threads()
    seen.append(balancer.run(update))
    seen.append(torch.get_num_threads() - before)  # set back
    seen.append(unchanged.run(lambda: torch.get_num_threads() - before))


thread = threading.Thread(target=worker)
thread.start()
thread.join()
print(json.dumps({
    "seen": seen, "backward": threads_in_backward, "looks": looks[0],
    "checks": balancer.checks, "metrics": balancer.metrics(),
    "unchanged": [unchanged.checks, unchanged.metrics()],
}))
"""


def test_torch_threads_follow_the_engine_through_forward_and_backward_and_are_set_back() -> None:
    """In a process of its own: torch's thread settings are process-wide, and changing them
    here changes the floating-point sums of the training tests that run after."""
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-c", BALANCED_UPDATE], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    looks = result["looks"]
    assert result["seen"] == ["updated with 1 in the forward pass", 0, 0]
    assert result["backward"] == [2]  # the rollout ended meanwhile: every core
    assert result["checks"] == looks > 4
    assert result["metrics"] == {"cores/trainer_threads": (4 + 2 * (looks - 4)) / looks}
    assert result["unchanged"] == [0, {}]


def test_rollout_workers_pin_themselves_to_the_engine_share() -> None:
    from envhub.trainer.rollout_workers import CORES_ENV, _affinity_env

    assert _affinity_env((2, 3)) == {CORES_ENV: "2,3"}
    assert _affinity_env(None) == {} and _affinity_env(()) == {}
    first = min(os.sched_getaffinity(0))
    pinned = subprocess.run(
        [sys.executable, "-c",
         "import os\nfrom envhub.trainer.rollout_workers import _pin_to_cores\n"
         f"_pin_to_cores({str(first)!r}); print(sorted(os.sched_getaffinity(0)))\n"
         "_pin_to_cores('999'); print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    # A core the machine lacks leaves the placement as it was.
    assert pinned.stdout.splitlines() == [f"[{first}]", f"[{first}]"]


def _async_bench():  # noqa: ANN202
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("async_train", root / "bench" / "async_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_async_bench_prints_the_bounds_beside_each_ratio(monkeypatch) -> None:
    import envhub.trainer.cores as cores

    bench = _async_bench()
    monkeypatch.setattr(cores, "machine_cores", lambda: (0, 1))
    sync = {"wall_s": 52.0, "rss_gib": 1.0, "time/rollout": 19.2, "time/update": 29.4,
            "time/sync": 2.0, "engine/cpu_s": 14.0}  # fmt: skip
    overlapped = {"wall_s": 45.0, "rss_gib": 1.0, "time/rollout": 0.0, "time/update": 40.0,
                  "time/sync": 2.0, "engine/cpu_s": 14.0, "async/staleness_mean": 1.0}  # fmt: skip
    results = {
        "latency": {"0": bench.summary([sync] * 3, 1), "1": bench.summary([overlapped] * 3, 1)}
    }

    head, _, base, k1 = bench.table(results).splitlines()
    # G = 14/2 = 7 s, W = 29.4 + 2 + 7 = 38.4 s: 2 - G/W = 1.82; perfect (19.2 + 31.4) / 38.4.
    assert head.split()[9:12] == ["2-G/W", "perfect", "reached"]
    assert base.split()[5:9] == ["1.00x", "1.82x", "1.32x", "-"]
    assert k1.split()[5:9] == ["1.16x", "1.82x", "1.32x", "88%"]  # 52/45 = 1.156 of 1.318


def test_the_learning_study_folds_evaluations_into_the_steps_and_reads_the_last_held_out() -> None:
    bench = _async_bench()
    rows = [
        {"wall_s": 30.0, "eval/reward": 0.0},  # the baseline eval, before step 1
        *({"wall_s": 10.0, "reward/mean": r} for r in (0.2, 0.4, 0.6)),
        {"wall_s": 5.0, "eval/reward": 0.5},  # the eval after the last step
    ]
    steps = bench.training_rows(rows)
    assert [s["wall_s"] for s in steps] == [40.0, 10.0, 15.0]  # the run's 75 s, all counted
    assert [s.get("eval/reward") for s in steps] == [0.0, None, 0.5]
    row = bench.learning_row([steps, steps[:2]], mark=50.0)
    assert row["held_out"] == (0.5 + 0.0) / 2  # each run's last evaluation
    assert row["wall_s"] == (65.0 + 50.0) / 2
    assert row["reward_at_mark"] == pytest.approx(0.3)  # the steps that ended by 50 s: 0.2, 0.4


def test_the_interop_pool_is_capped_only_by_a_split_and_only_before_it_starts() -> None:
    pytest.importorskip("torch")
    script = (
        "import torch\n"
        "from envhub.trainer.cores import CoreSplit, limit_interop_threads\n"
        "print(limit_interop_threads(CoreSplit((0, 1))))\n"
        "print(limit_interop_threads(CoreSplit((0, 1), (1,), 1, 2, 'async')))\n"
        "print(torch.get_num_interop_threads())\n"
        "torch.jit.wait(torch.jit.fork(torch.add, torch.ones(1), 1))\n"  # the pool starts
        "print(limit_interop_threads(CoreSplit((0, 1), (1,), 1, 2, 'async')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout  # fmt: skip
    assert out.splitlines() == ["False", "True", "1", "False"]


def test_the_update_watches_the_engine_requests_or_with_workers_the_episodes() -> None:
    from types import SimpleNamespace

    from envhub.trainer.step import _engine_working

    engine = SimpleNamespace(generating=0)
    producer = SimpleNamespace(workers=None, busy=True)  # episodes wait on tools
    here = _engine_working(SimpleNamespace(engine=engine, producer=producer))
    assert here() is False
    engine.generating = 3
    assert here() is True

    producer.workers = object()  # the workers send the requests: the driver cannot see them
    with_workers = _engine_working(SimpleNamespace(engine=engine, producer=producer))
    engine.generating = 0
    assert with_workers() is True
    producer.busy = False
    assert with_workers() is False


def test_without_cpu_cores_an_async_run_splits_as_auto_and_a_sync_run_keeps_every_core() -> None:
    default = _split(_config(rollout__vllm__cpu_cores=None), 2)
    assert default == _split(_config(rollout__vllm__cpu_cores="auto"), 2)
    assert (default.engine, default.trainer_threads, default.splits) == ((1,), 1, True)
    assert default.describe() == (
        "engine 1 / trainer 1 (async, 2 cores; from the machine, fixed before vLLM starts; "
        "the trainer takes 2 while the engine idles)"
    )
    assert _split(_config(staleness=0, rollout__vllm__cpu_cores=None), 2) == CoreSplit(
        tuple(range(2))
    )
