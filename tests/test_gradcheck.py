"""Tests of natgrad_diag.gradcheck: every expected value from closed forms, numpy or a hand-made finite difference."""

from __future__ import annotations

import dataclasses
import json
import tracemalloc

import numpy as np
import pytest
import tensorflow as tf
from gpflow.optimizers import natgrad as ng
from hypothesis import given, settings
from hypothesis import strategies as st

import natgrad_diag as nd
from natgrad_diag.typing import Array
from natgrad_diag.cli import gradcheck as gradcheck_cli_module
from natgrad_diag.exceptions import (
    InputError,
    JacobianMismatchError,
    MemoryLimitError,
    NonFiniteError,
    OutputGradientsError,
    ShapeMismatchError,
)
from natgrad_diag.gradcheck import fast as gradcheck_fast
from natgrad_diag.gradcheck import full as gradcheck_full
from tests.gradcheck_points import gpflow_points

# ------------------------------------------------------------------------------------------------
# GPflow's maps (their points: tests/gradcheck_points.py, built with numpy, not with the maps under test)


# (map, which point it takes, expected inferred structures, expected names)
MAPS = {
    "expectation_to_meanvarsqrt": ("expectation", ("general", "symmetric"), ("eta1", "eta2"), ("mean", "varsqrt")),
    "meanvarsqrt_to_expectation": ("meanvarsqrt", ("general", "lower_triangular"), ("mean", "varsqrt"), ("eta1", "eta2")),
    "natural_to_meanvarsqrt": ("natural", ("general", "symmetric"), ("nat1", "nat2"), ("mean", "varsqrt")),
    "meanvarsqrt_to_natural": ("meanvarsqrt", ("general", "lower_triangular"), ("mean", "varsqrt"), ("nat1", "nat2")),
    "natural_to_expectation": ("natural", ("general", "symmetric"), ("nat1", "nat2"), ("eta1", "eta2")),
    "expectation_to_natural": ("expectation", ("general", "symmetric"), ("eta1", "eta2"), ("nat1", "nat2")),
}


def expected_compared(M: int, L: int, structures: tuple[str, ...], mode: str, num_directions: int) -> list[int]:
    """How many numbers each block compares, counted by hand (outputs are [M, L] and [L, M, M])."""
    out_sizes = [M * L, L * M * M]
    coords = [M * L, L * M * (M + 1) // 2 if structures[1] == "symmetric" else L * M * M]
    dirs = [num_directions, num_directions * (2 if structures[1] == "lower_triangular" and M > 1 else 1)]
    if mode == "fast":
        return [d for _ in out_sizes for d in dirs]
    return [o * c for o in out_sizes for c in coords]


# A sample of the grid M = 1..8, L = 1..3 (every M and L appears; the hypothesis test adds more).
GRID = [
    ("expectation_to_meanvarsqrt", 1, 1), ("expectation_to_meanvarsqrt", 6, 3),
    ("meanvarsqrt_to_expectation", 2, 2), ("meanvarsqrt_to_expectation", 8, 1),
    ("natural_to_meanvarsqrt", 3, 3), ("natural_to_meanvarsqrt", 7, 1),
    ("meanvarsqrt_to_natural", 4, 2), ("meanvarsqrt_to_natural", 1, 3),
    ("natural_to_expectation", 5, 1), ("natural_to_expectation", 2, 3),
    ("expectation_to_natural", 8, 2), ("expectation_to_natural", 3, 1),
]  # fmt: skip


@pytest.mark.parametrize("mode", ["full", "fast"])
@pytest.mark.parametrize("name, M, L", [pytest.param(n, M, L, id=f"{n}-M{M}-L{L}", marks=[pytest.mark.slow] if i % 2 else [])
                                        for i, (n, M, L) in enumerate(GRID)])  # each map's second size: -m slow
def test_check_gradients__gpflow_maps_pass_with_inferred_structure(name: str, M: int, L: int, mode: str) -> None:
    point, structures, in_names, out_names = MAPS[name]
    fn = getattr(ng, name)
    inputs = gpflow_points(M, L, seed=M + 10 * L)[point]
    report = nd.check_gradients(fn, inputs, mode=mode)
    assert report.passed, str(report)
    assert report.structures == structures
    assert report.input_names == in_names and report.output_names == out_names
    assert [(r.output, r.input) for r in report.rows] == [(o, i) for o in out_names for i in in_names]
    assert [r.compared for r in report.rows] == expected_compared(M, L, structures, mode, num_directions=4)
    assert (report.eps, report.rtol, report.atol) == (1e-6, 1e-5, 1e-7)


@pytest.mark.slow  # ~5 s; every map's inferred-structure case above runs by default
@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(sorted(MAPS)),
    M=st.integers(1, 8),
    L=st.integers(1, 3),
    mode=st.sampled_from(["full", "fast"]),
    seed=st.integers(0, 1000),
)
def test_check_gradients__gpflow_maps_pass_on_random_points(name: str, M: int, L: int, mode: str, seed: int) -> None:
    point = MAPS[name][0]
    report = nd.check_gradients(getattr(ng, name), gpflow_points(M, L, seed)[point], mode=mode, seed=seed)
    assert report.passed, str(report)


# ------------------------------------------------------------------------------------------------
# A deliberately wrong gradient


@tf.custom_gradient
def _square_wrong(x: tf.Tensor):  # noqa: ANN202
    def grad(dy: tf.Tensor) -> tf.Tensor:
        return dy * 3.0 * x  # the true derivative is 2x

    return x * x, grad


def two_outputs(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(x² with a wrong gradient + y, x·y): only ∂out0/∂x is wrong."""
    return _square_wrong(x) + y, x * y


X0 = np.array([0.5, -1.25, 2.0])
Y0 = np.array([1.5, 0.25, -0.75])


def _worst_of_two_outputs(dtype: type, *, h: float, rtol: float, atol: float) -> int:
    """The index of ∂square/∂x's worst entry at X0, Y0 by hand. Numerical 2x, analytical 3x (diagonal); the tolerance
    is atol + rtol·3|x| + the rounding bound 100·ε/2h·(|(x+h)² + y| + |(x−h)² + y|) + 100·ε/h·|x|·3|x| + the measured
    noise 10·|(x(1 ± 4ε))² − x²|/2h = 10·8ε·x²/2h, and the worst entry has the largest error |x| relative to it."""
    e = np.finfo(dtype).eps
    rounding = 100 * e / (2 * h) * (abs((X0 + h) ** 2 + Y0) + abs((X0 - h) ** 2 + Y0)) + 100 * e / h * 3 * X0**2
    rounding += 10 * 8 * e * X0**2 / (2 * h)
    return int(np.argmax(abs(X0) / (atol + rtol * 3 * abs(X0) + rounding)))


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__wrong_custom_gradient_fails_and_names_the_block(mode: str) -> None:
    report = nd.check_gradients(two_outputs, [X0, Y0], mode=mode, input_names=["x", "y"], output_names=["square", "product"])
    assert not report.passed
    verdicts = {(r.output, r.input): r.passed for r in report.rows}
    assert verdicts == {("square", "x"): False, ("square", "y"): True, ("product", "x"): True, ("product", "y"): True}
    bad = report.row("square", "x")
    k = _worst_of_two_outputs(np.float64, h=1e-6, rtol=1e-5, atol=1e-7)
    assert bad.worst_entry == f"∂square[{k}]/∂x[{k}]"
    np.testing.assert_allclose(bad.numerical, 2 * X0[k], rtol=1e-9)
    np.testing.assert_allclose(bad.analytical, 3 * X0[k], rtol=1e-12)
    with pytest.raises(JacobianMismatchError) as info:
        nd.assert_gradients(two_outputs, [X0, Y0], mode=mode, input_names=["x", "y"], output_names=["square", "product"])
    msg = str(info.value)
    assert "Output 0 (square) with respect to input 0 (x)" in msg
    assert f"Worst entry: ∂square[{k}]/∂x[{k}]" in msg
    assert "rtol=1e-05, atol=1e-07" in msg
    assert "To fix: look for a wrong gradient on the path of ∂square/∂x (tf.custom_gradient" in msg


def test_check_gradients__fast_mode_failure_reruns_full_mode_on_the_block() -> None:
    report = nd.check_gradients(two_outputs, [X0, Y0], mode="fast", input_names=["x", "y"])
    bad = report.row(0, "x")
    assert "then full mode on this block" in bad.method
    assert "full mode on this block confirms it" in bad.note
    # the forward mode is reported only for passing rows here; it agrees with the (wrong) reverse mode
    good = report.row(1, "y")
    assert good.forward is not None
    np.testing.assert_allclose(good.forward, good.analytical, rtol=1e-12, atol=1e-14)


def test_check_gradients__fast_mode_reports_forward_mode_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gradcheck_fast, "_RERUN_MAX_COORDS", 0)  # keep the fast-mode numbers of the failing direction
    row = nd.check_gradients(two_outputs, [X0, Y0], mode="fast", seed=3).row(0, 0)
    assert not row.passed
    assert row.worst_entry.startswith("⟨v, ∂y0/∂x0·u⟩, direction")
    assert "too large to re-run" in row.note
    # ⟨v, diag(2x)·u⟩ by differences against ⟨v, diag(3x)·u⟩ from the wrong custom gradient
    np.testing.assert_allclose(row.numerical, 2.0 / 3.0 * row.analytical, rtol=1e-8)
    # ForwardAccumulator differentiates a custom_gradient function's forward computation: it gets 2x
    assert row.forward is not None
    np.testing.assert_allclose(row.forward, row.numerical, rtol=1e-8)


# ------------------------------------------------------------------------------------------------
# Step size and tolerances


def test_check_gradients__settings_from_dtype_and_overrides() -> None:
    eta1, eta2 = gpflow_points(3, 1, seed=2)["expectation"]
    r64 = nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2])
    assert (r64.dtype, r64.eps, r64.rtol, r64.atol, r64.settings_source) == ("float64", 1e-6, 1e-5, 1e-7, "defaults for float64")
    r32 = nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1.astype(np.float32), eta2.astype(np.float32)])
    assert r32.passed, str(r32)
    assert (r32.dtype, r32.eps, r32.rtol, r32.atol, r32.settings_source) == ("float32", 1e-3, 2e-2, 2e-3, "defaults for float32")
    r32f = nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1.astype(np.float32), eta2.astype(np.float32)], mode="fast")
    assert r32f.passed, str(r32f)
    over = nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2], eps=1e-5, atol=1e-6)
    assert (over.eps, over.rtol, over.atol) == (1e-5, 1e-5, 1e-6)
    assert over.settings_source == "eps, atol given; the rest float64 defaults"
    assert "ε = 1.00e-05, rtol = 1.00e-05, atol = 1.00e-06 (eps, atol given; the rest float64 defaults)" in " ".join(str(over).split())


@tf.custom_gradient
def _cube_off(x: tf.Tensor):  # noqa: ANN202
    return x**3, lambda dy: dy * (3.0 * x**2 + 0.5)  # 0.5 too large: 3.5 at x = 1


def test_check_gradients__numerical_value_is_the_central_difference() -> None:
    # x³ at x = 1 with step h: ((1+h)³ − (1−h)³)/2h = 3 + h² exactly; h = 0.5 gives 3.25, 0.25 from the wrong 3.5
    x = np.array([1.0])
    report = nd.check_gradients(_cube_off, [x], eps=0.5)
    row = report.rows[0]
    assert not row.passed
    np.testing.assert_allclose([row.numerical, row.analytical], [3.25, 3.5], rtol=1e-14)
    np.testing.assert_allclose(row.max_abs_error, 0.25, rtol=1e-12)
    # atol + rtol·|3.5| + the rounding bound 100·ε/2h·(|1.5³| + |0.5³|) + 100·ε/h·|x|·|3.5| + the measured noise
    # 10·|(1 ± 4ε)³ − 1|/2h = 10·12ε/2h
    rounding = 100 * np.finfo(float).eps * ((1.5**3 + 0.5**3) / (2 * 0.5) + 3.5 / 0.5) + 120 * np.finfo(float).eps
    np.testing.assert_allclose(row.worst_tolerance, 1e-7 + 1e-5 * 3.5 + rounding, rtol=1e-12)
    # the difference at h/10 is 3 + 0.05² = 3.0025: it moved by 0.2475, and 3.5 is farther from it than that
    assert "At eps = 0.05 the differences still disagree, by more than they moved" in row.note
    assert nd.check_gradients(_cube_off, [x], eps=0.5, atol=0.3).passed  # the tolerances decide
    # the right derivative 3 passes: 3.0025 at h/10 is still off by its O(h²) error, 3.000025 at h/100 agrees
    right = nd.check_gradients(lambda x: x**3, [x], eps=0.5).rows[0]
    assert right.passed and np.isclose(right.numerical, 3.000025, rtol=1e-10) and "from eps = 0.05 to 0.005" in right.note


# ------------------------------------------------------------------------------------------------
# Memory: fast mode at M = 500, the guard in full mode


def test_check_gradients__fast_mode_at_m500_builds_no_dense_jacobian(monkeypatch: pytest.MonkeyPatch) -> None:
    M = 500
    rng = np.random.default_rng(0)
    eta1 = 0.1 * rng.standard_normal((M, 1))
    B = 0.02 * rng.standard_normal((M, M))
    eta2 = (np.eye(M) + B @ B.T + eta1 @ eta1.T)[None]

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("fast mode called jacobian()")

    monkeypatch.setattr(gradcheck_full, "jacobian", refuse)
    tracemalloc.start()
    try:
        report = nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2], mode="fast", num_directions=2, max_bytes=1024**2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.passed, str(report)
    assert peak < 200 * 1024**2 < M**4 * 8 / 1000  # numpy-side peak: a few M×M arrays, not the 500 GB of J
    with pytest.raises(MemoryLimitError):
        nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2], mode="full")


def test_check_gradients__memory_guard_refuses_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    M, L = 6, 2
    eta1, eta2 = gpflow_points(M, L, seed=0)["expectation"]
    calls = []
    monkeypatch.setattr(gradcheck_full, "jacobian", lambda *a, **k: calls.append(1))
    # analytical + numerical dense Jacobians: 2 · (M L + L M²)² · 8 bytes, by hand
    need = 2 * (M * L + L * M * M) ** 2 * 8
    with pytest.raises(MemoryLimitError) as info:
        nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2], max_bytes=need - 1)
    assert calls == []
    msg = str(info.value)
    assert f"{need} bytes" in msg and "mode='fast'" in msg
    assert nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2], mode="fast", max_bytes=need - 1).passed


def test_check_gradients__default_limit_is_2gib_and_refuses_quickly() -> None:
    M = 120  # (M + M²)² · 8 · 2 ≈ 3.3 GB > 2 GiB
    eta1 = np.zeros((M, 1))
    eta2 = np.eye(M)[None]
    tracemalloc.start()
    try:
        with pytest.raises(MemoryLimitError, match="GiB"):
            nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50 * 1024**2


# ------------------------------------------------------------------------------------------------
# Cotangents, read-only, report


def _wrong_second_row(x: tf.Tensor) -> tf.Tensor:
    @tf.custom_gradient
    def f(x: tf.Tensor):  # noqa: ANN202
        def grad(dy: tf.Tensor) -> tf.Tensor:
            return tf.stack([dy[0], 5.0 * dy[1]])  # the true Jacobian is the identity

        return tf.identity(x), grad

    return f(x)


def test_check_gradients__fast_mode_uses_the_given_cotangents() -> None:
    x = np.array([1.0, 2.0])
    assert nd.check_gradients(_wrong_second_row, [x], mode="fast", cotangents=[np.array([1.0, 0.0])]).passed
    assert not nd.check_gradients(_wrong_second_row, [x], mode="fast", cotangents=[np.array([0.0, 1.0])]).passed
    assert not nd.check_gradients(_wrong_second_row, [x], mode="fast").passed  # random v sees it


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__a_function_that_draws_random_numbers_is_refused_not_blamed_on_its_gradient(mode) -> None:
    """x + 1e-3·noise has the exact gradient I, but its central differences are noise/eps: the check reported a wrong
    gradient (numerical 1221 against 0). Two calls at the point now tell it apart from a function; the noise-free
    function passes."""
    x = np.array([0.5, -1.25, 2.0])
    with pytest.raises(InputError, match=r"fn\(\*inputs\) gives different values at the same point(.|\n)*Argument: fn"):
        nd.check_gradients(lambda a: a + 1e-3 * tf.random.normal(a.shape, dtype=a.dtype), [x], mode=mode)
    assert nd.check_gradients(lambda a: a + 1e-3 * tf.random.stateless_normal(a.shape, [1, 2], dtype=a.dtype), [x], mode=mode).passed


def test_check_gradients__inputs_are_left_bit_identical() -> None:
    eta1, eta2 = gpflow_points(3, 2, seed=4)["expectation"]
    v1 = tf.Variable(eta1)
    a2 = eta2.copy()
    before = (v1.numpy().tobytes(), a2.tobytes())
    for mode in ("full", "fast"):
        nd.check_gradients(ng.expectation_to_meanvarsqrt, [v1, a2], mode=mode)
    assert (v1.numpy().tobytes(), a2.tobytes()) == before


def test_gradient_check_report__frozen_json_and_text() -> None:
    report = nd.check_gradients(two_outputs, {"x": X0, "y": Y0}, mode="fast")
    assert report.input_names == ("x", "y")
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.mode = "full"  # type: ignore[misc]
    d = json.loads(json.dumps(report.to_dict()))
    assert d["passed"] is False and d["mode"] == "fast" and len(d["rows"]) == 4
    assert [c["passed"] for c in d["checks"]] == [r.passed for r in report.rows]
    text = str(report)
    assert "Gradient check of two_outputs (fast mode, float64)" in text
    assert "Verdict: 1 of 4 check(s) FAILED." in text
    assert isinstance(report, nd.GradientCheckReport)


def test_check_gradients__dict_outputs_and_scalar_input() -> None:
    fn = lambda s: {"b": tf.sin(s), "a": s * s}  # noqa: E731
    report = nd.check_gradients(fn, [np.float64(0.3)])
    assert report.output_names == ("a", "b") and report.passed
    # closed forms at s = 0.3: d(s²)/ds = 0.6, d(sin s)/ds = cos 0.3
    np.testing.assert_allclose(report.row("a", 0).analytical, 0.6, rtol=1e-12)
    np.testing.assert_allclose(report.row("b", 0).analytical, np.cos(0.3), rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# Bad input


def test_check_gradients__unknown_structure_message() -> None:
    with pytest.raises(InputError) as info:
        nd.check_gradients(tf.sin, [np.ones(3)], structure="diagonal")
    assert str(info.value) == (
        "Invalid input. unknown structure 'diagonal' for input x0.\n"
        "  Argument: structure\n"
        "    Expected: 'general' or 'symmetric' or 'lower_triangular'\n"
        "    Got:      'diagonal'\n"
        "  To fix: use 'symmetric' for η₂ or θ₂, 'lower_triangular' for a q_sqrt, else 'general'."
    )


def test_check_gradients__bad_arguments_are_named() -> None:
    with pytest.raises(ShapeMismatchError, match=r"structure for x0[\s\S]*\[..., M, M\][\s\S]*\[2, 3\]"):
        nd.check_gradients(tf.sin, [np.ones((2, 3))], structure="symmetric")
    with pytest.raises(InputError, match=r"unknown mode 'slow'[\s\S]*Argument: mode\n"):
        nd.check_gradients(tf.sin, [np.ones(3)], mode="slow")
    with pytest.raises(InputError, match=r"Argument: eps\n"):
        nd.check_gradients(tf.sin, [np.ones(3)], eps=-1.0)
    with pytest.raises(InputError, match="structure has 2 entries for 1 input"):
        nd.check_gradients(tf.sin, [np.ones(3)], structure=["general", "general"])
    with pytest.raises(NonFiniteError, match="x0"):
        nd.check_gradients(tf.sin, [np.array([1.0, np.nan])])
    with pytest.raises(InputError, match="floating-point"):
        nd.check_gradients(tf.sin, [np.array([1, 2])])
    with pytest.raises(OutputGradientsError, match=r"cotangents\[0\] has a shape of \[2\] and output\[0\] has a shape of \[3\]"):
        nd.check_gradients(tf.sin, [np.ones(3)], mode="fast", cotangents=[np.ones(2)])
    with pytest.raises(InputError, match="raised an error at the given point"):
        nd.check_gradients(lambda x: tf.reshape(x, [5]), [np.ones(3)])
    with pytest.raises(NonFiniteError, match="returned NaN or Inf in output y0"):
        nd.check_gradients(tf.linalg.cholesky, [-np.eye(2)])  # not positive definite: NaN on CPU
    with pytest.raises(InputError, match=r"Argument: num_directions\n"):
        nd.check_gradients(tf.sin, [np.ones(3)], mode="fast", num_directions=0)
    with pytest.raises(InputError, match=r"structure names unknown input\(s\) \['eta3'\]"):
        nd.check_gradients(ng.expectation_to_meanvarsqrt, gpflow_points(2, 1, 0)["expectation"], structure={"eta3": "symmetric"})
    with pytest.raises(InputError, match="x1 must have the dtype of x0"):
        nd.check_gradients(lambda a, b: a * tf.cast(b, a.dtype), [np.ones(2), np.ones(2, np.float32)])
    with pytest.raises(InputError, match="fn must be callable"):
        nd.check_gradients("sin", [np.ones(2)])  # type: ignore[arg-type]
    for missing in (None, []):  # both say what check_gradients needs, not jacobian's "e.g. [x]"
        with pytest.raises(InputError, match=r"inputs is (None|empty)[\s\S]*To fix: pass the point to check at, e.g. \[eta1, eta2\]"):
            nd.check_gradients(tf.sin, missing)  # type: ignore[arg-type]


def test_check_gradients__step_out_of_domain_is_an_input_error() -> None:
    # log at 1e-7 with eps = 1e-6: x − eps < 0 gives NaN, reported as such, not compared
    with pytest.raises(NonFiniteError, match="finite-difference point"):
        nd.check_gradients(tf.math.log, [np.array([1e-7])])


def test_gradient_check_report__cotangents_noted_in_settings() -> None:
    x = np.array([0.3, 0.7])
    full = nd.check_gradients(tf.sin, [x], cotangents=[np.ones(2)])
    assert full.cotangents_given and "not needed in full mode" in " ".join(str(full).split())  # wrapped at 88 columns
    fast = nd.check_gradients(tf.sin, [x], mode="fast", cotangents=[None])
    assert fast.passed and "v = the given cotangents" in " ".join(str(fast).split())
    assert nd.check_gradients(tf.sin, [x]).cotangents_given is False


def test_check_gradients__fast_failure_cleared_by_full_rerun() -> None:
    # y = x0·x1·x2: one-entry differences are exact (∂³y/∂x_k³ = 0), but along a direction u the central
    # difference is off by ε²·u0·u1·u2 (the mixed third derivative): ~1e-3 at ε = 0.1, far above the tolerance
    fn = lambda x: x[0] * x[1] * x[2]  # noqa: E731
    x = np.array([1.0, 2.0, 3.0])
    row = nd.check_gradients(fn, [x], mode="fast", eps=0.1).rows[0]
    assert row.passed
    assert "but full mode on this block passes" in row.note and "full mode on this block passed" in row.method
    assert row.worst_entry.startswith("⟨v, ∂y0/∂x0·u⟩, direction")
    assert 1e-5 < row.worst_abs_error < 0.1**2 and row.worst_abs_error > row.worst_tolerance  # |ε² u0 u1 u2| ≤ ε²/√27
    assert nd.check_gradients(fn, [x], mode="full", eps=0.1).passed


def test_check_gradients__fast_mode_symmetric_tangents_at_m50() -> None:
    # at M = 50 a non-symmetric tangent disagrees with reverse mode, a symmetric one agrees
    eta1, eta2 = gradcheck_cli_module.gpflow_map_point("expectation_to_meanvarsqrt", 50, 1, seed=0)
    small = 10 * 1024**2  # too small for the full re-run of a 2500-coordinate block: fast numbers only
    general = nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2], structure="general", mode="fast", max_bytes=small)
    symmetric = nd.check_gradients(ng.expectation_to_meanvarsqrt, [eta1, eta2], mode="fast", max_bytes=small)
    assert symmetric.passed, str(symmetric)
    bad = general.row("varsqrt", "eta2")
    assert not bad.passed and "looks symmetric" in bad.hint and "too large to re-run" in bad.note
    assert bad.worst_abs_error > 1e3 * symmetric.row("varsqrt", "eta2").max_abs_error


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__wrong_custom_gradient_float32(mode: str) -> None:
    x, y = X0.astype(np.float32), Y0.astype(np.float32)
    report = nd.check_gradients(two_outputs, [x, y], mode=mode)
    assert [r.passed for r in report.rows] == [False, True, True, True]
    assert (report.eps, report.rtol, report.atol) == (1e-3, 2e-2, 2e-3)
    bad = report.row(0, 0)
    k = _worst_of_two_outputs(np.float32, h=1e-3, rtol=2e-2, atol=2e-3)
    assert bad.worst_entry == f"∂y0[{k}]/∂x0[{k}]"
    # closed form in float32: 2x against 3x
    np.testing.assert_allclose([bad.numerical, bad.analytical], [2 * X0[k], 3 * X0[k]], rtol=1e-3)


def test_assert_gradients__whole_message() -> None:
    # x³ at x = 1 with ε = 0.5: the central difference is 3 + ε² = 3.25 exactly, the custom derivative 3.5 (3 is right)
    with pytest.raises(JacobianMismatchError) as info:
        nd.assert_gradients(_cube_off, [np.array([1.0])], eps=0.5, input_names=["x"], output_names=["cube"])
    assert str(info.value) == (
        "Jacobian mismatch. Output 0 (cube) with respect to input 0 (x): finite differences and the analytical "
        "derivative disagree.\n"
        "  Output:      0 (cube)\n"
        "  Input:       0 (x, structure 'general')\n"
        "  Worst entry: ∂cube[0]/∂x[0]\n"
        "    Expected:    numerical  3.25  (central differences, eps=0.5)\n"
        "    Actual:      analytical 3.5  (reverse mode)\n"
        "  Error:       0.25 > atol + rtol·|analytical| + rounding = 3.51e-05 (rtol=1e-05, atol=1e-07)\n"
        "  Block:       max abs error 0.25, max rel error 0.0714286; central differences, 1 coordinate(s)\n"
        "  Note:        At eps = 0.05 the differences still disagree, by more than they moved: not the step's O(eps²) "
        "error.\n"
        "  To fix: look for a wrong gradient on the path of ∂cube/∂x (tf.custom_gradient, RegisterGradient); if it "
        "is right, the difference is inaccurate: re-check with another eps (smaller when fn curves strongly, larger "
        "against rounding) or in float64."
    )


def test_assert_gradients__takes_check_gradients_arguments_by_name():
    """Its signature is check_gradients' (names, kinds, defaults): editors, help() and mypy see every keyword."""
    import inspect

    assert inspect.signature(nd.assert_gradients).parameters == inspect.signature(nd.check_gradients).parameters


def test_check_gradients_fast__a_zero_cotangent_or_a_negative_seed_is_refused():
    """⟨v, J·u⟩ = ⟨Jᵀ·v, u⟩ = 0 for v = 0 whatever J is: a wrong gradient (3x for x², by hand 2x) passed unchecked."""
    from natgrad_diag.exceptions import InputError

    @tf.custom_gradient
    def square(x):
        return x**2, lambda dy: dy * 3.0 * x

    x = np.array([0.5, -1.25, 2.0])
    with pytest.raises(InputError, match=r"cotangents\[0\] is zero(.|\n)*Argument:\s+cotangents\[0\]"):
        nd.check_gradients(square, [x], mode="fast", cotangents=[np.zeros(3)])
    assert not nd.check_gradients(square, [x], mode="fast", cotangents=[np.array([0.0, 1.0, 0.0])]).passed
    with pytest.raises(InputError, match=r"Argument:\s+seed"):
        nd.check_gradients(square, [x], mode="fast", seed=-1)


# ------------------------------------------------------------------------------------------------
# Large |x|: the step's own rounding and the rounding of fn's values


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__large_inputs_pass_and_a_wrong_gradient_still_fails(mode: str) -> None:
    """At |x| = 10⁶ float64's grid spacing is 1.2·10⁻¹⁰, 10⁻⁴ of the step h = 10⁻⁶, and |x³| = 10¹⁸: the rounded step
    and the rounding of fn's values (≈ ε·|x³|/h = 2·10² next to a derivative 3·10¹²·10⁻⁵) failed a right gradient."""
    x = np.array([1e6, -2.5e6, 3e6])
    for fn, derivative in ((lambda x: x**2, 2 * x), (lambda x: x**3, 3 * x**2)):
        report = nd.check_gradients(fn, [x], mode=mode)
        assert report.status == "pass", report
        # the bound 100·ε/h·(|x|·|f'| + |f|) is at most 0.2 of the derivative here (ε·|x|/h ≤ 6.7·10⁻⁴, |f| ≤ |x·f'|)
        assert report.rows[0].worst_tolerance < 0.2 * np.max(np.abs(derivative))
    # 3x for 2x: an error |x| against a tolerance below 0.2·2|x|
    assert nd.check_gradients(_square_wrong, [x], mode=mode).status == "fail"


def test_check_gradients__a_step_below_the_rounding_is_inconclusive_and_says_which_step_resolves() -> None:
    """Timestamps in seconds (1.7·10⁹) through sin(t / one day): at h = 10⁻⁶ rounding allows an error of about
    100·ε·|t|·|f'|/h ≈ 40·|f'|, so no verdict; the suggested step eps·max|t| resolves 10⁻⁵ (truncation h²/6 / day²)."""
    t = np.array([1.7e9, 1.7e9 + 3600.0])
    day = lambda t: tf.sin(t / 86400.0)  # noqa: E731
    report = nd.check_gradients(day, [t], input_names=["t"])
    row = report.rows[0]
    assert report.status == "warn" and report.passed and row.inconclusive and not report.checks[0].passed
    assert "eps=1.7e+03 (eps·max|t|)" in row.note and "WARN" in str(report)
    fine = nd.check_gradients(day, [t], eps=1.7e3)
    assert fine.status == "pass"
    np.testing.assert_allclose(fine.rows[0].numerical, np.cos(t / 86400.0)[fine.rows[0].worst_entry.endswith("[1]")] / 86400.0, rtol=1e-4)

    @tf.custom_gradient
    def day_wrong(t: tf.Tensor):  # noqa: ANN202
        return day(t), lambda dy: dy * 1.01 * tf.cos(t / 86400.0) / 86400.0  # 1% off

    assert nd.check_gradients(day_wrong, [t], eps=1.7e3).status == "fail"


def test_check_gradients__a_step_that_rounds_away_is_refused() -> None:
    """At 2³⁴ + 1 ≈ 1.7·10¹⁰ float64's spacing is 3.8·10⁻⁶, so x ± 10⁻⁶ is x: the difference would be 0/0 (a NaN)."""
    from natgrad_diag.exceptions import InputError

    for mode in ("full", "fast"):
        with pytest.raises(InputError, match=r"x ± eps rounds to x itself in x0") as info:
            nd.check_gradients(tf.sin, [np.array([2.0**34 + 1, 1.0])], mode=mode)
        assert "Argument: eps\n    Expected: a step above 1.91e-06" in str(info.value) and "eps=1.72e+04" in str(info.value)


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__a_nan_gradient_fails_with_its_reason_and_no_nan_error(mode: str) -> None:
    """‖x‖ at 0: TensorFlow's gradient is x/‖x‖ = 0/0 = NaN, while the central differences are exactly 0 (|±h|)."""
    report = nd.check_gradients(tf.norm, [np.zeros(2)], mode=mode)
    row = report.rows[0]
    assert report.status == "fail" and np.isnan(row.analytical) and row.numerical == 0.0
    assert row.worst_abs_error == row.max_abs_error == np.inf and row.worst_tolerance == 1e-7  # atol: no NaN bound
    assert "reverse mode gives nan here" in row.hint and "does not exist at this point" in row.hint
    assert "reverse mode gives nan" in str(nd.check_gradients(tf.norm, [np.zeros(2)], mode=mode).mismatch_message())


def _natural_point(condition: float, M: int = 8) -> tuple[Array, Array]:
    """GPflow's natural parameters (η₁ [M, 1], η₂ [1, M, M]) of a q(u) whose S has eigenvalues 1 … 1/condition."""
    from gpflow.optimizers.natgrad import meanvarsqrt_to_natural

    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.standard_normal((M, M)))
    S = Q @ np.diag(np.geomspace(1.0, 1 / condition, M)) @ Q.T
    e1, e2 = (t.numpy() for t in meanvarsqrt_to_natural(tf.constant(rng.standard_normal((M, 1))),
                                                        tf.constant(np.linalg.cholesky(S)[None])))
    return e1, (e2 + np.swapaxes(e2, -1, -2)) / 2


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__gpflow_map_at_condition_1e8_is_inconclusive_not_failed(mode: str) -> None:
    """At κ(S) = 10⁸ the inverse inside natural_to_meanvarsqrt amplifies rounding beyond any first-order bound in the
    map's own J (full mode failed varsqrt/nat2, 1.7·10⁻⁷ off against 10⁻⁷, where ∂varsqrt[9,9] is 10⁻¹⁵). fn's
    measured noise sees it: the verdict is WARN, with a note, never a FAIL of TensorFlow's own gradient."""
    from gpflow.optimizers.natgrad import natural_to_meanvarsqrt

    point = list(_natural_point(1e8, M=10))
    report = nd.check_gradients(natural_to_meanvarsqrt, point, mode=mode)
    assert report.status == "warn", report
    again = nd.check_gradients(natural_to_meanvarsqrt, point, mode=mode)  # the noise probes are seeded: same verdict
    assert [c.status for c in again.checks] == [c.status for c in report.checks]
    assert all(r.passed for r in report.rows) and any(r.inconclusive and "better-conditioned point" in r.note for r in report.rows)


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__gpflow_map_at_condition_1e6_passes_and_a_10_percent_error_fails(mode: str) -> None:
    """S with eigenvalues 1 … 10⁻⁶ makes η₂ = −½S⁻¹ reach 10⁵: fn's rounding is ε·Σ_k |∂y/∂x_k|·|x_k| (backward
    error), far above ε·|y|, and full mode failed TensorFlow's own gradient of GPflow's map (mean/nat2 off 3·10⁻⁶
    against a tolerance 8·10⁻⁷). A gradient 10% off still fails there."""
    from gpflow.optimizers.natgrad import natural_to_meanvarsqrt

    e1, e2 = _natural_point(1e6)
    assert np.linalg.cond(e2[0]) > 1e5
    assert nd.check_gradients(natural_to_meanvarsqrt, [e1, e2], mode=mode).status == "pass"

    @tf.custom_gradient
    def wrong(a, b):  # noqa: ANN001, ANN202
        with tf.GradientTape(persistent=True) as tape:  # fast mode asks for one VJP per output and direction
            tape.watch([a, b])
            y = natural_to_meanvarsqrt(a, b)
        return y, lambda *dy: [1.1 * g for g in tape.gradient(y, [a, b], output_gradients=list(dy))]

    report = nd.check_gradients(wrong, [e1, e2], structure=["general", "symmetric"], mode=mode)
    assert report.status == "fail" and not report.row(0, 0).passed


def _lml_of_kernel_matrix(Y: Array):
    """The GP log marginal likelihood as a function of the kernel matrix K [N, N] (Cholesky-based, as GPflow's GPR)."""

    def lml(K):  # noqa: ANN001, ANN202
        L = tf.linalg.cholesky(K)
        a = tf.linalg.cholesky_solve(L, tf.constant(Y))
        return -0.5 * tf.reduce_sum(tf.constant(Y) * a) - tf.reduce_sum(tf.math.log(tf.linalg.diag_part(L)))

    return lml


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__a_correct_gradient_at_gpflows_default_jitter_is_not_failed_and_a_wrong_one_still_is(mode: str) -> None:
    """K = SE kernel + 10⁻⁶·I (GPflow's default jitter): λmin(K) ≈ 10⁻⁶ is the step itself, so at eps = 10⁻⁶ the
    central differences are dominated by their O(eps²) error, and TensorFlow's correct gradient failed (numerical
    −6.7·10⁵ against 1.4·10⁵). They move when eps shrinks, so it is WARN, and the eps it names passes; a wrong
    gradient's error does not go away with them.
    Oracle: ½(a aᵀ − K⁻¹), a = K⁻¹y, the LML's gradient in closed form."""
    rng = np.random.default_rng(4)
    X = np.sort(rng.uniform(0.0, 1.0, (8, 1)), axis=0)
    Y = np.sin(3.0 * X)
    K = np.exp(-0.5 * (X - X.T) ** 2) + 1e-6 * np.eye(8)
    lml = _lml_of_kernel_matrix(Y)
    Kt = tf.constant(K)
    with tf.GradientTape() as tape:
        tape.watch(Kt)
        value = lml(Kt)
    g = tape.gradient(value, Kt).numpy()
    a, K_inv = np.linalg.solve(K, Y), np.linalg.inv(K)
    closed = 0.5 * (a @ a.T - K_inv)
    np.testing.assert_allclose((g + g.T) / 2, closed, atol=1e-6 * np.abs(closed).max())  # κ(K)·ε ≈ 10⁻⁷ relative

    report = nd.check_gradients(lml, [K], structure="symmetric", mode=mode)
    note = report.rows[0].note
    # the differences still move at 10⁻⁷, and at 10⁻⁸ rounding would allow more than the check does at 10⁻⁶: WARN
    assert report.status == "warn" and report.rows[0].inconclusive, report
    assert "O(eps²)" in note and "eps=1e-09" in note, note
    assert nd.check_gradients(lml, [K], structure="symmetric", mode=mode, eps=1e-9).status == "pass"  # the advice

    @tf.custom_gradient
    def wrong(K):  # noqa: ANN001, ANN202
        with tf.GradientTape(persistent=True) as t:  # fast mode asks for one VJP per direction
            t.watch(K)
            y = lml(K)
        return y, lambda dy: 1.5 * t.gradient(y, K, output_gradients=dy)

    assert nd.check_gradients(wrong, [K], structure="symmetric", mode=mode).status == "fail"


def test_check_gradients__a_derivative_below_atol_that_rounding_swamps_is_inconclusive_not_a_pass() -> None:
    """A GP's log marginal likelihood at variance 10⁸ (data on a 10⁴ scale): ∂/∂variance is 7.5·10⁻⁹, below atol =
    10⁻⁷, while rounding allows 1.2·10⁻⁶; a gradient twice too large, or of the wrong sign, passed. Oracle: the closed
    form ½·tr((a aᵀ − K⁻¹)·∂K/∂variance)."""
    Y = np.random.default_rng(5).normal(size=(5, 1)) * 1e4
    X = np.linspace(0.0, 1.0, 5)[:, None]
    shape = np.exp(-0.5 * (X - X.T) ** 2 / 0.3**2)
    K = 1e8 * shape + 1e2 * np.eye(5)
    a = np.linalg.solve(K, Y)
    closed = 0.5 * np.trace((a @ a.T - np.linalg.inv(K)) @ shape)
    assert 5e-9 < abs(closed) < 1e-7  # below the float64 default atol

    def lml_with(factor: float):  # noqa: ANN202
        @tf.custom_gradient
        def lml(variance):  # noqa: ANN001, ANN202
            with tf.GradientTape() as t:
                t.watch(variance)
                y = _lml_of_kernel_matrix(Y)(variance * tf.constant(shape) + 1e2 * tf.eye(5, dtype=tf.float64))
            return y, lambda dy: factor * t.gradient(y, variance, output_gradients=dy)

        return lml

    for factor in (1.0, 2.0, -1.0):
        report = nd.check_gradients(lml_with(factor), [np.array(1e8)])
        assert report.status == "warn" and report.rows[0].inconclusive, (factor, report)
        assert "inconclusive" in report.rows[0].note


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__a_custom_gradient_of_the_wrong_shape_or_count_is_an_input_error(mode: str) -> None:
    """A tf.custom_gradient returning a [5] gradient for a [3] input raised numpy's broadcast ValueError (full) or
    TensorFlow's InvalidArgumentError (fast), and two gradients for one input TensorFlow's ValueError."""
    from natgrad_diag.exceptions import InputError

    @tf.custom_gradient
    def wrong_shape(x):  # noqa: ANN001, ANN202
        return tf.sin(x), lambda dy: tf.ones(5, dtype=x.dtype)

    @tf.custom_gradient
    def two_grads(x):  # noqa: ANN001, ANN202
        return tf.sin(x), lambda dy: (dy, dy)

    for fn in (wrong_shape, two_grads):
        with pytest.raises(InputError, match=r"TensorFlow's gradient of fn failed") as info:
            nd.check_gradients(fn, [np.array([0.1, 0.2, 0.3])], mode=mode)
        assert "Argument: fn" in str(info.value) and "one gradient per input, of its shape" in str(info.value)


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__a_block_with_no_gradient_path_says_so(mode: str) -> None:
    """sin through NumPy: tape.gradient is None (TensorFlow sees no path), reverse mode gives 0 for the whole block
    while the central differences give cos(x); the hint named a wrong custom gradient instead."""
    fn = lambda x: tf.constant(np.sin(x.numpy()))  # noqa: E731
    report = nd.check_gradients(fn, [np.array([0.5, 1.0, 2.0])], mode=mode)
    row = report.rows[0]
    assert report.status == "fail" and row.analytical == 0.0 and row.numerical != 0.0
    assert "no gradient path from x0" in row.hint and "NumPy round-trip" in row.hint


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_gradients__a_smaller_step_never_passes_a_wrong_float32_gradient_its_rounding_hides(mode: str) -> None:
    """sin(1000x) in float32 at eps = 10⁻³: 1000·eps = 1, so the differences carry an O(eps²) error of 17% and move
    when eps shrinks. At eps/100 float32's rounding (∝ 1/eps) allows 20%, and a derivative 5% too large passed there.
    A smaller step is now taken only while its rounding stays within the check's tolerance at eps: 5% off is WARN,
    20% off fails, and the right derivative (the closed form 1000·cos(1000x)) passes at eps/10."""
    x = np.array([0.1001, 0.1002, 0.1003], np.float32)

    def sine(factor: float):  # noqa: ANN202
        @tf.custom_gradient
        def f(x):  # noqa: ANN001, ANN202
            return tf.sin(1000.0 * x), lambda dy: dy * factor * 1000.0 * tf.cos(1000.0 * x)

        return f

    right = nd.check_gradients(sine(1.0), [x], mode=mode)
    assert right.status == "pass", right
    if mode == "full":  # the worst entry's analytical value is one of the closed form's
        assert np.isclose(right.rows[0].analytical, 1000 * np.cos(1000 * x.astype(np.float64)), rtol=1e-3).any()
    five = nd.check_gradients(sine(1.05), [x], mode=mode)
    assert five.status == "warn" and "no smaller step settles them" in five.rows[0].note, five
    assert nd.check_gradients(sine(1.2), [x], mode=mode).status == "fail"
