"""``tracewire train``: an RL loop on CPU that trains the built-in model on recorded samples.

It shows what the recorded data is for: group rollouts through the proxy, samples as the
session API serves them, the trainer–sampler logprob mismatch (exactly 0 here), a clipped
importance-weighted policy-gradient update, and new weights swapped into the live server.
"""

from ._cli import COMMAND
from ._loop import StepSummary, TrainConfig, TrainResult, train
from ._objective import group_advantages, pg_coefficients

__all__ = [
    "COMMAND",
    "StepSummary",
    "TrainConfig",
    "TrainResult",
    "group_advantages",
    "pg_coefficients",
    "train",
]
