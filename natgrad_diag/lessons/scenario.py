"""The seed scenario: the exact setup of the GPflow user whose question started this package."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["SeedScenario", "seed_scenario"]

#: q_mu of the user's report, [M, L] = [5, 1].
SEED_Q_MU = ((0.93350756,), (0.15833747,), (0.23830378,), (0.28742445,), (0.14999759,))


@dataclass(frozen=True)
class SeedScenario:
    """Fresh GPflow Parameters and the gradients the user fed to the natural-gradient step.

    Attributes:
        q_mu: ``gpflow.Parameter`` [M, L], identity transform.
        q_sqrt: ``gpflow.Parameter`` [L, M, M] with ``gpflow.utilities.triangular()``; its
            unconstrained variable is [L, M(M+1)/2].
        q_mu_grad: [M, L], plays dL/dq_mu (unconstrained): ``0.33 · q_mu.unconstrained_variable``.
        q_sqrt_grad: [L, M(M+1)/2], plays dL/dq_sqrt (unconstrained): ``q_sqrt.unconstrained_variable``.
    """

    q_mu: Any
    q_sqrt: Any
    q_mu_grad: Any
    q_sqrt_grad: Any

    def __iter__(self) -> Iterator[Any]:  # so that ``natgrad_trace(*seed_scenario())`` works
        return iter((self.q_mu, self.q_sqrt, self.q_mu_grad, self.q_sqrt_grad))


def seed_scenario() -> SeedScenario:
    """Build the user's setup exactly (float64, M = 5, L = 1), with new Parameters on every call.

    Example:
        >>> from natgrad_diag import natgrad_trace, seed_scenario
        >>> trace = natgrad_trace(*seed_scenario())
    """
    import gpflow
    import tensorflow as tf

    q_mu = gpflow.Parameter(list(map(list, SEED_Q_MU)), dtype=tf.float64)
    q_sqrt = gpflow.Parameter(
        tf.eye(5, batch_shape=[1], dtype=tf.float64), transform=gpflow.utilities.triangular()
    )
    q_mu_grad = tf.convert_to_tensor(q_mu.unconstrained_variable) * 0.33
    q_sqrt_grad = tf.convert_to_tensor(q_sqrt.unconstrained_variable)
    return SeedScenario(q_mu=q_mu, q_sqrt=q_sqrt, q_mu_grad=q_mu_grad, q_sqrt_grad=q_sqrt_grad)
