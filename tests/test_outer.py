"""outer_example against closed forms: 2·sum(x), ∂(x_j x_k)/∂x_i = δ_ij x_k + x_j δ_ik, and 4 x Σx².

The expected numbers are computed here with numpy loops, independently of the report's own code path.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from natgrad_diag import OuterExample, outer_example
from natgrad_diag.exceptions import InputError, NonFiniteError, ShapeMismatchError

EXPECTED_WRONG_SEED = (
    "Mismatch in output_gradients. output_gradients[0] has a shape of [4] and target[0] has a shape of [4, 4].\n"
    "  Argument: output_gradients[0]\n"
    "    Expected: [4, 4] (target[0]'s shape)\n"
    "    Actual:   [4]\n"
    "  To fix: pass a seed of exactly the target's shape, e.g. tf.ones_like(target[0]) or dL/dtarget[0]; "
    "TensorFlow would broadcast it or fail deep inside."
)


def hand_jacobian(x: np.ndarray) -> np.ndarray:
    """J[j, k, i] = ∂(x_j x_k)/∂x_i = δ_ij x_k + x_j δ_ik, by loops."""
    n = len(x)
    J = np.zeros((n, n, n))
    for j in range(n):
        for k in range(n):
            for i in range(n):
                J[j, k, i] = (x[k] if i == j else 0.0) + (x[j] if i == k else 0.0)
    return J


@pytest.fixture(scope="module")
def default_report() -> OuterExample:
    return outer_example(use_torch=False)


def test_outer_example__default_numbers(default_report):
    r = default_report
    np.testing.assert_array_equal(r.x, [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(r.gradient_ones_seed, [20.0, 20.0, 20.0, 20.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.default_seed_gradient, [20.0, 20.0, 20.0, 20.0], rtol=0, atol=1e-12)
    assert r.jacobian_array.shape == (4, 4, 4)
    np.testing.assert_allclose(r.jacobian_array, hand_jacobian(np.array([1.0, 2.0, 3.0, 4.0])), rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.chain_one_step, [120.0, 240.0, 360.0, 480.0], rtol=0, atol=1e-10)  # 4·x·30
    np.testing.assert_allclose(r.chain_two_step, [120.0, 240.0, 360.0, 480.0], rtol=0, atol=1e-10)
    np.testing.assert_allclose(r.dL_dy, 2 * np.outer([1, 2, 3, 4], [1, 2, 3, 4]), rtol=0, atol=1e-12)
    assert r.passed


def test_outer_example__wrong_seed_messages(default_report):
    r = default_report
    assert r.wrong_seed_error == EXPECTED_WRONG_SEED
    assert r.tensorflow_wrong_seed == (
        "InvalidArgumentError: Input to reshape is a tensor with 1 values, but the requested shape has 4"
    )
    assert r.tensorflow_broadcast_shape == (4, 4)  # TensorFlow 2.21 broadcasts the [4, 1] seed silently
    assert "output_gradients[0] has a shape of [4, 1] and target[0] has a shape of [4]." in r.broadcast_seed_error


@settings(max_examples=10)
@given(x=st.lists(st.floats(-5, 5, allow_nan=False, allow_infinity=False), min_size=1, max_size=6))
def test_outer_example__random_x_against_closed_forms(x):
    xn = np.array(x)
    r = outer_example(x, use_torch=False)
    scale = 1.0 + np.max(np.abs(xn)) ** 3
    np.testing.assert_allclose(r.gradient_ones_seed, 2 * xn.sum() * np.ones(len(x)), rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(r.jacobian_array, hand_jacobian(xn), rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(r.chain_one_step, 4 * xn * np.sum(xn**2), rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(r.chain_two_step, 4 * xn * np.sum(xn**2), rtol=1e-12, atol=1e-12 * scale)
    assert r.passed, [str(c) for c in r.checks if not c.passed]


def test_outer_example__jacobian_contracted_by_hand_with_any_seed(default_report):
    """The report's J, contracted with a random seed by hand, equals output_gradients with that seed."""
    import tensorflow as tf

    from natgrad_diag import checked_gradient

    v = np.random.default_rng(7).normal(size=(4, 4))
    x = tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = x[:, None] * x[None, :]
    got = checked_gradient(tape, y, x, tf.constant(v)).numpy()
    by_hand = np.array([sum(v[j, k] * default_report.jacobian_array[j, k, i] for j in range(4) for k in range(4)) for i in range(4)])
    closed = v @ x.numpy() + v.T @ x.numpy()  # Σ_k v_ik x_k + Σ_j v_ji x_j
    np.testing.assert_allclose(got, by_hand, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, closed, rtol=1e-12, atol=1e-12)


def test_outer_example__str_is_the_lesson(default_report):
    text = str(default_report)
    assert text.startswith("grad_outputs / output_gradients for y = outer(x, x), x = [1, 2, 3, 4] (float64)\n")
    assert "2·sum(x) = 2·10 = 20 for every i" in " ".join(text.split())
    assert "dL/dx_i = Σ_jk v_jk · ∂y_jk/∂x_i,     ∂y_jk/∂x_i = δ_ij x_k + x_j δ_ik" in text
    flat = " ".join(text.split())  # paragraphs are wrapped at 80 columns
    assert (
        "- TensorFlow's tape.gradient: InvalidArgumentError: Input to reshape is a tensor with 1 values, "
        "but the requested shape has 4" in flat
    )
    assert 'TensorFlow returns a "gradient" of shape [4, 4] for a [4] source, with no error.' in flat
    assert "The PyTorch cross-check did not run: skipped (use_torch=False)." in flat
    assert text.endswith("Verdict: all checks hold.")


def test_outer_example__to_dict_is_json(default_report):
    d = json.loads(json.dumps(default_report.to_dict()))
    assert d["gradient_ones_seed"] == [20.0, 20.0, 20.0, 20.0]
    assert d["jacobian_shape"] == [4, 4, 4]
    assert d["passed"] is True
    names = [c["name"] for c in d["checks"]]
    assert names == [
        "ones_seed_is_2_sum_x", "default_seed_is_ones", "jacobian_closed_form", "contraction_equals_gradient",
        "chain_two_steps_equal_one", "chain_closed_form", "wrong_seed_caught", "broadcast_seed_caught",
    ]  # fmt: skip
    assert d["torch"]["available"] is False
    assert d["wrong_seed_error"] == EXPECTED_WRONG_SEED


def test_outer_example__is_frozen(default_report):
    with pytest.raises(dataclasses.FrozenInstanceError):
        default_report.x = np.zeros(4)  # type: ignore[misc]


def test_outer_example__leaves_the_input_untouched():
    import tensorflow as tf

    a = np.array([0.5, -1.5, 2.0])
    before = a.copy()
    r = outer_example(a, use_torch=False)
    np.testing.assert_array_equal(a, before)
    assert r.x is not a
    v = tf.Variable([0.5, -1.5, 2.0], dtype=tf.float64)
    outer_example(v, use_torch=False)
    np.testing.assert_array_equal(v.numpy(), before)


def test_outer_example__failed_check_is_reported_not_raised():
    x = [0.1257302210933933, -0.1321048632913019, 0.6404226504432821, 0.10490011715303971, -0.535669373161111]
    r = outer_example(x, rtol=0.0, atol=0.0, use_torch=False)  # exact equality: rounding makes some fail
    failed = [c for c in r.checks if not c.passed]
    assert failed and not r.passed
    assert all(c.max_abs_error is not None and 0 < c.max_abs_error < 1e-14 for c in failed)
    assert "check(s) FAILED" in str(r)


@pytest.mark.parametrize(
    "x, error, fragment",
    [
        ([], ShapeMismatchError, "between 1 and 64 entries"),
        (list(range(65)), ShapeMismatchError, "between 1 and 64 entries"),
        ([[1.0, 2.0]], ShapeMismatchError, "x must be a vector"),
        ([1.0, float("nan")], NonFiniteError, "x contains 1 NaN"),
        (["a", "b"], InputError, "x must be a list of numbers"),
    ],
    ids=["empty", "too_long", "matrix", "nan", "strings"],
)
def test_outer_example__bad_x(x, error, fragment):
    with pytest.raises(error, match=fragment) as info:
        outer_example(x, use_torch=False)
    assert "Argument: x" in str(info.value)


def test_outer_example__bad_tolerance():
    with pytest.raises(InputError) as info:
        outer_example(rtol=-1.0, use_torch=False)
    assert str(info.value) == (
        "Invalid input. rtol must be a finite number ≥ 0.\n"
        "  Argument: rtol\n"
        "    Expected: a finite number ≥ 0, e.g. 1e-10\n"
        "    Got:      -1.0\n"
        "  To fix: pass rtol= a non-negative float, or leave it out for the dtype's default."
    )


def test_outer_cli__json_and_exit_codes(capsys):
    from natgrad_diag.cli.app import main

    assert main(["outer", "--json", "--x", "2,3"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["gradient_ones_seed"] == [10.0, 10.0]
    assert d["jacobian_shape"] == [2, 2, 2]
    assert d["chain_one_step"] == d["chain_two_step"] == [104.0, 156.0]  # 4·x·Σx² = 4·13·(2, 3)
    from natgrad_diag.torch_bridge import torch_available

    torch_names = ("torch_ones_seed_agrees", "torch_jacobian_agrees", "torch_chain_agrees", "torch_rejects_wrong_seed")
    assert d["torch"]["available"] is torch_available()
    assert [(c["name"], c["passed"]) for c in d["checks"]] == [
        (name, True) for name in (
            "ones_seed_is_2_sum_x", "default_seed_is_ones", "jacobian_closed_form", "contraction_equals_gradient",
            "chain_two_steps_equal_one", "chain_closed_form", "wrong_seed_caught", "broadcast_seed_caught",
            *(torch_names if torch_available() else ()),
        )
    ]  # fmt: skip
    assert main(["outer", "--x", "1,nan"]) == 2
    err = capsys.readouterr().err
    assert "natgrad-diag outer: Non-finite values. x contains 1 NaN" in err
