"""Built-in environments, found like any other env through the ``envhub.envs`` entry points.

- ``arithmetic`` (:mod:`~envhub.envs.arithmetic`): single-turn integer arithmetic, easy to hard.
- ``gsm8k`` (:mod:`~envhub.envs.gsm8k`): grade-school word problems; an offline set is shipped.
- ``calculator`` (:mod:`~envhub.envs.calculator`): long arithmetic with a calculator tool.
- ``guess-number`` and ``wordle`` (:mod:`~envhub.envs.guessing`): multi-turn guessing games.
- ``frozenlake`` (:mod:`~envhub.envs.gym_text`): a gymnasium env played in text, through the
  general :class:`~envhub.envs.gym_text.GymTextEnv` adapter.

Shared parts: :mod:`~envhub.envs.procedural` (task sets generated from a seed) and
:mod:`~envhub.envs.expressions` (exact arithmetic on expression text).
"""
