"""Bad and edge inputs: each gets a correct result or a clear NatGradDiagError naming the argument.

One test per case; a raw TensorFlow/numpy/Python error, a silently wrong result or accepted nonsense fails it.
Numbers are checked against independent oracles (closed-form derivatives).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import tensorflow as tf

from natgrad_diag.autodiff.dense import jacobian
from natgrad_diag.autodiff.seeded import checked_gradient, vjp
from natgrad_diag.exceptions import DTypeMismatchError, InputError, NonFiniteError, ShapeMismatchError
from natgrad_diag.gradcheck.api import assert_gradients, check_gradients
from natgrad_diag.testing import assert_vjp_matches_jacobian


def _argument(error: BaseException) -> str:
    """The value of the message's "Argument:" line."""
    lines = [line.split(":", 1)[1].strip() for line in str(error).splitlines() if line.strip().startswith("Argument:")]
    assert lines, f"no Argument: line in {error}"
    return lines[0]


@tf.custom_gradient
def _sin_one_percent_wrong(x):
    """sin(x) whose gradient is 1.01·cos(x): a 1% error that float64's tolerance (rtol 1e-5) must catch."""

    def grad(dy):
        return dy * tf.cos(x) * 1.01

    return tf.sin(x), grad


# ---- 1. Python numbers and lists are float64 everywhere ------------------------------------------------


@pytest.mark.parametrize("point", [2.0, [2.0], np.array(2.0)], ids=["number", "list", "numpy"])
def test_check_gradients__python_number_is_float64(point):
    report = check_gradients(_sin_one_percent_wrong, point)
    assert report.dtype == "float64"
    assert report.rtol == 1e-5  # float64's finite-difference tolerance (tolerance.py), not float32's 2e-2
    assert not report.passed  # 1% > 1e-5: the wrong gradient is caught, as with np.array(2.0)


def test_jacobian__python_number_is_float64():
    J = jacobian(lambda a, b: a * b, [2.0, 3.0])
    assert J.compact.dtype == np.float64
    np.testing.assert_array_equal(J.compact, [[3.0, 2.0]])  # ∂(ab)/∂a = b, ∂(ab)/∂b = a


# ---- 2. jacobian() and vjp ------------------------------------------------------------------------------


def test_jacobian__integer_input_is_refused():
    with pytest.raises(DTypeMismatchError) as info:
        jacobian(lambda x: x * 2, [tf.constant([1, 2])])
    assert _argument(info.value) == "inputs[0] (x0)"
    assert "int32" in str(info.value)


def test_jacobian__integer_output_is_refused():
    with pytest.raises(DTypeMismatchError) as info:
        jacobian(lambda x: tf.cast(x, tf.int32), [tf.constant([1.0, 2.0], tf.float64)])
    assert _argument(info.value) == "fn"
    assert "int32" in str(info.value)


def test_jacobian__fn_not_callable():
    with pytest.raises(InputError) as info:
        jacobian(5, [tf.constant([1.0], tf.float64)])
    assert _argument(info.value) == "fn"


@pytest.mark.parametrize("inputs, argument", [(None, "inputs"), ([None], "inputs[0] (x0)")], ids=["None", "list_of_None"])
def test_jacobian__none_inputs(inputs, argument):
    with pytest.raises(InputError) as info:
        jacobian(tf.sin, inputs)
    assert _argument(info.value) == argument


def test_jacobian__fn_returning_none():
    with pytest.raises(InputError) as info:
        jacobian(lambda x: None, [tf.constant([1.0], tf.float64)])
    assert _argument(info.value) == "fn"
    assert "returned None" in str(info.value)


def test_jacobian__output_dtype_differs_from_input():
    with pytest.raises(DTypeMismatchError) as info:
        jacobian(lambda x: tf.cast(x, tf.float32), [tf.constant([1.0, 2.0], tf.float64)])
    assert _argument(info.value) == "fn"
    assert "float32" in str(info.value) and "float64" in str(info.value)


def _nested(a):
    return {"z": (tf.sin(a), 2 * a), "w": [tf.reduce_sum(a)]}


def test_jacobian__nested_dict_outputs():
    a = np.array([1.0, 2.0])
    J = jacobian(_nested, [tf.constant(a)])
    # tf.nest.flatten orders a dict by its sorted keys: w, then z's tuple
    assert J.output_names == ("w/0", "z/0", "z/1")
    np.testing.assert_allclose(J.block(0, 0), [1.0, 1.0], rtol=0, atol=0)  # ∂Σa/∂a
    np.testing.assert_allclose(J.block(1, 0), np.diag(np.cos(a)), rtol=1e-15, atol=0)
    np.testing.assert_allclose(J.block(2, 0), 2 * np.eye(2), rtol=0, atol=0)


def test_check_gradients__nested_dict_outputs():
    report = check_gradients(_nested, [np.array([1.0, 2.0])])
    assert report.output_names == ("w/0", "z/0", "z/1")
    assert report.passed


def _int_keys(a):
    return {10: tf.sin(a), 9: 2 * a, 2: a**2}


def test_jacobian__int_dict_keys_in_tf_nest_order():
    a = np.array([1.0, 2.0])
    J = jacobian(_int_keys, [tf.constant(a)])
    assert J.output_names == ("2", "9", "10")  # tf.nest's numeric order, not the strings' "10" < "2" < "9"
    np.testing.assert_allclose(J.block(0, 0), np.diag(2 * a), rtol=1e-15, atol=0)  # ∂a²/∂a, the row named "2"
    np.testing.assert_allclose(J.block(2, 0), np.diag(np.cos(a)), rtol=1e-15, atol=0)


def test_check_gradients__int_dict_keys_in_tf_nest_order():
    report = check_gradients(_int_keys, [np.array([1.0, 2.0])])
    assert report.output_names == ("2", "9", "10")
    assert report.output_shapes == ((2,), (2,), (2,))


@pytest.mark.parametrize("fn", [tf.norm, tf.sqrt], ids=["norm", "sqrt"])
def test_vjp_and_checked_gradient__no_derivative_at_the_point_is_an_error_not_a_nan(fn):
    """d‖x‖/dx = x/‖x‖ and d√x/dx = 1/(2√x) do not exist at 0: TensorFlow returns NaN or Inf, which came back silently."""
    x = tf.zeros(3, tf.float64)
    with pytest.raises(NonFiniteError, match=r"primals\[0\]'s gradient contains(.|\n)*no derivative at 0"):
        vjp(fn, x, tf.ones_like(fn(x)))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    with pytest.raises(NonFiniteError, match=r"sources\[0\]'s gradient"):
        checked_gradient(tape, y, x, tf.ones_like(y))
    assert np.allclose(vjp(fn, x + 4.0, tf.ones_like(fn(x)))[1], 4 / np.sqrt(48) if fn is tf.norm else 0.25)  # x/‖x‖, 1/2√x


def test_vjp__fn_returning_none_is_told_to_return_its_outputs_not_to_use_a_tape():
    with pytest.raises(InputError, match=r"(?s)Got:\s+None.*return fn's output tensor\(s\).*a missing return") as info:
        vjp(lambda x: None, tf.ones(2, tf.float64), tf.ones(2, tf.float64))
    assert "GradientTape" not in str(info.value)


def test_vjp__integer_output_is_refused():
    x = tf.constant([1.0, 2.0], tf.float64)
    with pytest.raises(DTypeMismatchError) as info:
        vjp(lambda x: tf.cast(x, tf.int32), x, tf.constant([1, 1]))
    assert "int32" in str(info.value)
    _argument(info.value)


def test_vjp__gather_returns_dense_tensor():
    x = tf.constant([1.0, 2.0, 3.0], tf.float64)
    _, g = vjp(lambda x: tf.gather(x, [0, 2, 0]), x, tf.constant([1.0, 2.0, 3.0], tf.float64))
    assert isinstance(g, tf.Tensor)  # not tf.IndexedSlices
    np.testing.assert_array_equal(g.numpy(), [4.0, 0.0, 2.0])  # v scattered back: x0 gets 1 + 3, x2 gets 2


# ---- 3. checked_gradient's target -----------------------------------------------------------------------


@pytest.mark.parametrize("target", [None, 2.0, np.array([1.0, 2.0])], ids=["None", "number", "numpy"])
def test_checked_gradient__target_not_a_tensor(target):
    x = tf.constant([1.0, 2.0], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        _ = 2 * x
    with pytest.raises(InputError) as info:
        checked_gradient(tape, target, x)
    assert _argument(info.value) == "target"
    assert "not a tensor" in str(info.value)


# ---- 6. tolerances and memory limits --------------------------------------------------------------------

_BAD_OPTIONS = [
    ({"rtol": "abc"}, "rtol"),
    ({"rtol": -1}, "rtol"),
    ({"atol": float("nan")}, "atol"),
    ({"max_bytes": -1}, "max_bytes"),
]


@pytest.mark.parametrize("kwargs, argument", _BAD_OPTIONS, ids=[a + "=" + repr(v) for k, a in _BAD_OPTIONS for v in k.values()])
def test_check_gradients__bad_tolerance_or_limit(kwargs, argument):
    with pytest.raises(InputError) as info:
        check_gradients(tf.sin, [np.array([1.0])], **kwargs)
    assert _argument(info.value) == argument


@pytest.mark.parametrize("kwargs, argument", _BAD_OPTIONS, ids=[a + "=" + repr(v) for k, a in _BAD_OPTIONS for v in k.values()])
def test_assert_gradients__bad_tolerance_or_limit(kwargs, argument):
    with pytest.raises(InputError) as info:
        assert_gradients(tf.sin, [np.array([1.0])], **kwargs)
    assert _argument(info.value) == argument


@pytest.mark.parametrize("kwargs, argument", _BAD_OPTIONS, ids=[a + "=" + repr(v) for k, a in _BAD_OPTIONS for v in k.values()])
def test_assert_vjp_matches_jacobian__bad_tolerance_or_limit(kwargs, argument):
    # before: rtol="abc" raised a raw ValueError, rtol=-1 and atol=nan a false "Jacobian mismatch",
    # max_bytes=-1 "a limit of −9.54e-07 MiB"
    with pytest.raises(InputError) as info:
        assert_vjp_matches_jacobian(tf.sin, [np.array([1.0])], [np.array([1.0])], **kwargs)
    assert _argument(info.value) == argument


@pytest.mark.parametrize("kwargs, argument", _BAD_OPTIONS[:3], ids=[a + "=" + repr(v) for k, a in _BAD_OPTIONS[:3] for v in k.values()])
def test_compare_with_tensorflow__bad_tolerance_is_refused_before_any_work(kwargs, argument):
    # rtol=-1 failed an exact agreement (tolerance −21), rtol="1e-3" raised numpy's TypeError
    from natgrad_diag.torch_bridge import compare_with_tensorflow

    with pytest.raises(InputError) as info:
        compare_with_tensorflow(tf.sin, None, [np.array([1.0])], [np.array([1.0])], **kwargs)
    assert _argument(info.value) == argument


@pytest.mark.parametrize("argument", ["compiled", "use_torch"])
def test_bool_options__a_truthy_string_is_refused_not_read_as_true(argument):
    from natgrad_diag import jacobian
    from natgrad_diag.lessons.outer import outer_example

    with pytest.raises(InputError) as info:
        jacobian(tf.sin, [np.array([1.0])], compiled="no") if argument == "compiled" else outer_example(use_torch="no")
    assert _argument(info.value) == argument


@pytest.mark.parametrize("eps", [0.0, -1.0, np.inf, np.nan, True], ids=["zero", "negative", "inf", "nan", "bool"])
@pytest.mark.parametrize("dtype, default", [(np.float64, 1e-6), (np.float32, 1e-3)], ids=["float64", "float32"])
def test_check_gradients__bad_eps_asks_for_a_step_above_0_and_suggests_the_dtypes_default(eps, dtype, default):
    """One rule, eps > 0, for every bad step; the step suggested is the dtype's default (docs/gradient-checks.md's
    table: float64 1e-6, float32 1e-3), and it is accepted: x² checks out with it."""
    point = [np.array([0.5, 2.0], dtype)]
    with pytest.raises(InputError) as info:
        check_gradients(lambda x: x**2, point, eps=eps)
    message = str(info.value)
    assert _argument(info.value) == "eps" and "> 0" in message and "≥ 0" not in message and "non-negative" not in message
    (suggested,) = set(re.findall(r"e\.g\. (?:eps=)?([0-9.e+-]+)", message))
    assert float(suggested) == default
    assert check_gradients(lambda x: x**2, point, eps=float(suggested)).passed


def test_jacobian__negative_max_bytes():
    with pytest.raises(InputError) as info:
        jacobian(tf.sin, [np.array([1.0])], max_bytes=-1)
    assert _argument(info.value) == "max_bytes"
    assert "MiB" not in str(info.value)


def test_check_memory__negative_limit():
    from natgrad_diag.autodiff.memory import check_memory

    with pytest.raises(InputError) as info:
        check_memory(8, -1, "a Jacobian")
    assert _argument(info.value) == "max_bytes"


# ---- 4. natgrad_trace ------------------------------------------------------------------------------------


def _q(M=3, L=1, dtype=np.float64):
    rng = np.random.default_rng(0)
    q_sqrt = np.tril(0.1 * rng.standard_normal((L, M, M)), -1) + np.eye(M)
    return (np.zeros((M, L), dtype), q_sqrt.astype(dtype), np.ones((M, L), dtype), np.tril(np.full((L, M, M), 0.1)).astype(dtype))


def test_natgrad_trace__float16_is_refused():
    from natgrad_diag.step.trace import natgrad_trace

    with pytest.raises(DTypeMismatchError) as info:
        natgrad_trace(*_q(dtype=np.float16))
    assert _argument(info.value) == "q_mu"
    assert "float16" in str(info.value)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_natgrad_trace__q_sqrt_above_diagonal(compiled):
    from natgrad_diag.step.trace import natgrad_trace

    q_mu, q_sqrt, g_mu, g_sq = _q()
    q_sqrt[0, 0, 2] = 0.5
    with pytest.raises(InputError) as info:
        natgrad_trace(q_mu, q_sqrt, g_mu, g_sq, compiled=compiled)
    assert _argument(info.value) == "q_sqrt"
    assert "q_sqrt[0, 0, 2] = 0.5" in str(info.value)


def test_natgrad_trace__q_sqrt_with_triangular_transform_is_accepted():
    import gpflow

    from natgrad_diag.step.trace import natgrad_trace

    q_mu, q_sqrt, _, _ = _q()
    sq = gpflow.Parameter(q_sqrt, transform=gpflow.utilities.triangular())
    mu = gpflow.Parameter(q_mu)
    g_sq = np.full(sq.unconstrained_variable.shape, 0.1)
    trace = natgrad_trace(mu, sq, np.ones_like(q_mu), g_sq)
    assert np.all(np.isfinite(trace.new_q_sqrt))
    # the oracle: GPflow's own update from the same unconstrained gradients, applied to copies of the parameters
    mu_o = gpflow.Parameter(q_mu)
    sq_o = gpflow.Parameter(q_sqrt, transform=gpflow.utilities.triangular())
    gpflow.optimizers.NaturalGradient(1.0)._natgrad_apply_gradients(tf.constant(np.ones_like(q_mu)), tf.constant(g_sq), mu_o, sq_o)
    np.testing.assert_allclose(trace.new_q_mu, mu_o.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(trace.new_q_sqrt, sq_o.numpy(), rtol=0, atol=1e-10)


def test_natgrad_trace__inside_tf_function():
    from natgrad_diag.step.trace import natgrad_trace

    q = [tf.constant(a) for a in _q()]

    @tf.function
    def step(a, b, c, d):
        return natgrad_trace(a, b, c, d).new_q_mu

    with pytest.raises(InputError) as info:
        step(*q)
    assert "eagerly" in str(info.value)
    _argument(info.value)


@pytest.mark.parametrize("M, L", [(0, 1), (3, 0)], ids=["M=0", "L=0"])
def test_natgrad_trace__empty_q(M, L):
    from natgrad_diag.exceptions import ShapeMismatchError
    from natgrad_diag.step.trace import natgrad_trace

    with pytest.raises(ShapeMismatchError) as info:
        natgrad_trace(np.zeros((M, L)), np.zeros((L, M, M)), np.zeros((M, L)), np.zeros((L, M, M)))
    assert _argument(info.value) == "q_mu"


# ---- 5. demo models, sizes, data -------------------------------------------------------------------------


def test_make_model__negative_seed():
    from natgrad_diag.demo import make_model

    with pytest.raises(InputError) as info:
        make_model(seed=-1)
    assert _argument(info.value) == "seed"


def test_make_model__too_large_is_refused_before_allocation():
    from natgrad_diag.autodiff.memory import memory_limit
    from natgrad_diag.demo import make_model
    from natgrad_diag.exceptions import MemoryLimitError

    with pytest.raises(MemoryLimitError) as info:
        make_model(num_inducing=100_000)  # M² float64 = 80 GB per matrix: never allocated
    M, N, L = 100_000, 50, 1  # demo.py's estimate by hand: 4 M² temporaries, q_sqrt and its copies 4·L·M², K_mm and
    need = 8 * ((4 + 4 * L) * M * M + M * M + 4 * M * N + N * (1 + L) + M * L)  # K_mm M², K_mn and 3 on the tape 4·M·N,
    # the data N·(1 + L), q_mu M·L
    assert need > memory_limit()
    assert f"Estimated size: {need} bytes" in str(info.value)


def test_check_cli__num_inducing_100000_exits_2_with_estimate(capsys):
    # in-process (the installed entry point has its one subprocess test in test_cli.py)
    from natgrad_diag.cli.app import main

    assert main(["check", "--num-inducing", "100000"]) == 2
    err = capsys.readouterr().err
    assert "Estimated size:" in err and "GiB" in err


def test_check_cli__a_large_n_is_refused_for_the_checks_own_arrays_even_with_max_minutes_0(capsys):
    """At M = 10, N = 1e8 the model's arrays fit in half of 24 GB but the check peaked at 22 GB (three more [M, N]
    arrays on the loss's tape) and died in TensorFlow with a raw ResourceExhaustedError after two minutes. At an N where
    the model alone is half the limit, the check is now refused before TensorFlow loads."""
    from natgrad_diag.autodiff.memory import memory_limit
    from natgrad_diag.cli.app import main

    N = memory_limit() // (8 * 2 * (10 + 2))  # the model alone: 8·(10·N + 2·N) = half the limit
    assert main(["check", "--num-data", str(N), "--max-minutes", "0"]) == 2
    err = capsys.readouterr().err
    assert "Too large for this machine's memory" in err and "Argument:       num_data" in err, err


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["svgp", "vgp"]), st.integers(1, 3000), st.integers(1, 3000), st.integers(1, 10**5), st.integers(1, 1000),
       st.sampled_from(["M", "N", "L", "gamma_steps"]))  # fmt: skip
def test_check_seconds__never_falls_when_a_size_grows(name, M, N, L, k, grown):
    from natgrad_diag.demo import check_seconds

    sizes = dict(M=M, N=N, L=L, gamma_steps=k)
    seconds, argument = check_seconds(name, **sizes)
    sizes[grown] += 1
    assert check_seconds(name, **sizes)[0] >= seconds > 0
    assert argument in ("--num-inducing", "--num-data", "--num-latent", "--gamma-steps")


def test_check_model_work__refuses_exactly_above_the_limit_and_never_at_zero():
    from natgrad_diag.demo import check_model_work, check_seconds

    seconds, argument = check_seconds("vgp", M=10, N=3000, L=2, gamma_steps=3)
    assert argument == "--num-data"  # L·N³ dominates a VGP
    check_model_work("vgp", M=10, N=3000, L=2, gamma_steps=3, max_minutes=seconds / 60 * (1 + 1e-9))
    check_model_work("vgp", M=10, N=3000, L=2, gamma_steps=3, max_minutes=0)
    with pytest.raises(InputError) as info:
        check_model_work("vgp", M=10, N=3000, L=2, gamma_steps=3, max_minutes=seconds / 60 * (1 - 1e-9))
    assert _argument(info.value) == "--num-data" and "--max-minutes 0" in str(info.value)


@pytest.mark.parametrize(("kwargs", "named"), [
    (dict(max_minutes=True), "max_minutes"), (dict(max_minutes=-1.0), "max_minutes"), (dict(max_minutes=float("nan")), "max_minutes"),
    (dict(max_minutes="2"), "max_minutes"), (dict(gamma_steps=0), "gamma_steps"), (dict(L=0), "num_latent"), (dict(name="sgpr"), "model"),
])  # fmt: skip
def test_check_model_work__bad_arguments_are_named(kwargs, named):
    from natgrad_diag.demo import check_model_work

    args = dict(name="svgp", M=10, N=50, L=1, gamma_steps=5, max_minutes=2.0) | kwargs
    with pytest.raises(InputError) as info:
        check_model_work(**args)
    assert _argument(info.value) == named


def test_check_cli__an_hours_vgp_is_refused_before_the_model_is_built():
    """The 5000-point VGP (about 30 estimated minutes) is refused by the function behind ``natgrad-diag check`` as by
    the command; without a limit (its default in Python) the same sizes pass the estimate."""
    from natgrad_diag.cli.check import check_natgrad_cli
    from natgrad_diag.demo import check_model_work

    with pytest.raises(InputError) as info:
        check_natgrad_cli(model="vgp", num_data=5000, max_minutes=2)
    assert _argument(info.value) == "--num-data" and "about 30 minutes" in str(info.value)
    check_model_work("vgp", M=10, N=5000, L=1, gamma_steps=5, max_minutes=0)
    with pytest.raises(InputError, match="about 3 minutes on a 2-core machine, more than --max-minutes 2"):
        check_model_work("svgp", M=10, N=10**8, L=1, gamma_steps=5, max_minutes=2)  # 2.34 minutes: "about 2" was rounded down


def test_bench_cli__sizes_100000_refused_before_allocation(capsys):
    # through the CLI's main: tests other than the benchmark's own do not import natgrad_diag.bench (test_layout)
    from natgrad_diag.cli.app import main

    assert main(["bench", "--sizes", "100000"]) == 2
    need = 16 * 100_000**2 * 8  # 16 M×M float64 matrices (bench/runner.py's estimate)
    assert f"Estimated size: {need} bytes" in capsys.readouterr().err


def _svgp(D=1, L=1):
    import gpflow

    Z = np.linspace(0, 1, 4)[:, None] * np.ones((1, D))
    return gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(),
                              gpflow.inducing_variables.InducingPoints(Z), num_latent_gps=L)  # fmt: skip


@pytest.mark.parametrize(
    "data, argument",
    [
        ((np.zeros((5, 2)), np.zeros((5, 1))), "data[0] (X)"),
        ((np.zeros((5, 1)), np.zeros((5, 3))), "data[1] (Y)"),
        ((np.zeros((5, 1)), np.zeros((5, 0))), "data[1] (Y)"),
        ((np.zeros((0, 1)), np.zeros((0, 1))), "data[0] (X)"),
        ((np.zeros((5, 1)), np.zeros((4, 1))), "data"),
        ((np.zeros(5), np.zeros((5, 1))), "data[0] (X)"),
        ((np.zeros((5, 1), complex), np.zeros((5, 1))), "data[0] (X)"),
        ((np.zeros((5, 1)), np.full((5, 1), np.nan)), "data[1] (Y)"),
        ((np.zeros((5, 1)),), "data"),
    ],
    ids=["X_wrong_D", "Y_wrong_L", "Y_no_columns", "N_zero", "N_differs", "X_not_matrix", "X_complex", "Y_nan", "not_a_pair"],
)
def test_check_natgrad__data_that_does_not_fit_the_model_is_refused_before_any_work(data, argument):
    from natgrad_diag import check_natgrad

    model = _svgp()
    before = [v.numpy().copy() for v in model.variables]
    with pytest.raises(InputError) as info:
        check_natgrad(model, data, progress=False)
    assert _argument(info.value) == argument
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, model.variables))


@pytest.mark.slow  # ~5 s; the data checks above (a complex X refused) run by default
def test_check_natgrad__fitting_data_of_another_real_dtype_is_cast_and_checked():
    from natgrad_diag import check_natgrad

    X = np.linspace(0, 1, 5)[:, None] * np.ones((1, 2))
    model = _svgp(D=2, L=2)
    report = check_natgrad(model, (X.astype(np.float32), np.ones((5, 2), dtype=np.int64)), progress=False, mode="fast")
    assert report.num_data == 5 and report.passed, str(report)
    # the oracle: GPflow's own loss on the same data cast to float64 by numpy
    oracle = float(model.training_loss((X.astype(np.float32).astype(np.float64), np.ones((5, 2)))).numpy())
    assert report.loss_before == pytest.approx(oracle, rel=1e-12)


@pytest.mark.slow
def test_check_natgrad__a_switched_likelihoods_index_column_is_accepted_and_its_loss_is_gpflows():
    """GPflow's SwitchedLikelihood reads Y [N, L + 1], the last column picking each point's likelihood."""
    import gpflow

    from natgrad_diag import check_natgrad

    X = np.linspace(0, 1, 8)[:, None]
    Y = np.hstack([np.sin(6 * X), np.arange(8)[:, None] % 2])
    lik = gpflow.likelihoods.SwitchedLikelihood([gpflow.likelihoods.Gaussian(0.1), gpflow.likelihoods.StudentT()])
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), lik, X[::2].copy(), num_data=8)
    report = check_natgrad(model, (X, Y), gamma=0.1, progress=False, mode="fast")
    assert report.loss_before == pytest.approx(float(model.training_loss((X, Y)).numpy()), rel=1e-12)
    assert report.check("reproduction").passed
    with pytest.raises(ShapeMismatchError, match=r"the last column picks the likelihood") as info:
        check_natgrad(model, (X, Y[:, :1]), progress=False)  # the index column is missing
    assert _argument(info.value) == "data[1] (Y)"


@pytest.mark.slow
def test_check_natgrad__softmax_keeps_integer_labels_and_refuses_float_ones_by_name():
    """GPflow's Softmax takes integer class labels (sparse softmax cross-entropy): a cast to float64 broke it."""
    import gpflow

    from natgrad_diag import check_natgrad

    X = np.linspace(0, 1, 9)[:, None]
    labels = (np.arange(9) % 3)[:, None]
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Softmax(3), X[::2].copy(), num_latent_gps=3)
    report = check_natgrad(model, (X, labels), gamma=0.05, progress=False, mode="fast")
    assert report.check("reproduction").passed  # natgrad-diag's step equals GPflow's, from the same gradients
    with pytest.raises(DTypeMismatchError, match="integer class labels") as info:
        check_natgrad(model, (X, labels.astype(np.float64)), progress=False)
    assert _argument(info.value) == "data[1] (Y)"


@pytest.mark.slow
def test_check_natgrad__y_columns_follow_the_likelihoods_own_dimensions_not_its_class_name():
    """A likelihood that takes the L latent GPs together (GPflow's latent_dim) reads observation_dim columns of Y, one
    class label for a multi-class one, whatever its class is called: a renamed MultiClass was refused, and a one-hot Y
    (one column per class) or a two-column Y for the heteroskedastic likelihood reached GPflow's loss."""
    import gpflow

    from natgrad_diag import check_natgrad

    class LabelSmoothed(gpflow.likelihoods.MultiClass):
        pass

    X = np.linspace(0, 1, 9)[:, None]
    labels = ((np.arange(9) % 3)[:, None]).astype(np.float64)
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), LabelSmoothed(3), X[::2].copy(), num_latent_gps=3)
    report = check_natgrad(model, (X, labels), gamma=0.05, progress=False, mode="fast")
    assert report.loss_before == pytest.approx(float(model.training_loss((X, labels)).numpy()), rel=1e-12)
    with pytest.raises(ShapeMismatchError, match="LabelSmoothed takes 1") as info:
        check_natgrad(model, (X, np.eye(3)[labels[:, 0].astype(int)]), progress=False)
    assert _argument(info.value) == "data[1] (Y)"
    hetero = gpflow.likelihoods.HeteroskedasticTFPConditional()
    model = gpflow.models.SVGP(gpflow.kernels.SeparateIndependent([gpflow.kernels.SquaredExponential()] * 2), hetero,
                               X[::2].copy(), num_latent_gps=2)  # fmt: skip
    with pytest.raises(ShapeMismatchError, match="HeteroskedasticTFPConditional takes 1"):
        check_natgrad(model, (X, np.hstack([X, X])), progress=False)


def test_check_natgrad__linear_coregionalization_reads_one_y_column_per_output_not_per_latent_gp():
    """f [N, P] = g [N, L]·Wᵀ: with L = 2 latent GPs and P = 3 outputs Y has 3 columns, and was refused for not having
    L. Oracle: GPflow's own training loss on the same data."""
    import gpflow

    from natgrad_diag import check_natgrad

    rng = np.random.default_rng(1)
    X = rng.uniform(-3, 3, (20, 1))
    Y = np.hstack([np.sin(2 * X), np.cos(X), X])
    kernel = gpflow.kernels.LinearCoregionalization([gpflow.kernels.SquaredExponential() for _ in range(2)], W=rng.normal(size=(3, 2)))
    Z = gpflow.inducing_variables.SharedIndependentInducingVariables(gpflow.inducing_variables.InducingPoints(X[:4].copy()))
    model = gpflow.models.SVGP(kernel, gpflow.likelihoods.Gaussian(0.1), Z, num_latent_gps=2)
    report = check_natgrad(model, (X, Y), gamma=0.1, progress=False, mode="fast")
    assert report.loss_before == pytest.approx(float(model.training_loss((X, Y)).numpy()), rel=1e-12)
    assert report.check("reproduction").passed
    with pytest.raises(ShapeMismatchError, match=r"the model has 3 output\(s\)") as info:
        check_natgrad(model, (X, Y[:, :2]), progress=False)
    assert _argument(info.value) == "data[1] (Y)"


# ---- 7. explain_output_gradients --------------------------------------------------------------------------


def test_explain_output_gradients__source_is_a_number():
    from natgrad_diag.lessons.explain import explain_output_gradients

    with pytest.raises(InputError) as info:
        explain_output_gradients(5)
    assert _argument(info.value) == "source"


# --------------------------------------------------------------------------------------------------
# check_natgrad with the noise variance at GPflow's lower bound; the monitor's gamma


@pytest.mark.parametrize("kind", [pytest.param("svgp", marks=pytest.mark.slow), "vgp"])
def test_check_natgrad__noise_variance_at_gpflows_lower_bound_does_not_raise(kind):
    """softplus saturates: the likelihood's variance is exactly 1e-6, the bound; the SGPR/GPR oracles must still build."""
    import gpflow

    import natgrad_diag as nd

    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (20, 1))
    Y = np.sin(X)
    lik = gpflow.likelihoods.Gaussian()
    if kind == "svgp":
        model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), lik, X[:5].copy(), num_data=20)
    else:
        model = gpflow.models.VGP((X, Y), gpflow.kernels.SquaredExponential(), lik)
    model.likelihood.variance.unconstrained_variable.assign(-60.0)
    assert model.likelihood.variance.numpy() == 1e-6
    report = nd.check_natgrad(model, (X, Y)) if kind == "svgp" else nd.check_natgrad(model)
    assert report.check("conjugate_optimality").passed  # the oracle was built and compared
    numbers = dict(report.numbers)
    # the closed forms by GPflow itself, with the noise variance put at the bound the same way (GPflow's Gaussian(variance=1e-6)
    # refuses a variance at its lower bound)
    if kind == "svgp":
        sgpr = gpflow.models.SGPR((X, Y), model.kernel, X[:5].copy())
        sgpr.likelihood.variance.unconstrained_variable.assign(-60.0)
        assert numbers["SGPR bound"] == pytest.approx(float(sgpr.elbo().numpy()), rel=1e-10)
    else:
        gpr = gpflow.models.GPR((X, Y), model.kernel)
        gpr.likelihood.variance.unconstrained_variable.assign(-60.0)
        assert numbers["GPR log marginal likelihood (noise σ²)"] == pytest.approx(float(gpr.log_marginal_likelihood().numpy()), rel=1e-10)


@pytest.mark.parametrize("gamma", ["abc", "1", True, -1.0, 0.0, float("nan"), None])
def test_monitor__bad_gamma_fails_at_construction(gamma):
    import gpflow

    import natgrad_diag as nd

    X = np.linspace(0, 1, 6)[:, None]
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(), X[:3].copy(), num_data=6)
    with pytest.raises(nd.InputError) as info:
        nd.NatGradMonitor(model, gamma=gamma)
    assert "Argument: gamma" in str(info.value)


def test_check_gradients__check_table_says_why_its_error_differs_from_the_blocks_table():
    """y = x²/2 at x = [100, 0] (∂y_i/∂x_i = x_i) with a custom gradient off by 1e-4 on entry 0 (tolerance
    1e-7 + 1e-5·100 ≈ 1e-3, ratio 0.1) and by 5e-8 on entry 1 (tolerance 1e-7, ratio 0.5): the entry closest
    to failing is not the one with the largest absolute error, so the two tables show different numbers."""
    import tensorflow as tf

    import natgrad_diag as nd

    off = tf.constant([1e-4, 5e-8], tf.float64)

    @tf.custom_gradient
    def f(x):
        def grad(dy):
            return dy * (x + off)

        return 0.5 * x * x, grad

    report = nd.check_gradients(f, [np.array([100.0, 0.0])])
    (row,) = report.rows
    assert row.passed
    np.testing.assert_allclose(row.max_abs_error, 1e-4, rtol=0.05)  # entry 0 (FD rounding ≈ ε·5e3/1e-6 ≈ 1e-6)
    np.testing.assert_allclose(row.worst_abs_error, 5e-8, rtol=0.05)  # entry 1
    (check,) = report.checks
    assert check.max_abs_error == row.worst_abs_error
    assert "the block's largest absolute error" in check.detail  # the check says why the numbers differ


@pytest.mark.parametrize("mode", [pytest.param("full", marks=pytest.mark.slow), "fast"])
def test_check_natgrad__gaussian_built_with_scale_skips_the_conjugate_checks_with_a_reason(mode):
    # GPflow's Gaussian(scale=...) has variance None (its noise may be a function of X): the conjugate checks
    # are skipped with the reason (not a raw AttributeError); the rest run.
    import gpflow

    from natgrad_diag import check_natgrad

    rng = np.random.RandomState(0)
    X = rng.rand(20, 1)
    Y = np.sin(6 * X)
    m = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(scale=0.3), X[::4].copy(), num_data=20)
    assert m.likelihood.variance is None
    before = [v.numpy().copy() for v in m.variables]
    r = check_natgrad(m, (X, Y), mode=mode, progress=False)
    reasons = dict(r.skipped)
    assert "scale=" in reasons["conjugate_optimality"] and "closed form" in reasons["conjugate_optimality"]
    assert r.check("reproduction").status == "pass" and r.check("loss_gradient").status == "pass", str(r)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, m.variables))


# ---- 6. the training monitor's step and log_dir, the Keras callback ------------------------------------------


def _monitor(**kwargs):
    import gpflow

    import natgrad_diag as nd

    model = _svgp()
    gpflow.set_trainable(model.q_mu, False)
    gpflow.set_trainable(model.q_sqrt, False)
    X = np.linspace(0, 1, 6)[:, None]
    return nd.NatGradMonitor(model, (X, np.sin(X)), every=10, **kwargs)


_BAD_STEPS = [1.5, "a", None, 2**70, -1, True]


@pytest.mark.parametrize("step", _BAD_STEPS, ids=[repr(s) for s in _BAD_STEPS])
def test_monitor__step_must_be_an_int64(step):
    import gpflow

    monitor = _monitor()
    for call in (lambda: monitor(step), lambda: monitor.guard(step, gpflow.optimizers.NaturalGradient(0.1))):
        with pytest.raises(InputError) as info:
            call()
        assert _argument(info.value) == "step"
    assert monitor.records == [] and monitor.guard_records == []


def test_monitor__integer_steps_of_numpy_and_tensorflow_are_taken():
    monitor = _monitor()
    for step in (np.int64(3), tf.constant(7), tf.Variable(9, dtype=tf.int64)):
        monitor(step)  # not a multiple of every=10: no check runs
        assert int(monitor.current_step) == int(step)


@pytest.mark.parametrize("kind", ["file", "inside_a_file", "number"])
def test_monitor__log_dir_that_is_not_a_directory_fails_at_construction(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("x")
    log_dir = {"file": tmp_path / "f", "inside_a_file": str(tmp_path / "f" / "logs"), "number": 123}[kind]
    with pytest.raises(InputError) as info:
        _monitor(log_dir=log_dir)
    assert _argument(info.value) == "log_dir"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"] and (tmp_path / "f").read_text() == "x"  # ./123 not made


def test_monitor__missing_log_dir_is_created_at_construction(tmp_path):
    _monitor(log_dir=tmp_path / "runs" / "a")
    assert (tmp_path / "runs" / "a").is_dir()


def test_natgrad_callback__monitor_none_is_refused():
    from natgrad_diag.keras import NatGradCallback

    with pytest.raises(InputError) as info:
        NatGradCallback(None)
    assert _argument(info.value) == "monitor"


# ---- 7. gradient checks: cotangents, directions, sources ---------------------------------------------------


def test_assert_vjp_matches_jacobian__nan_cotangent_is_refused_not_a_mismatch():
    from natgrad_diag.exceptions import NonFiniteError

    with pytest.raises(NonFiniteError) as info:
        assert_vjp_matches_jacobian(tf.sin, [np.array([0.1, 0.2])], [np.array([np.nan, 1.0])])
    assert _argument(info.value) == "cotangents[0]"


def test_check_gradients__num_directions_is_bounded():
    from natgrad_diag.gradcheck.api import MAX_DIRECTIONS

    with pytest.raises(InputError) as info:
        check_gradients(tf.sin, [np.array([0.1])], mode="fast", num_directions=10**9)
    assert _argument(info.value) == "num_directions" and f"at most {MAX_DIRECTIONS}" in str(info.value)


def test_check_gradients__fast_directions_over_the_memory_limit_are_refused_before_allocation():
    from natgrad_diag.autodiff.memory import memory_limit
    from natgrad_diag.exceptions import MemoryLimitError

    n = memory_limit() // (8 * 1000) + 1  # 1000 directions of n float64 entries exceed the limit
    with pytest.raises(MemoryLimitError) as info:
        check_gradients(lambda x: x[:1], [np.zeros(n)], mode="fast", num_directions=1000)
    need = 1000 * n * 8 + 1000 * 1 * 8  # the input directions u and the output cotangents v, float64
    assert f"Estimated size: {need} bytes" in str(info.value) and _argument(info.value) == "num_directions"


@pytest.mark.parametrize("sources, argument", [(None, "sources"), ("x", "sources"), (np.ones(2), "sources"), ("list_with_none", "sources[1]")])
def test_checked_gradient__sources_that_are_not_tensors(sources, argument):
    x = tf.constant([1.0, 2.0], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(x**2)
    with pytest.raises(InputError) as info:
        checked_gradient(tape, y, [x, None] if isinstance(sources, str) and sources == "list_with_none" else sources)
    assert _argument(info.value) == argument


# ---- 8. the var_list form: the loss and the pairs ----------------------------------------------------------


@pytest.mark.parametrize("value", [None, "x", tf.ones(3, tf.float64), tf.constant(3), tf.constant(np.nan, tf.float64)],
                         ids=["None", "string", "vector", "int", "nan"])  # fmt: skip
def test_check_natgrad_var_list__loss_that_is_not_a_finite_scalar(value):
    from natgrad_diag import check_natgrad

    model = _svgp()
    before = [v.numpy().copy() for v in model.variables]
    with pytest.raises(InputError) as info:
        check_natgrad(lambda: value, var_list=[(model.q_mu, model.q_sqrt)], progress=False)
    assert _argument(info.value) == "loss_fn"
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, model.variables))


def test_check_natgrad_var_list__swapped_pair():
    from natgrad_diag import check_natgrad
    from natgrad_diag.exceptions import ShapeMismatchError

    model = _svgp()
    with pytest.raises(ShapeMismatchError) as info:
        check_natgrad(lambda: model.prior_kl(), var_list=[(model.q_sqrt, model.q_mu)], progress=False)
    assert _argument(info.value) == "var_list[0]" and "swapped" in str(info.value) and "[1, 4, 4] then [4, 1]" in str(info.value)


# ---- 9. threads ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "fast"])
def test_check_natgrad__four_threads_on_one_model_agree_with_one_call(mode):
    import threading

    from natgrad_diag import check_natgrad

    # each full-mode call deep-copies the model, which clears TFP's bijector caches that threads share (evaluator.scratch_copy)
    import gpflow

    X = np.linspace(0, 1, 5)[:, None]
    data = (X, np.sin(6 * X))
    model = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(), X[:2].copy())
    alone = check_natgrad(model, data, mode=mode, progress=False)
    results, errors = [], []

    def work():
        try:
            results.append(check_natgrad(model, data, mode=mode, progress=False))
        except Exception as e:  # noqa: BLE001 - any error of a thread fails the test below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 4
    for r in results:
        assert [(c.name, c.status, c.max_abs_error) for c in r.checks] == [(c.name, c.status, c.max_abs_error) for c in alone.checks]
        assert r.gamma_trials == alone.gamma_trials and r.suggested_gamma == alone.suggested_gamma


def _bad_natgrad_inputs():
    """(call, argument, got) for the natural-gradient entry points' own refusals, each on a fresh SVGP."""
    import gpflow

    import natgrad_diag as nd
    from natgrad_diag.demo import make_model

    model, data = make_model("svgp", "gaussian", num_inducing=4, num_data=6)
    loss = model.training_loss_closure(data)
    grads = (np.ones((4, 1)), np.ones((1, 4, 4)))
    return {
        "trace_xi_a_string": (lambda: nd.natgrad_trace(model.q_mu, model.q_sqrt, *grads, xi_transform="nat"), "xi_transform", "str"),
        "empty_var_list": (lambda: nd.check_natgrad(loss, var_list=[]), "var_list", "[]"),
        "empty_generator": (lambda: nd.check_natgrad(loss, var_list=iter([])), "var_list", "[]"),
        "guard_given_adam": (lambda: nd.NatGradMonitor(model, data, gamma=0.5).guard(0, gpflow.keras.tf_keras.optimizers.Adam()),
                             "optimizer", "Adam"),
    }


@pytest.mark.filterwarnings("ignore:model.q_mu, model.q_sqrt are trainable")
@pytest.mark.parametrize("case", ["trace_xi_a_string", "empty_var_list", "empty_generator", "guard_given_adam"])
def test_natgrad_entry_points__bad_input_names_the_argument_and_what_was_got(case):
    call, argument, got = _bad_natgrad_inputs()[case]
    with pytest.raises(InputError) as info:
        call()
    assert _argument(info.value) == argument and re.search(rf"Got:\s+{re.escape(got)}$", str(info.value), re.M), str(info.value)


def test_block_jacobian__row_by_an_unknown_label_and_its_text():
    x = tf.constant([1.0, 2.0], tf.float64)
    J = jacobian(lambda a: {"y": tf.tensordot(a, a, 0)}, [x])  # y = x xᵀ: ∂y_ij/∂x_k = δ_ik x_j + x_i δ_jk
    with pytest.raises(InputError) as info:
        J.row("y[2,0]")
    assert _argument(info.value) == "label" and "'y[0,0]' ... 'y[1,1]'" in str(info.value)
    np.testing.assert_array_equal(J.row("y[1,1]"), [0.0, 4.0])  # ∂(x₁²)/∂x = (0, 2·x₁)
    assert str(J).splitlines() == ["BlockJacobian 4 × 2 (float64)", "  ∂y[2, 2]/∂x0[2]: max |entry| 4"]  # max is 2·x₁
