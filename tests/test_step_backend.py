"""step_backend: which code computes the step, and that natgrad_trace and the drop-in optimizer follow its answer.

Oracles: the LAPACK record (itself tested against GPflow's optimizer and the autodiff record in test_lapack_step)
for the TensorFlow closed form a GPU would run. The two are backward-stable computations of the same quantities by
different formulas: they differ by a forward error of order ε·κ(S)·scale (Higham 2002, §1.6), bounded here by
``rounding_bound``'s 100·ε·κ(S)·scale with κ(S) the worst over the latent GPs (as in test_compiled).
"""

from __future__ import annotations

from dataclasses import dataclass

import gpflow
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from gpflow.optimizers import XiNat, XiSqrtMeanVar

import natgrad_diag as nd
from natgrad_diag.exceptions import InputError
from natgrad_diag.step import backend as backend_module
from natgrad_diag.step import trace as trace_module
from natgrad_diag.step.backend import StepBackend, step_backend
from natgrad_diag.step.lapack import natgrad_record_lapack
from natgrad_diag.tolerance import rounding_bound
from tests.conftest import random_q

XIS = {"nat": XiNat, "sqrtmeanvar": XiSqrtMeanVar}


class MyFillTriangular(tfp.bijectors.FillTriangular):
    """A user's subclass of GPflow's triangular() bijector: the class's path."""


class MyXiNat(XiNat):
    """A subclass of XiNat, which may override the maps the closed form relies on: autodiff."""


class MyXiSqrtMeanVar(XiSqrtMeanVar):
    """The same for XiSqrtMeanVar."""


@dataclass(frozen=True)
class Placed:
    """Anything with a ``device`` string, as a tensor has: where the step's tensors live."""

    device: str


GPU = "/job:localhost/replica:0/task:0/device:GPU:0"
CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
def test_step_backend__a_lower_fill_triangular_subclass_takes_the_class_path(xi):
    want = StepBackend("lapack", xi)
    assert step_backend(XIS[xi](), gpflow.utilities.triangular()) == want
    assert step_backend(XIS[xi](), MyFillTriangular()) == want
    assert step_backend(XIS[xi](), MyFillTriangular(upper=False)) == want


@pytest.mark.parametrize(
    "xi_transform, q_sqrt_transform",
    [
        (XiNat(), tfp.bijectors.FillTriangular(upper=True)),
        (XiSqrtMeanVar(), MyFillTriangular(upper=True)),
        (XiNat(), None),
        (XiSqrtMeanVar(), tfp.bijectors.Identity()),
        (MyXiNat(), gpflow.utilities.triangular()),
        (MyXiSqrtMeanVar(), gpflow.utilities.triangular()),
    ],
    ids=["upper-FillTriangular", "upper-subclass", "no-transform", "Identity", "XiNat-subclass", "XiSqrtMeanVar-subclass"],
)
def test_step_backend__no_closed_form_runs_gpflows_autodiff(xi_transform, q_sqrt_transform):
    got = step_backend(xi_transform, q_sqrt_transform)
    assert got == StepBackend("autodiff") and got.xi is None
    assert step_backend(xi_transform, q_sqrt_transform, Placed(GPU)) == StepBackend("autodiff")


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
def test_step_backend__tensors_on_a_gpu_take_the_tensorflow_closed_form_not_lapack(xi):
    assert not tf.config.list_logical_devices("GPU"), "this test reads the device strings of a CPU-only machine"
    tri = gpflow.utilities.triangular()
    assert step_backend(XIS[xi](), tri, Placed(CPU), Placed(CPU)) == StepBackend("lapack", xi)
    for placed in [(Placed(GPU),), (Placed(CPU), Placed(GPU)), (Placed("/device:gpu:1"),)]:
        got = step_backend(XIS[xi](), tri, *placed)
        assert got == StepBackend("closed_form", xi), placed


# ---- natgrad_trace and the drop-in optimizer on a (simulated) GPU ---------------------------------------------


@pytest.fixture
def on_gpu(monkeypatch):
    """The device probe answers "GPU", as it would on a machine with one; nothing else is replaced."""
    monkeypatch.setattr(backend_module, "_on_gpu", lambda tensors: True)
    assert step_backend(XiNat(), gpflow.utilities.triangular()).code == "closed_form"


def _problem(M: int, L: int, seed: int):
    q_mu, q_sqrt = random_q(M, L, seed=seed)
    p_mu, p_sq = gpflow.Parameter(q_mu), gpflow.Parameter(q_sqrt, transform=gpflow.utilities.triangular())
    rng = np.random.default_rng(seed + 1)
    g_mu = tf.constant(0.1 * rng.normal(size=q_mu.shape))
    g_sq = tf.constant(0.1 * rng.normal(size=p_sq.unconstrained_variable.shape))
    return p_mu, p_sq, g_mu, g_sq


def _bound(want: np.ndarray, q_sqrt: np.ndarray) -> float:
    kappa = float(np.max(np.linalg.cond(q_sqrt @ np.swapaxes(q_sqrt, 1, 2))))
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    return rounding_bound(want.dtype, condition=kappa, scale=scale)


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
def test_natgrad_trace__on_a_gpu_runs_the_tensorflow_closed_form_and_equals_lapack(xi, monkeypatch):
    args = _problem(6, 2, seed=3)
    lapack = nd.natgrad_trace(*args, gamma=0.4, xi_transform=XIS[xi](), compiled=True)  # the CPU's path: LAPACK
    calls = []
    real = trace_module.natgrad_tensors_closed_form
    monkeypatch.setattr(backend_module, "_on_gpu", lambda tensors: True)
    monkeypatch.setattr(trace_module, "natgrad_tensors_closed_form", lambda *a: calls.append(a[-1]) or real(*a))
    monkeypatch.setattr(trace_module, "natgrad_record_lapack", lambda *a, **k: pytest.fail("LAPACK ran on a GPU"))
    monkeypatch.setattr(trace_module, "_natgrad_trace_eager", lambda *a, **k: pytest.fail("the eager path ran"))
    monkeypatch.setattr(trace_module, "natgrad_tensors", lambda *a, **k: pytest.fail("the autodiff step ran"))
    gpu = nd.natgrad_trace(*args, gamma=0.4, xi_transform=XIS[xi](), compiled=True)
    assert calls == [xi]  # traced once, with this ξ's closed form
    for name in ("eta1", "eta2", "dL_deta1", "dL_deta2", "dtheta_deta1", "dtheta_deta2", "xi1", "xi2",
                 "nat_dL_xi1", "nat_dL_xi2", "new_q_mu", "new_q_sqrt", "q_mu", "q_sqrt", "dL_dmean", "dL_dvarsqrt"):  # fmt: skip
        want = getattr(lapack, name)
        np.testing.assert_allclose(getattr(gpu, name), want, rtol=0, atol=_bound(want, lapack.q_sqrt), err_msg=name)
    assert np.max(np.abs(gpu.new_q_mu - gpu.q_mu)) > 1e-3  # the step moved something


@pytest.mark.parametrize("xi", ["nat", "sqrtmeanvar"])
def test_drop_in_optimizer__on_a_gpu_runs_the_tensorflow_closed_form_and_equals_lapack(xi, on_gpu):
    p_mu, p_sq, g_mu, _ = _problem(5, 2, seed=7)
    G = tf.constant(np.tril(0.05 * np.random.default_rng(8).normal(size=p_sq.shape)))  # ∂L/∂L_S of the linear loss
    q_sqrt = p_sq.numpy()
    want = natgrad_record_lapack(p_mu.numpy(), q_sqrt, g_mu.numpy(), G.numpy(), 0.3, xi)
    opt = nd.NaturalGradient(0.3, xi_transform=XIS[xi]())
    step = tf.function(lambda: opt.minimize(lambda: tf.reduce_sum(g_mu * p_mu) + tf.reduce_sum(G * p_sq), [(p_mu, p_sq)]))
    step()
    assert any("closed_form_step" in op.name for op in step.get_concrete_function().graph.get_operations())
    for name, got in (("new_q_mu", p_mu.numpy()), ("new_q_sqrt", p_sq.numpy())):
        np.testing.assert_allclose(got, want[name], rtol=0, atol=_bound(want[name], q_sqrt), err_msg=name)


def test_natgrad_trace__an_upper_fill_triangular_q_sqrt_is_refused_naming_q_sqrt():
    """Its value is upper triangular: GPflow's step would mix S = q_sqrt q_sqrtᵀ with the lower triangle it solves with."""
    q_mu, q_sqrt = random_q(3, 1, seed=0)
    upper = gpflow.Parameter(np.swapaxes(q_sqrt, 1, 2), transform=tfp.bijectors.FillTriangular(upper=True))
    with pytest.raises(InputError, match=r"Argument: q_sqrt(.|\n)*lower-triangular"):
        nd.natgrad_trace(q_mu, upper, np.zeros((3, 1)), np.zeros((1, 6)))
