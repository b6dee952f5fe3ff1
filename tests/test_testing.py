"""Tests of natgrad_diag.testing: the pytest helpers, and the README example file run as written."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt

import natgrad_diag
from natgrad_diag import testing
from natgrad_diag.gradcheck import api as gradcheck
from natgrad_diag.exceptions import InputError, JacobianMismatchError, OutputGradientsError

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "gradient-checks.md"

pytest_plugins = ["pytester"]


def test_testing__imports_without_tensorflow() -> None:
    code = "import sys, natgrad_diag.testing; print(sorted(m for m in ('tensorflow', 'gpflow', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_testing__exports() -> None:
    assert set(testing.__all__) == {"assert_gradients", "assert_natgrad_step_matches_gpflow", "assert_vjp_matches_jacobian"}
    assert testing.assert_gradients is gradcheck.assert_gradients is natgrad_diag.assert_gradients
    assert natgrad_diag.testing is testing


# ------------------------------------------------------------------------------------------------
# assert_gradients through natgrad_diag.testing


@tf.custom_gradient
def _cube_wrong(x: tf.Tensor):  # noqa: ANN202
    return x**3, lambda dy: dy * 2.0 * x**2  # the true derivative is 3x²


def test_assert_gradients__raises_assertion_error_naming_the_block() -> None:
    x = np.array([0.1, -2.0])
    with pytest.raises(AssertionError) as info:
        testing.assert_gradients(_cube_wrong, [x], input_names=["x"], output_names=["cube"])
    assert isinstance(info.value, JacobianMismatchError)
    msg = str(info.value)
    # error x² against about atol + rtol·2x²: 0.01/3e-7 at x = 0.1, 4/8e-5 at x = −2 (the worst entry); there the
    # closed forms are numerical 3x² = 12, analytical 2x² = 8
    assert "Worst entry: ∂cube[1]/∂x[1]" in msg
    assert re.search(r"numerical  11\.99999999\d*|numerical  12\.0000000\d*", msg), msg
    assert "analytical 8.0" in msg
    report = testing.assert_gradients(tf.sin, [x])  # a passing check returns its report
    assert report.passed and report.rows[0].compared == 4


ASSERTING = """\
import numpy as np
import tensorflow as tf

from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, meanvarsqrt_to_expectation

from natgrad_diag import assert_natgrad
from natgrad_diag.demo import make_model
from natgrad_diag.testing import assert_gradients, assert_natgrad_step_matches_gpflow


@tf.custom_gradient
def cube(x):
    return x**3, lambda dy: dy * 2.0 * x**2


def test_gradients():
    assert_gradients(cube, [np.array([0.1, -2.0])])


def test_natgrad():
    assert_natgrad(*make_model("svgp", "bernoulli", num_inducing=10, num_data=50), gamma=5.0, progress=False)


def my_step(q_mu_grad, q_sqrt_grad, q_mu, q_sqrt, xi_transform):  # the question's seed of ones, times dL/dmean
    eta1, eta2 = meanvarsqrt_to_expectation(q_mu, q_sqrt)
    with tf.GradientTape() as tape:
        tape.watch([eta1, eta2])
        mean, varsqrt = expectation_to_meanvarsqrt(eta1, eta2)
    d1, d2 = tape.gradient([mean, varsqrt], [eta1, eta2])
    return d1 * q_mu_grad, d2 * q_sqrt.transform.forward(q_sqrt_grad)


def test_my_step():
    assert_natgrad_step_matches_gpflow(*make_model("svgp", "gaussian", num_inducing=4, num_data=20), optimizer=my_step)
"""


def test_assert_helpers__a_failure_is_shown_at_the_users_line_without_the_packages_frames(pytester: pytest.Pytester) -> None:
    # a researcher's suite: pytest shows the assertion at their call (natgrad-diag's frames hidden, as pytest's own
    # helpers are), with the message naming the block or the check and the fix
    pytester.makepyfile(test_sample=ASSERTING)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:benchmark")  # benchmark: its xdist warning
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(["*assert_gradients(cube, *", "E *.JacobianMismatchError: *", "test_sample.py:17: JacobianMismatchError"])
    result.stdout.fnmatch_lines(["*assert_natgrad(*", "E *.NatGradCheckError: *", "test_sample.py:21: NatGradCheckError"])
    result.stdout.fnmatch_lines(["*assert_natgrad_step_matches_gpflow(*", "E *.NatGradCheckError: *", "*output_gradients=None*", "test_sample.py:34: NatGradCheckError"])
    out = result.stdout.str()
    assert "natgrad_diag/gradcheck" not in out and "natgrad_diag/checks" not in out, out


# ------------------------------------------------------------------------------------------------
# assert_vjp_matches_jacobian


def test_assert_vjp_matches_jacobian__outer_product_closed_form() -> None:
    # y = x xᵀ: (Jᵀ·v)_k = Σ_ab v_ab (δ_ak x_b + x_a δ_bk) = ((v + vᵀ) x)_k
    x = np.array([1.0, -2.0, 0.5])
    v = np.arange(9.0).reshape(3, 3) - 4.0
    got = testing.assert_vjp_matches_jacobian(lambda t: t[:, None] * t[None, :], [x], [v])
    np.testing.assert_allclose(got[0], (v + v.T) @ x, rtol=1e-13)


def test_assert_vjp_matches_jacobian__gpflow_map_against_finite_differences() -> None:
    # the VJP equals the gradient of ⟨v, f⟩ by central differences along symmetric E_ab + E_ba for eta2
    rng = np.random.default_rng(1)
    M, L = 3, 2
    m = rng.normal(size=(M, L))
    A = np.tril(0.3 * rng.normal(size=(L, M, M)), -1) + np.eye(M)
    eta2 = A @ np.swapaxes(A, -1, -2) + np.einsum("ml,nl->lmn", m, m)
    v = [rng.normal(size=(M, L)), rng.normal(size=(L, M, M))]
    g1, g2 = testing.assert_vjp_matches_jacobian(expectation_to_meanvarsqrt, [m, eta2], v)

    def inner(e1: np.ndarray, e2: np.ndarray) -> float:
        mean, varsqrt = (t.numpy() for t in expectation_to_meanvarsqrt(tf.constant(e1), tf.constant(e2)))
        return float(np.sum(v[0] * mean) + np.sum(v[1] * varsqrt))

    h = 1e-6
    for idx in np.ndindex(M, L):
        d = np.zeros_like(m)
        d[idx] = h
        np.testing.assert_allclose((inner(m + d, eta2) - inner(m - d, eta2)) / (2 * h), g1[idx], rtol=1e-6, atol=1e-8)
    for l, a, b in [(0, 1, 0), (1, 2, 2), (1, 2, 0)]:
        d = np.zeros_like(eta2)
        d[l, a, b] = d[l, b, a] = h
        want = g2[l, a, b] + (g2[l, b, a] if a != b else 0.0)
        np.testing.assert_allclose((inner(m, eta2 + d) - inner(m, eta2 - d)) / (2 * h), want, rtol=1e-6, atol=1e-8)


@tf.custom_gradient
def _forgets_dy(x: tf.Tensor):  # noqa: ANN202
    return 2.0 * x, lambda dy: 2.0 * tf.ones_like(x)  # a classic bug: not multiplied by dy


def test_assert_vjp_matches_jacobian__gradient_not_linear_in_dy_fails() -> None:
    x = np.array([1.0, 2.0, 3.0])
    v = np.array([0.5, -1.0, 4.0])
    # one-hot seeds give every row of J as 2·1 (J = 2·11ᵀ), so Jᵀ·v = 2·(Σv)·1 = 7·1; tape.gradient gives 2·1
    with pytest.raises(JacobianMismatchError) as info:
        testing.assert_vjp_matches_jacobian(_forgets_dy, [x], [v], input_names=["x"])
    msg = str(info.value)
    assert "is not Jᵀ·v for input 0 (x)" in msg
    assert "Expected:    7.0" in msg and "Actual:      2.0" in msg
    assert "multiply by dy" in msg


def test_assert_vjp_matches_jacobian__bad_cotangent_is_named() -> None:
    with pytest.raises(OutputGradientsError, match=r"cotangents\[0\] has a shape of \[2\] and output\[0\] has a shape of \[3\]"):
        testing.assert_vjp_matches_jacobian(tf.sin, [np.ones(3)], [np.ones(2)])


def test_assert_vjp_matches_jacobian__an_empty_input_is_refused_not_passed() -> None:
    # with no entries there is nothing to compare: a pass would be one that could not have failed
    with pytest.raises(InputError, match=r"input x0 has no entries \(shape \[0\]\): there is no derivative to check"):
        testing.assert_vjp_matches_jacobian(tf.sin, [np.zeros(0)], [np.zeros(0)])


# ------------------------------------------------------------------------------------------------
# assert_natgrad_step_matches_gpflow


def test_assert_natgrad_step_matches_gpflow__forwards_to_natgrad_check(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    fake = types.ModuleType("natgrad_diag.checks.api")

    def impl(*args: object, **kwargs: object) -> str:
        calls.append((args, kwargs))
        return "result"

    fake.assert_natgrad_step_matches_gpflow = impl  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "natgrad_diag.checks.api", fake)
    monkeypatch.setattr(natgrad_diag, "natgrad_check", fake, raising=False)
    assert testing.assert_natgrad_step_matches_gpflow("model", "data", gamma=0.5) == "result"
    assert calls == [(("model", "data"), {"gamma": 0.5})]


def test_assert_natgrad_step_matches_gpflow__real_model_passes_unchanged() -> None:
    import gpflow  # natgrad_diag.checks.api is part of the package: a missing function fails here, never skips

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(15, 1))
    Y = np.sin(6 * X) + 0.1 * rng.normal(size=(15, 1))
    model = gpflow.models.VGP((X, Y), gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian())
    before = [p.numpy().copy() for p in model.trainable_parameters]
    check = testing.assert_natgrad_step_matches_gpflow(model, gamma=0.5)
    # the passing check it returns: |ours − GPflow's| within the documented float64 default (1e-10 + 1e-10·scale)
    assert check.name == "reproduction" and check.passed and not check.expect_difference
    assert check.max_abs_error is not None and 0.0 <= check.max_abs_error <= check.tolerance <= 1e-9
    assert len(before) == 5 and all(np.array_equal(a, p.numpy()) for a, p in zip(before, model.trainable_parameters))


# ------------------------------------------------------------------------------------------------
# The README example, run as written


def _doc_example() -> str:
    text = DOC.read_text(encoding="utf-8")
    marker = text.index("<!-- example: test_natgrad_gradients.py")
    start = text.index("```python\n", marker) + len("```python\n")
    return text[start : text.index("```", start)]


def test_doc_example__is_a_test_file_using_the_helpers() -> None:
    code = _doc_example()
    compile(code, "test_natgrad_gradients.py", "exec")
    for name in testing.__all__:
        assert f"{name}(" in code


def test_doc_example__passes_as_written(tmp_path: Path) -> None:
    # imported from a file (as pytest would collect it), then every test run, parametrized ones per value
    path = tmp_path / "test_natgrad_gradients.py"
    path.write_text(_doc_example(), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("test_natgrad_gradients", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ran = []
    for name in sorted(n for n in vars(module) if n.startswith("test_")):
        fn = getattr(module, name)
        marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
        if marks:
            argname, values = marks[0].args
            for value in values:
                fn(**{argname: value})
                ran.append(f"{name}[{value}]")
        else:
            fn()
            ran.append(name)
    assert ran == [
        "test_expectation_map[full]", "test_expectation_map[fast]", "test_my_function_of_a_symmetric_matrix",
        "test_natgrad_step_matches_gpflow", "test_output_gradients_is_a_vjp", "test_triangular_input",
    ]  # fmt: skip


def test_doc_example__fails_on_a_wrong_gradient() -> None:
    # the same helpers, given a function with a wrong gradient, fail: the example's tests can fail
    namespace: dict[str, object] = {}
    head = _doc_example().split("@pytest.mark.parametrize")[0]  # the example's imports and set-up
    exec(compile(head, "example_head", "exec"), namespace)
    S = namespace["S"]

    @tf.custom_gradient
    def logdet_wrong(S: tf.Tensor):  # noqa: ANN202
        value = 2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(tf.linalg.cholesky(S))), axis=-1)
        return value, lambda dy: dy[:, None, None] * tf.eye(S.shape[-1], dtype=S.dtype)  # should be S⁻¹

    with pytest.raises(JacobianMismatchError, match="Output 0 \\(y0\\) with respect to input 0 \\(x0\\)"):
        testing.assert_gradients(logdet_wrong, [S], structure="symmetric")
