"""The envhub trainer (``envhub.trainer``): RL fine-tuning of a model on envhub environments.

:func:`~envhub.trainer.loop.train` runs the loop (tasks -> rollouts -> rewards -> advantages ->
update -> weight sync) from a :class:`~envhub.trainer.config.TrainConfig`. Around it: the
algorithms (``algorithms/``), the train backends (``backends/``, ``megatron/``), the rollout
engines (``engines/``), the weights' path to vLLM (``weight_sync/``), checkpoints
(``checkpoint/``) and the Ray layer (``cluster/``). Needs the ``train`` extra (torch); nothing
here is imported by ``import envhub``.
"""
