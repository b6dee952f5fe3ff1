"""PyTorch's torch.autograd.grad against TensorFlow (via natgrad_diag.vjp) and against closed forms.

Tests that need torch skip when it is not installed (``.ci/run`` installs a CPU build first); the
missing-torch path is tested by hiding torch from the import system.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from natgrad_diag.exceptions import InputError, MissingExtraError, OutputGradientsError

TORCH_WRONG_SEED = (
    "Mismatch in shape: grad_output[0] has a shape of torch.Size([4]) and output[0] has a shape of torch.Size([4, 4])."
)


def _pairs():
    """(name, tf_fn, torch_fn, input shapes for n, output shapes for n): the same function twice."""
    import tensorflow as tf
    import torch

    return {
        "outer": (
            lambda x: x[:, None] * x[None, :],
            lambda x: torch.outer(x, x),
            lambda n: [(n,)],
            lambda n: [(n, n)],
        ),
        "sin_times_sum": (
            lambda x: tf.sin(x) * tf.reduce_sum(x),
            lambda x: torch.sin(x) * x.sum(),
            lambda n: [(n,)],
            lambda n: [(n,)],
        ),
        "tanh_matmul_and_norm": (
            lambda a, b: (tf.tanh(a @ b), tf.reduce_sum(a**2)),
            lambda a, b: (torch.tanh(a @ b), (a**2).sum()),
            lambda n: [(n, 3), (3, n)],
            lambda n: [(n, n), ()],
        ),
        "logsumexp_rows": (
            lambda a: tf.reduce_logsumexp(a, axis=1),
            lambda a: torch.logsumexp(a, dim=1),
            lambda n: [(n, 3)],
            lambda n: [(n,)],
        ),
        "cholesky_of_spd": (
            lambda a: tf.linalg.cholesky(a @ tf.transpose(a) + 4.0 * tf.eye(tf.shape(a)[0], dtype=a.dtype)),
            lambda a: torch.linalg.cholesky(a @ a.T + 4.0 * torch.eye(a.shape[0], dtype=a.dtype)),
            lambda n: [(n, n)],
            lambda n: [(n, n)],
        ),
    }


@pytest.mark.torch
def test_torch_outer__default_numbers_and_message():
    pytest.importorskip("torch")
    from natgrad_diag.torch_bridge import torch_outer

    t = torch_outer([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(t.gradient_ones_seed, [20.0, 20.0, 20.0, 20.0], rtol=0, atol=1e-12)
    x = np.array([1.0, 2.0, 3.0, 4.0])
    hand = np.array([[[(x[k] if i == j else 0.0) + (x[j] if i == k else 0.0) for i in range(4)] for k in range(4)] for j in range(4)])
    np.testing.assert_allclose(t.jacobian, hand, rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.chain_one_step, 4 * x * np.sum(x**2), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(t.chain_two_step, 4 * x * np.sum(x**2), rtol=1e-12, atol=1e-12)
    assert t.wrong_seed_error == TORCH_WRONG_SEED  # torch's own words


@pytest.mark.torch
def test_outer_example__tf_and_torch_agree_to_1e_12():
    pytest.importorskip("torch")
    from natgrad_diag import outer_example

    r = outer_example([1.0, -2.5, 0.3, 4.0, 1.7], use_torch=True)
    assert r.torch is not None and r.torch_status.startswith("torch ")
    np.testing.assert_allclose(r.torch.gradient_ones_seed, r.gradient_ones_seed, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(r.torch.jacobian, r.jacobian_array, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(r.torch.chain_two_step, r.chain_two_step, rtol=1e-12, atol=1e-12)
    names = {c.name for c in r.checks}
    assert {"torch_ones_seed_agrees", "torch_jacobian_agrees", "torch_chain_agrees", "torch_rejects_wrong_seed"} <= names
    assert r.passed
    d = r.to_dict()
    assert d["torch"]["available"] is True
    assert d["torch"]["wrong_seed_error"].startswith("Mismatch in shape: grad_output[0] has a shape of torch.Size([5])")
    flat = " ".join(str(r).split())
    assert "- PyTorch's torch.autograd.grad: Mismatch in shape: grad_output[0] has a shape of torch.Size([5])" in flat


@pytest.mark.torch
@pytest.mark.parametrize("name", ["outer", "sin_times_sum", "tanh_matmul_and_norm", "logsumexp_rows", "cholesky_of_spd"])
@settings(max_examples=6)
@given(n=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_compare_with_tensorflow__random_functions_agree(name, n, seed):
    pytest.importorskip("torch")
    from natgrad_diag.torch_bridge import compare_with_tensorflow, torch_vjp

    tf_fn, torch_fn, in_shapes, out_shapes = _pairs()[name]
    rng = np.random.default_rng(seed)
    primals = [rng.normal(size=s) for s in in_shapes(n)]
    cotangents = [rng.normal(size=s) for s in out_shapes(n)]
    check = compare_with_tensorflow(tf_fn, torch_fn, primals, cotangents)
    assert check.passed, str(check)
    # and the torch side itself against central differences of <v, f(x)>
    _, grads = torch_vjp(torch_fn, primals, cotangents)
    import torch

    def inner(ps):
        with torch.no_grad():
            out = torch_fn(*[torch.tensor(p) for p in ps])
        outs = out if isinstance(out, tuple) else (out,)
        return sum(float(np.sum(v * o.numpy())) for v, o in zip(cotangents, outs))

    h = 1e-6
    for k, p in enumerate(primals):
        fd = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            plus = [q.copy() for q in primals]
            minus = [q.copy() for q in primals]
            plus[k][idx] += h
            minus[k][idx] -= h
            fd[idx] = (inner(plus) - inner(minus)) / (2 * h)
        np.testing.assert_allclose(grads[k], fd, rtol=1e-6, atol=1e-6)


@pytest.mark.torch
def test_compare_with_tensorflow__reports_a_disagreement():
    torch = pytest.importorskip("torch")
    import tensorflow as tf

    from natgrad_diag.torch_bridge import compare_with_tensorflow

    x = np.array([0.1, 0.7, -1.2])
    check = compare_with_tensorflow(tf.sin, torch.cos, [x], [np.ones(3)])
    assert not check.passed
    assert check.max_abs_error == pytest.approx(np.max(np.abs(np.concatenate([np.sin(x) - np.cos(x), np.cos(x) + np.sin(x)]))), rel=1e-12)
    # a torch_fn that is not tf_fn for torch (another shape, a numpy result, a raise): torch's error, named
    for torch_fn in (lambda a: torch.sin(a)[:, None], lambda a: np.sin(a.detach().numpy()), lambda a: 1 / 0):
        with pytest.raises(InputError, match=r"torch_fn\(\) raised an error under torch_vjp\.\n  Argument: torch_fn\n  Error: +\w+Error"):
            compare_with_tensorflow(tf.sin, torch_fn, [x], [np.ones(3)])
    with pytest.raises(OutputGradientsError, match=r"cotangents\[0\] has a shape of \[3, 1\]"):  # TensorFlow's side first
        compare_with_tensorflow(tf.sin, torch.sin, [x], [np.ones((3, 1))])


@pytest.mark.torch
def test_torch_vjp__torch_rejects_a_wrong_seed_itself():
    torch = pytest.importorskip("torch")
    from natgrad_diag.torch_bridge import torch_vjp

    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of torch.Size\(\[4\]\)"):
        torch_vjp(lambda x: torch.outer(x, x), [np.array([1.0, 2.0, 3.0, 4.0])], [np.ones(4)])
    _, (gx, gw) = torch_vjp(lambda x, w: torch.sin(x), [np.ones(2), np.ones(3)], [np.ones(2)])
    np.testing.assert_array_equal(gw, np.zeros(3))  # unused input: zeros, as natgrad_diag.vjp's default


def test_torch_missing__package_still_works(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    from natgrad_diag import outer_example
    from natgrad_diag.torch_bridge import require_torch, torch_available, torch_outer

    assert torch_available() is False
    with pytest.raises(MissingExtraError, match=r"CPU build: pip install torch --index-url https://download.pytorch.org/whl/cpu .*torch==2.13.0"):
        require_torch()
    with pytest.raises(MissingExtraError):
        torch_outer([1.0, 2.0])
    r = outer_example([1.0, 2.0])
    assert r.torch is None and r.passed
    assert r.torch_status == (
        "torch is not installed (to run it, install a CPU build: pip install torch --index-url "
        "https://download.pytorch.org/whl/cpu (on the CI machine, pip install torch==2.13.0 takes the CPU build on disk))"
    )
    assert len(r.checks) == 8 and not any(c.name.startswith("torch_") for c in r.checks)
    assert r.to_dict()["torch"]["available"] is False
    with pytest.raises(MissingExtraError):
        outer_example([1.0, 2.0], use_torch=True)


def test_torch_bridge__import_does_not_import_torch():
    import subprocess

    code = "import sys, natgrad_diag.torch_bridge, natgrad_diag.lessons.outer, natgrad_diag.autodiff.seeded; print('torch' in sys.modules, 'tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_torch_bridge__lazy_names_resolve():
    import natgrad_diag

    assert natgrad_diag.torch_bridge.torch_vjp.__module__ == "natgrad_diag.torch_bridge"
    assert natgrad_diag.torch_bridge.torch_available() is (importlib.util.find_spec("torch") is not None)
    assert natgrad_diag.outer_example.__module__ == "natgrad_diag.lessons.outer"
    assert natgrad_diag.OuterExample.__module__ == "natgrad_diag.lessons.outer"
    assert natgrad_diag.checked_gradient.__module__ == "natgrad_diag.autodiff.seeded"
    assert natgrad_diag.vjp.__module__ == "natgrad_diag.autodiff.seeded"
