"""The trainer: graded trajectories in, LoRA adapter versions out (deployed through the proxy).

Read in this order: :mod:`trainer.logprobs` (the processed distribution vLLM
samples from), :mod:`trainer.advantages`, :mod:`trainer.objective` (pure
functions), :mod:`trainer.batch`, :mod:`trainer.policy` (the model and its
LoRA), :mod:`trainer.loop` (one step), :mod:`trainer.publish` (save, record,
deploy), :mod:`trainer.settings` (one validated object per run),
:mod:`trainer.runner` (what ``onthejob train`` runs).
"""
