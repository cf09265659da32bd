"""On-policy distillation: a teacher scores the student's own tokens (``distill:``).

    config      DistillConfig, TeacherConfig: the ``distill:`` section (torch-free)
    advantages  the per-token negative reverse KL, mixed with the env's advantage (pure)
    teachers    a vLLM-style server's prompt logprobs, a local checkpoint, the policy itself
    phase       the step's distillation phase: what the teacher is shown, the new advantages

The update is RL's: the teacher's signal enters as per-token advantages, so both backends, the
losses and the checkpoints are unchanged.
"""
