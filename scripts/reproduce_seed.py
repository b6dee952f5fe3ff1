"""The GPflow user's snippet, runnable as written, then natgrad-diag's explanation of the same numbers.

Run:  python scripts/reproduce_seed.py
"""

import natgrad_diag
from natgrad_diag._tf import import_tensorflow_quietly

import_tensorflow_quietly()  # TensorFlow's C++ start-up lines are not part of the lesson

import gpflow  # noqa: E402 (after the quiet TensorFlow import, on purpose)
import tensorflow as tf  # noqa: E402
from gpflow.optimizers.natgrad import expectation_to_meanvarsqrt, meanvarsqrt_to_expectation  # noqa: E402

# ---- the user's code, as written (float64, M = 5, L = 1) ----
q_mu = gpflow.Parameter([[0.93350756], [0.15833747], [0.23830378], [0.28742445], [0.14999759]])  # [M, L]
q_sqrt = gpflow.Parameter(tf.eye(5, batch_shape=[1], dtype=tf.float64), transform=gpflow.utilities.triangular())  # [L, M, M]
q_mu_grad = q_mu.unconstrained_variable * 0.33  # plays dL/dq_mu (unconstrained)
q_sqrt_grad = q_sqrt.unconstrained_variable  # plays dL/dq_sqrt (unconstrained, [L, M(M+1)/2])
dL_dmean = gpflow.base._to_constrained(q_mu_grad, q_mu.transform)
dL_dvarsqrt = gpflow.base._to_constrained(q_sqrt_grad, q_sqrt.transform)
with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
    tape.watch([q_mu.unconstrained_variable, q_sqrt.unconstrained_variable])
    eta1, eta2 = meanvarsqrt_to_expectation(q_mu, q_sqrt)
    meanvarsqrt = expectation_to_meanvarsqrt(eta1, eta2)
dL_deta1, dL_deta2 = tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=[dL_dmean, dL_dvarsqrt])
dtheta_deta1, dtheta_deta2 = tape.gradient(meanvarsqrt, [eta1, eta2], output_gradients=None)

print("The user's numbers")
print("  dL_deta1                  =", dL_deta1.numpy().ravel())
print("  dtheta_deta1 * q_mu_grad  =", (dtheta_deta1 * q_mu_grad).numpy().ravel(), " <- not equal")
print()

# ---- the package's explanation of the same numbers ----
trace = natgrad_diag.natgrad_trace(q_mu, q_sqrt, q_mu_grad, q_sqrt_grad)
assert (trace.dL_deta1 == dL_deta1.numpy()).all() and (trace.dtheta_deta1 == dtheta_deta1.numpy()).all()
explanation = natgrad_diag.explain_output_gradients(trace)
print(explanation)
raise SystemExit(0 if explanation.passed else 1)
