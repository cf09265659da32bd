"""vf-arith-v1: a verifiers v1 taskset of small sums, built in code (no download, no service).

Runs in the verifiers 0.4 venv (``scripts/verifiers_v1_venv.sh``), not in envhub's: the
taskset id ``vf-arith-v1`` imports this module because ``verifiers_v1_agent.py`` puts its own
folder on ``sys.path``. Each task asks for ``a + b`` with the answer in ``\\boxed{}``; two
rewards: ``correct`` (weight 1.0: the last boxed answer is the sum) and ``boxed`` (weight 0.2:
the reply has a ``\\boxed{}`` answer at all), so a right answer scores 1.2, a wrong boxed one
0.2 and an unboxed one 0.0.
"""

import random

import verifiers.v1 as vf

PROMPT = "What is {a} + {b}? Put the final answer in \\boxed{{}}."


class ArithData(vf.TaskData):
    """A sum to compute, with its answer."""

    answer: str


class ArithTask(vf.Task[ArithData]):
    """Scores the reply's last ``\\boxed{}`` answer."""

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the last boxed answer is the sum."""
        boxed = vf.extract_boxed_answer(trace.last_reply, strict=True).strip()
        return float(boxed == self.data.answer)

    @vf.reward(weight=0.2)
    async def boxed(self, trace: vf.Trace) -> float:
        """1 when the reply boxes an answer (the format asked for)."""
        return float(bool(vf.extract_boxed_answer(trace.last_reply, strict=True).strip()))


class ArithConfig(vf.TasksetConfig):
    """``--env.taskset.*``: how many sums, how large, and the seed that draws them."""

    num_tasks: int = 20
    max_value: int = 99
    seed: int = 0


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    """``num_tasks`` sums of two numbers in ``0..max_value``, drawn with ``seed``."""

    def load(self) -> list[ArithTask]:
        """The sums, the same ones for the same config."""
        rng = random.Random(self.config.seed)
        tasks = []
        for _ in range(self.config.num_tasks):
            a, b = rng.randint(0, self.config.max_value), rng.randint(0, self.config.max_value)
            data = ArithData(prompt=PROMPT.format(a=a, b=b), answer=str(a + b))
            tasks.append(ArithTask(data, self.config.task))
        return tasks


__all__ = ["ArithTaskset"]
