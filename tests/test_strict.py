"""strict_gradients(): PyTorch's seed rules on tf.GradientTape.gradient, checked against TensorFlow itself.

Every "same result" below is compared with TensorFlow's own method called outside the context
(assert_array_equal: the wrapper must not change a bit), every refusal with the whole message.
"""

from __future__ import annotations

import doctest
import io
import re
import pathlib
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import natgrad_diag as nd
from natgrad_diag.autodiff.seeded import checked_gradient
from natgrad_diag.exceptions import InputError, OutputGradientsError
from natgrad_diag.strict import context as strict_context
from natgrad_diag.strict.rules import IMPLICIT_SUM, SEED_MISMATCH, TORCH_IMPLICIT_MESSAGE, StrictGradientsWarning
from natgrad_diag.strict.runner import run_command

HERE = Path(__file__).resolve()
X = (1.0, 2.0, 3.0, 4.0)
IMPLICIT_SUM_REMEDY = (
    "  To fix: pass output_gradients with one seed of each target's shape (dL/dtarget: the result is then Jᵀ·v, "
    "the chain rule), or differentiate tf.reduce_sum(target) if the gradient of the sum is what you mean."
)


def line_of(tag: str) -> int:
    """The line of this file that carries the comment ``# <tag>`` (one per tag)."""
    lines = [n for n, text in enumerate(HERE.read_text().splitlines(), start=1) if text.endswith(f"# <{tag}>")]
    assert len(lines) == 1, tag
    return lines[0]


def outer_tape(persistent: bool = False) -> tuple[tf.GradientTape, tf.Tensor, tf.Tensor]:
    """torch.outer's example: x [4], y = x xᵀ [4, 4]."""
    x = tf.constant(X, tf.float64)
    with tf.GradientTape(persistent=persistent) as tape:
        tape.watch(x)
        y = x[:, None] * x[None, :]
    return tape, x, y


def original_gradient():
    return tf.GradientTape.__dict__["gradient"]


@pytest.fixture(autouse=True)
def _tensorflows_method_is_back_after_each_test():
    before = original_gradient()
    yield
    assert original_gradient() is before, "a test left tf.GradientTape.gradient patched"
    assert strict_context._Patch.count == 0


# ---------------------------------------------------------------------------------------------------
# The seed-000 line: GPflow's map, tape.gradient(meanvarsqrt, [eta1, eta2]) without a seed


@pytest.fixture(scope="module")
def seed_000():
    """The user's tape (README, "The answer"): eta from q, meanvarsqrt from eta, and GPflow's seeds."""
    from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, meanvarsqrt_to_expectation

    q_mu, q_sqrt, q_mu_grad, q_sqrt_grad = nd.seed_scenario()
    dL_dmean = q_mu_grad  # identity transform
    dL_dvarsqrt = q_sqrt.transform.forward(q_sqrt_grad)  # [L, M, M]
    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        tape.watch([q_mu.unconstrained_variable, q_sqrt.unconstrained_variable])
        eta1, eta2 = meanvarsqrt_to_expectation(q_mu, q_sqrt)
        meanvarsqrt = expectation_to_meanvarsqrt(eta1, eta2)
    return tape, meanvarsqrt, eta1, eta2, dL_dmean, dL_dvarsqrt


def test_strict__seed_000_dtheta_deta_line__raises_naming_meanvarsqrts_targets(seed_000):
    tape, meanvarsqrt, eta1, eta2, _, _ = seed_000
    with nd.strict_gradients(), pytest.raises(OutputGradientsError) as info:
        _ = tape.gradient(meanvarsqrt, [eta1, eta2])  # <seed-000>
    assert str(info.value) == "\n".join([
        (
            "Mismatch in output_gradients. grad can be implicitly created only for scalar outputs: target[0] "
            "([5, 1]) and target[1] ([1, 5, 5]) have more than one element and no seed, so TensorFlow would seed "
            "every element with 1 and return the gradient of the sum of all their elements."
        ),
        "  Call:     tape.gradient(meanvarsqrt, [eta1, eta2])",
        f"  At:       {HERE}:{line_of('seed-000')}",
        "  Argument: output_gradients",
        "    Expected: one seed per target, of its shape: target[0] [5, 1], target[1] [1, 5, 5]",
        "    Actual:   None (a seed of ones for every target)",
        IMPLICIT_SUM_REMEDY,
    ])  # fmt: skip
    assert isinstance(info.value, ValueError)


def test_strict__seed_000_with_output_gradients__returns_exactly_what_tensorflow_returns(seed_000):
    tape, meanvarsqrt, eta1, eta2, dL_dmean, dL_dvarsqrt = seed_000
    want = tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=[dL_dmean, dL_dvarsqrt])
    with nd.strict_gradients() as strict:
        got = tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=[dL_dmean, dL_dvarsqrt])
    assert strict.checked_calls == 1 and strict.violations == []
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    # and it is the chain rule: dL/deta1 = (0.33 - 1)·q_mu in this scenario (README, "The answer")
    np.testing.assert_allclose(got[0].numpy(), (0.33 - 1.0) * eta1.numpy(), rtol=0, atol=1e-12)


def test_strict__a_none_entry_for_a_target_of_many_elements__names_that_entry(seed_000):
    tape, meanvarsqrt, eta1, eta2, dL_dmean, _ = seed_000
    with nd.strict_gradients(), pytest.raises(OutputGradientsError) as info:
        tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=[dL_dmean, None])
    lines = str(info.value).splitlines()
    assert lines[0] == (
        f"Mismatch in output_gradients. {TORCH_IMPLICIT_MESSAGE}: target[1] has 25 elements (shape [1, 5, 5]) and no "
        "seed, so TensorFlow would seed every element with 1 and return the gradient of its sum."
    )
    assert lines[3:6] == [
        "  Argument: output_gradients[1]",
        "    Expected: a seed of shape [1, 5, 5] (target[1]'s shape)",
        "    Actual:   None",
    ]


# ---------------------------------------------------------------------------------------------------
# Wrong seeds: the message of checked_gradient, torch's shape rule


def checked_message(tape, y, x, seed) -> list[str]:
    with pytest.raises(OutputGradientsError) as info:
        checked_gradient(tape, y, x, seed)
    return str(info.value).splitlines()


def test_strict__torch_outer_with_a_seed_of_shape_4__raises_checked_gradients_message():
    tape, x, y = outer_tape(persistent=True)
    seed = tf.ones([4], tf.float64)
    with nd.strict_gradients() as strict, pytest.raises(OutputGradientsError) as info:
        tape.gradient(y, x, output_gradients=seed)  # <outer-seed-4>
    want = checked_message(tape, y, x, seed)
    assert want[0] == "Mismatch in output_gradients. output_gradients[0] has a shape of [4] and target[0] has a shape of [4, 4]."
    assert str(info.value).splitlines() == [
        want[0],
        "  Call:     tape.gradient(y, x, output_gradients=seed)",
        f"  At:       {HERE}:{line_of('outer-seed-4')}",
        *want[1:],
    ]
    assert [v.rule for v in strict.violations] == [SEED_MISMATCH]
    # the tape was not used by the refused call: TensorFlow's own error for that seed, as without the context
    with pytest.raises(tf.errors.InvalidArgumentError, match="Input to reshape is a tensor with 1 values, but the requested shape has 4"):
        tape.gradient(y, x, output_gradients=seed)


@pytest.mark.torch
def test_strict__torch_outer__refuses_what_torch_refuses_with_the_same_shapes():
    torch = pytest.importorskip("torch")
    xt = torch.tensor(X, dtype=torch.float64, requires_grad=True)
    yt = torch.outer(xt, xt)
    with pytest.raises(RuntimeError) as torch_no_seed:
        torch.autograd.grad(yt, xt, retain_graph=True)
    with pytest.raises(RuntimeError) as torch_seed_4:
        torch.autograd.grad(yt, xt, grad_outputs=torch.ones(4, dtype=torch.float64))
    tape, x, y = outer_tape(persistent=True)
    with nd.strict_gradients():
        with pytest.raises(OutputGradientsError) as ours_no_seed:
            tape.gradient(y, x)
        with pytest.raises(OutputGradientsError) as ours_seed_4:
            tape.gradient(y, x, output_gradients=tf.ones([4], tf.float64))
    assert str(torch_no_seed.value) == TORCH_IMPLICIT_MESSAGE
    assert TORCH_IMPLICIT_MESSAGE in str(ours_no_seed.value)
    torch_shapes = re.fullmatch(
        r"Mismatch in shape: grad_output\[(\d+)\] has a shape of torch\.Size\(\[([\d, ]*)\]\) and "
        r"output\[(\d+)\] has a shape of torch\.Size\(\[([\d, ]*)\]\)\.",
        str(torch_seed_4.value),
    )
    our_shapes = re.match(
        r"Mismatch in output_gradients\. output_gradients\[(\d+)\] has a shape of \[([\d, ]*)\] and "
        r"target\[(\d+)\] has a shape of \[([\d, ]*)\]\.",
        str(ours_seed_4.value),
    )
    assert torch_shapes is not None and our_shapes is not None
    assert our_shapes.groups() == torch_shapes.groups() == ("0", "4", "0", "4, 4")


def test_strict__a_seed_tensorflow_would_broadcast__raises():
    x = tf.constant(X, tf.float64)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = tf.sin(x)
    seed = tf.ones([4, 1], tf.float64)
    assert tape.gradient(y, x, output_gradients=seed).shape == (4, 4)  # TensorFlow: a silent [4, 4] "gradient"
    with nd.strict_gradients(), pytest.raises(OutputGradientsError) as info:
        tape.gradient(y, x, output_gradients=seed)
    want = checked_message(tape, y, x, seed)
    assert str(info.value).splitlines()[0] == want[0] == (
        "Mismatch in output_gradients. output_gradients[0] has a shape of [4, 1] and target[0] has a shape of [4]."
    )
    assert str(info.value).splitlines()[3:] == want[1:]


def test_strict__a_seed_of_another_dtype_or_count__raises_checked_gradients_message():
    tape, x, y = outer_tape(persistent=True)
    for seed in (tf.ones([4, 4], tf.float32), [tf.ones_like(y), tf.ones_like(y)]):
        with nd.strict_gradients(), pytest.raises(OutputGradientsError) as info:
            tape.gradient(y, x, output_gradients=seed)
        assert str(info.value).splitlines()[3:] == checked_message(tape, y, x, seed)[1:]


def test_strict__allow_implicit_sum__allows_no_seed_but_still_checks_the_seeds_given():
    tape, x, y = outer_tape(persistent=True)
    want = tape.gradient(y, x)
    with nd.strict_gradients(allow_implicit_sum=True) as strict:
        np.testing.assert_array_equal(tape.gradient(y, x).numpy(), want.numpy())
        with pytest.raises(OutputGradientsError, match=r"output_gradients\[0\] has a shape of \[4\]"):
            tape.gradient(y, x, output_gradients=tf.ones([4], tf.float64))
    assert [v.rule for v in strict.violations] == [SEED_MISMATCH]


# ---------------------------------------------------------------------------------------------------
# What must work unchanged


def test_strict__scalar_losses_and_one_element_targets__return_tensorflows_results():
    x = tf.constant(X, tf.float64)
    v = tf.Variable([[0.5]], dtype=tf.float64)

    def compute():
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            loss = tf.reduce_sum(x**2) * v[0, 0]  # []
            one = tf.reshape(loss, [1])  # [1]
            one_one = tf.reshape(loss, [1, 1])  # [1, 1]
            summed = tf.reduce_sum(x[:, None] * x[None, :])  # the sum, said explicitly
        out = [tape.gradient(t, [x, v]) for t in (loss, one, one_one)]
        out.append(tape.gradient([loss, one], x))
        out.append(tape.gradient(summed, x))
        return [g.numpy() for gs in out for g in tf.nest.flatten(gs)]

    want = compute()
    with nd.strict_gradients() as strict:
        got = compute()
    assert strict.checked_calls == 5 and strict.violations == []
    assert len(got) == len(want) == 8
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_strict__nests_of_targets_and_seeds__flattened_as_tensorflow_does():
    x = tf.constant(X, tf.float64)

    def compute():
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            ys = {"outer": x[:, None] * x[None, :], "sin": tf.sin(x), "loss": tf.reduce_sum(x**3)}
        seeds = {"outer": tf.ones([4, 4], tf.float64), "sin": tf.constant(X, tf.float64), "loss": tf.constant(2.0, tf.float64)}
        return tape, ys, tape.gradient(ys, {"x": x}, output_gradients=seeds)["x"].numpy()

    want = compute()[2]
    with nd.strict_gradients() as strict:
        tape, ys, got = compute()
        with pytest.raises(OutputGradientsError) as info:  # flattened by sorted keys: loss, outer, sin
            tape.gradient(ys, x, output_gradients={"outer": tf.ones([4, 4], tf.float64), "sin": None, "loss": 1.0})
    np.testing.assert_array_equal(got, want)
    assert str(info.value).splitlines()[0].endswith(
        "target[2] has 4 elements (shape [4]) and no seed, so TensorFlow would seed every element with 1 and return "
        "the gradient of its sum."
    )
    assert [v.rule for v in strict.violations] == [IMPLICIT_SUM]


def test_strict__tf_function_bodies__are_judged_when_traced():
    x = tf.constant(X, tf.float64)

    @tf.function
    def seeded(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = x[:, None] * x[None, :]
        return tape.gradient(y, x, output_gradients=tf.ones_like(y))

    @tf.function
    def unseeded(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = x[:, None] * x[None, :]
        return tape.gradient(y, x)  # <tf-function>

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float64)])
    def unknown_length(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.sin(x)  # [None]: one element or many is known only when the graph runs
        return tape.gradient(y, x)

    with nd.strict_gradients() as strict:
        np.testing.assert_array_equal(seeded(x).numpy(), [20.0, 20.0, 20.0, 20.0])
        np.testing.assert_array_equal(unknown_length(x[:1]).numpy(), np.cos(X[:1]))
        with pytest.raises(OutputGradientsError) as info:
            unseeded(x)
    assert strict.checked_calls == 3
    lines = str(info.value).splitlines()
    assert lines[1:3] == ["  Call:     return tape.gradient(y, x)", f"  At:       {HERE}:{line_of('tf-function')}"]
    assert unseeded(x).numpy().tolist() == [20.0] * 4  # outside the context: traced again, TensorFlow's sum


def test_strict__unseeded_target_of_unknown_size__refused_when_the_graph_runs_on_more_than_one_element():
    x = tf.constant(X, tf.float64)

    def body(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = x * x
        return tape.gradient(y, x)  # <run-time>

    unknown_length = tf.function(body, input_signature=[tf.TensorSpec([None], tf.float64)])
    unknown_rank = tf.function(body, input_signature=[tf.TensorSpec(None, tf.float64)])
    with nd.strict_gradients() as strict:
        np.testing.assert_array_equal(unknown_length(x[:1]).numpy(), [2.0])  # d(x²)/dx = 2x: one element passes
        np.testing.assert_array_equal(unknown_rank(tf.constant(3.0, tf.float64)).numpy(), 6.0)
        with pytest.raises(tf.errors.InvalidArgumentError) as length_info:
            unknown_length(x)
        with pytest.raises(tf.errors.InvalidArgumentError) as rank_info:
            unknown_rank(tf.reshape(x, [2, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError):  # the check stays in the graph traced inside the context
        unknown_length(x)
    assert strict.checked_calls == 2 and strict.violations == []  # traced once each; refused only when run
    for info, shape, run_shape in ((length_info, "[None]", "4"), (rank_info, "<unknown rank>", "2 2")):
        message = info.value.message.replace("\\n", "\n").replace("\\'", "'")
        assert (f"assertion failed: [Mismatch in output_gradients. {TORCH_IMPLICIT_MESSAGE}: target[0] has more than "
                f"one element (shape {shape}) and no seed, so TensorFlow would seed every element with 1 and return "
                "the gradient of its sum.\n  Call:     return tape.gradient(y, x)\n") in message
        assert f"  At:       {HERE}:{line_of('run-time')}\n" in message and IMPLICIT_SUM_REMEDY in message
        assert f"[Shape of target[0] at run time:] [{run_shape}]" in message
    with nd.strict_gradients(allow_implicit_sum=True):  # traced inside: allowed, TensorFlow's sum, 2x
        allowed = tf.function(body, input_signature=[tf.TensorSpec([None], tf.float64)])
        np.testing.assert_array_equal(allowed(x).numpy(), [2.0, 4.0, 6.0, 8.0])


def test_strict__persistent_nested_tapes_and_unconnected_gradients__unchanged():
    def compute():
        x = tf.constant(X, tf.float64)
        z = tf.constant(1.0, tf.float64)
        with tf.GradientTape(persistent=True) as outer:
            outer.watch(x)
            with tf.GradientTape(persistent=True) as inner:
                inner.watch([x, z])
                loss = tf.reduce_sum(tf.sin(x) * x)
            g = inner.gradient(loss, x)  # [4], recorded on the outer tape
            gz_none = inner.gradient(loss, z)
            gz_zero = inner.gradient(loss, z, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        hvp = outer.gradient(g, x, output_gradients=tf.constant([1.0, 0.0, -1.0, 2.0], tf.float64))
        again = inner.gradient(loss, x)  # persistent: usable twice
        return g.numpy(), gz_none, gz_zero.numpy(), hvp.numpy(), again.numpy()

    want = compute()
    with nd.strict_gradients() as strict:
        got = compute()
    assert strict.checked_calls == 5 and strict.violations == []
    assert got[1] is None and want[1] is None
    for k in (0, 2, 3, 4):
        np.testing.assert_array_equal(got[k], want[k])


def test_strict__jacobian_and_batch_jacobian__are_not_judged():
    xb = tf.constant(np.arange(6.0).reshape(3, 2) / 4.0)

    def compute():
        tape, x, y = outer_tape(persistent=True)
        with tf.GradientTape(persistent=True) as bt:
            bt.watch(xb)
            yb = xb[:, :, None] * xb[:, None, :]  # [3, 2, 2]: batch_jacobian's rows are [3] columns
        return (
            tape.jacobian(y, x).numpy(),
            tape.jacobian(y, x, experimental_use_pfor=False).numpy(),
            bt.batch_jacobian(yb, xb).numpy(),
            bt.batch_jacobian(yb, xb, experimental_use_pfor=False).numpy(),
        )

    want = compute()
    with nd.strict_gradients() as strict:
        got = compute()
    assert strict.checked_calls == 0 and strict.violations == []
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # and J contracted with ones is what the default seed returns: Jᵀ·1 = 2·sum(x)
    np.testing.assert_array_equal(got[0].sum(axis=(0, 1)), [20.0] * 4)


def test_strict__natgrad_diags_own_default_seed_lessons__are_not_judged():
    with nd.strict_gradients() as strict:
        trace = nd.natgrad_trace(*nd.seed_scenario(), compiled=False)
    assert strict.violations == []
    np.testing.assert_allclose(trace.dL_deta1, (0.33 - 1.0) * trace.eta1, rtol=0, atol=1e-12)


def test_strict__a_refused_call_leaves_a_non_persistent_tape_usable():
    tape, x, y = outer_tape()
    with nd.strict_gradients(), pytest.raises(OutputGradientsError):
        tape.gradient(y, x)
    np.testing.assert_array_equal(tape.gradient(y, x, output_gradients=tf.ones_like(y)).numpy(), [20.0] * 4)


# ---------------------------------------------------------------------------------------------------
# warn, decorator, bad arguments


def test_strict__warn__warns_at_the_users_line_and_returns_tensorflows_result():
    tape, x, y = outer_tape(persistent=True)
    want = tape.gradient(y, x).numpy()
    with pytest.warns(StrictGradientsWarning) as record, nd.strict_gradients(action="warn") as strict:
        got = tape.gradient(y, x)  # <warn>
    np.testing.assert_array_equal(got.numpy(), want)
    assert len(record) == 1
    assert (record[0].filename, record[0].lineno) == (str(HERE), line_of("warn"))
    assert str(record[0].message) == str(strict.violations[0].error)
    assert [v.rule for v in strict.violations] == [IMPLICIT_SUM]
    assert str(strict.violations[0]).startswith(f"{HERE}:{line_of('warn')}: Mismatch in output_gradients.")


def test_strict__decorator__with_and_without_parentheses():
    before = original_gradient()

    @nd.strict_gradients()
    def with_parentheses():
        tape, x, y = outer_tape()
        return tape.gradient(y, x)

    @nd.strict_gradients
    def bare():
        tape, x, y = outer_tape()
        return tape.gradient(y, x)

    for fn in (with_parentheses, bare):
        with pytest.raises(OutputGradientsError, match=TORCH_IMPLICIT_MESSAGE):
            fn()
        assert original_gradient() is before and strict_context._Patch.count == 0


def test_strict__bad_action__input_error_naming_the_argument():
    with pytest.raises(InputError) as info:
        nd.strict_gradients(action="ignore")
    assert str(info.value) == (
        "Invalid input. action must say what a violation does.\n"
        "  Argument: action\n"
        "    Expected: \"raise\" or \"warn\"\n"
        "    Got:      'ignore'\n"
        "  To fix: pass action=\"raise\" (an OutputGradientsError at the call) or action=\"warn\" (a warning, and "
        "TensorFlow's result)."
    )


def test_strict__docstring_examples_run():
    result = doctest.testmod(strict_context, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 4 and result.failed == 0


# ---------------------------------------------------------------------------------------------------
# Restoring TensorFlow, threads


def test_strict__restores_tensorflows_method_on_exit_on_error_and_when_nested():
    before = original_gradient()
    with nd.strict_gradients():
        patched = original_gradient()
        assert patched is not before
        with nd.strict_gradients(action="warn"):  # innermost wins
            assert original_gradient() is patched
            tape, x, y = outer_tape()
            with pytest.warns(StrictGradientsWarning):
                tape.gradient(y, x)
        assert original_gradient() is patched  # the outer context is still on
        tape, x, y = outer_tape()
        with pytest.raises(OutputGradientsError):
            tape.gradient(y, x)
    assert original_gradient() is before
    with pytest.raises(ZeroDivisionError), nd.strict_gradients():
        _ = 1 / 0
    assert original_gradient() is before
    tape, x, y = outer_tape()
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [20.0] * 4)  # TensorFlow's default seed again


def test_strict__other_threads_keep_tensorflows_behaviour():
    """Thread A is inside the context while thread B, outside it, calls tape.gradient(y, x): B is not judged."""
    a_inside, b_done = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def thread_b():
        a_inside.wait(30)
        try:
            tape, x, y = outer_tape()
            results["b"] = tape.gradient(y, x).numpy()
        except (ValueError, tf.errors.OpError) as e:  # pragma: no cover - reported below
            results["b"] = e
        b_done.set()

    def thread_a():
        with nd.strict_gradients():
            a_inside.set()
            b_done.wait(30)
            tape, x, y = outer_tape()
            try:
                tape.gradient(y, x)
            except OutputGradientsError as e:
                results["a"] = e

    threads = [threading.Thread(target=thread_b), threading.Thread(target=thread_a)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    np.testing.assert_array_equal(results["b"], [20.0] * 4)
    assert isinstance(results["a"], OutputGradientsError)


# ---------------------------------------------------------------------------------------------------
# GPflow and Keras run clean under the rules, with bit-identical results


def test_strict__gpflow_natural_gradient_step__runs_clean_and_unchanged():
    import gpflow

    def step():
        rng = np.random.default_rng(0)
        X_ = rng.uniform(size=(8, 1))
        Y_ = np.sin(6 * X_) + 0.1 * rng.normal(size=(8, 1))
        model = gpflow.models.VGP((X_, Y_), gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian())
        gpflow.set_trainable(model.q_mu, False)
        gpflow.set_trainable(model.q_sqrt, False)
        opt = gpflow.optimizers.NaturalGradient(gamma=0.5)
        opt.minimize(model.training_loss, [(model.q_mu, model.q_sqrt)])
        return model.q_mu.numpy(), model.q_sqrt.numpy()

    want = step()
    with nd.strict_gradients() as strict:
        got = step()
    assert strict.checked_calls >= 2 and strict.violations == []  # the loss gradient and the seeded VJP
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_strict__gpflow_scipy_on_a_tiny_gpr__runs_clean_and_unchanged():
    import gpflow

    def fit():
        rng = np.random.default_rng(1)
        X_ = rng.uniform(size=(6, 1))
        model = gpflow.models.GPR((X_, np.cos(4 * X_)), gpflow.kernels.SquaredExponential())
        result = gpflow.optimizers.Scipy().minimize(model.training_loss, model.trainable_variables, options={"maxiter": 5})
        return result.x

    want = fit()
    with nd.strict_gradients() as strict:
        got = fit()
    assert strict.checked_calls >= 1 and strict.violations == []  # traced under the context (compile=True)
    np.testing.assert_array_equal(got, want)


def test_strict__keras_fit__runs_clean_and_unchanged():
    import tf_keras

    rng = np.random.default_rng(2)
    X_ = rng.normal(size=(16, 3)).astype("float32")
    Y_ = X_ @ np.array([[1.0], [-2.0], [0.5]], dtype="float32")
    tf_keras.utils.set_random_seed(0)
    init = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(4, activation="tanh"), tf_keras.layers.Dense(1)])
    weights = init.get_weights()

    def fit():
        model = tf_keras.models.clone_model(init)
        model.set_weights(weights)
        model.compile(optimizer=tf_keras.optimizers.SGD(0.1), loss="mse")
        model.fit(X_, Y_, batch_size=8, epochs=2, verbose=0, shuffle=False)
        return model.get_weights()

    want = fit()
    with nd.strict_gradients() as strict:
        got = fit()
    assert strict.checked_calls >= 1 and strict.violations == []
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


# ---------------------------------------------------------------------------------------------------
# The script runner: python -m natgrad_diag.strict, natgrad-diag strict --

BAD_SCRIPT = """\
import sys
import tensorflow as tf
x = tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64)
for _ in range(3):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = x[:, None] * x[None, :]
    g = tape.gradient(y, x)
with tf.GradientTape() as tape:
    tape.watch(x)
    y = tf.sin(x)
g = tape.gradient(y, x, output_gradients=tf.ones([4, 1], tf.float64))
print("argv", sys.argv[1:])
"""
GOOD_SCRIPT = """\
import tensorflow as tf
x = tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64)
with tf.GradientTape() as tape:
    tape.watch(x)
    y = x[:, None] * x[None, :]
print(tape.gradient(y, x, output_gradients=tf.ones_like(y)).numpy())
"""


def test_runner__reports_every_violation_with_file_and_line_and_exits_1(tmp_path, capsys):
    script = tmp_path / "bad.py"
    script.write_text(BAD_SCRIPT)
    err = io.StringIO()
    assert run_command(["python", str(script), "a", "b"], stream=err) == 1
    assert capsys.readouterr().out == "argv ['a', 'b']\n"  # the script ran to the end, with its arguments
    report = err.getvalue()
    assert report.startswith(
        "python -m natgrad_diag.strict: 4 tape.gradient call(s) broke PyTorch's seed rules, at 2 place(s) "
        "(4 call(s) checked):\n"
    )
    assert f"\n{script}:8: implicit_sum (3 calls)\nMismatch in output_gradients. {TORCH_IMPLICIT_MESSAGE}" in report
    assert f"\n{script}:12: seed_mismatch\nMismatch in output_gradients. output_gradients[0] has a shape of [4, 1]" in report
    assert original_gradient() is not None and strict_context._Patch.count == 0


def test_runner__a_clean_script_exits_0_and_a_failing_one_keeps_its_code(tmp_path, capsys):
    good = tmp_path / "good.py"
    good.write_text(GOOD_SCRIPT)
    err = io.StringIO()
    assert run_command([str(good)], stream=err) == 0
    assert err.getvalue() == (
        "python -m natgrad_diag.strict: no tape.gradient call broke PyTorch's seed rules (1 call(s) checked).\n"
    )
    failing = tmp_path / "failing.py"
    failing.write_text(BAD_SCRIPT + "raise SystemExit(3)\n")
    assert run_command(["--", sys.executable, str(failing)], stream=io.StringIO()) == 3
    crashing = tmp_path / "crashing.py"
    crashing.write_text(GOOD_SCRIPT + "1 / 0\n")
    err = io.StringIO()
    assert run_command([str(crashing)], stream=err) == 1
    assert "ZeroDivisionError" in err.getvalue() and "no tape.gradient call broke" in err.getvalue()
    err = io.StringIO()
    assert run_command(["python", str(tmp_path / "missing.py")], stream=err) == 2
    assert err.getvalue() == f"python -m natgrad_diag.strict: no such script: {tmp_path / 'missing.py'}\n"
    capsys.readouterr()


def test_runner__dash_m_runs_a_module_from_the_current_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "bad_module.py").write_text(BAD_SCRIPT)
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    assert run_command(["python", "-m", "bad_module", "z"], stream=err) == 1
    assert capsys.readouterr().out == "argv ['z']\n"
    assert f"{tmp_path / 'bad_module.py'}:8: implicit_sum (3 calls)" in err.getvalue()
    sys.modules.pop("bad_module", None)


def test_cli__natgrad_diag_strict_runs_the_script(tmp_path, capsys):
    from natgrad_diag.cli import main

    script = tmp_path / "bad.py"
    script.write_text(BAD_SCRIPT)
    assert main(["strict", "--", "python", str(script), "x"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "argv ['x']\n"
    assert captured.err.startswith("natgrad-diag strict: 4 tape.gradient call(s) broke PyTorch's seed rules")
    assert main(["strict"]) == 2
    assert capsys.readouterr().err.startswith("natgrad-diag strict: no script given.\nusage: natgrad-diag strict")


def test_runner__python_dash_m_natgrad_diag_strict_runs_its_main(tmp_path, monkeypatch, capsys):
    """``python -m natgrad_diag.strict bad.py`` (its __main__, run as Python runs it, in this process)."""
    import runpy

    script = tmp_path / "bad.py"
    script.write_text(BAD_SCRIPT)
    monkeypatch.setattr(sys, "argv", ["natgrad_diag.strict", str(script)])
    import natgrad_diag.strict

    main_file = pathlib.Path(natgrad_diag.strict.__file__).with_name("__main__.py")
    with pytest.raises(SystemExit) as info:  # run_path: as `python -m` runs it, without pytest's import hook (3.10)
        runpy.run_path(str(main_file), run_name="__main__")
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert f"{script}:8: implicit_sum (3 calls)" in err
    assert f"{script}:12: seed_mismatch" in err


def test_strict__an_exit_without_enter_is_refused_and_later_contexts_still_check():
    """One __exit__ too many used to drive the patch count to -1, after which every context silently checked nothing."""
    s = nd.strict_gradients()
    with s:
        pass
    with pytest.raises(InputError, match=r"exited without being entered(.|\n)*Argument:\s+strict_gradients"):
        s.__exit__(None, None, None)
    v = tf.Variable([1.0, 2.0], dtype=tf.float64)
    with tf.GradientTape() as tape:
        y = v * 2.0
    with pytest.raises(OutputGradientsError), nd.strict_gradients():
        tape.gradient(y, v, output_gradients=tf.ones([2, 1], tf.float64))  # a broadcast seed: refused
