"""Supervised fine-tuning on demonstrations: the warm start before RL and its auxiliary term.

    config          SFTConfig, DemoSource: the ``sft:`` section (torch-free)
    sources         conversations from an env's reference policy, recorded episodes, datasets
    demonstrations  rendered with the policy's chat template, token-exact; the batch of a step
    step            one supervised update (the warm start's steps)

The loss is the objective's supervised term (``algorithms.objective``): cross-entropy on the
assistant turns' tokens, in the same micro-batches, backends and checkpoints as RL.
"""
