"""Train an SVGP with natural gradients on (q_mu, q_sqrt) and Adam on the hyperparameters, with NatGradMonitor on.

GPflow's standard recipe (see GPflow's "Natural gradients" notebook): the variational parameters are excluded
from Adam (``gpflow.set_trainable(q_mu / q_sqrt, False)``) and stepped by ``gpflow.optimizers.NaturalGradient``;
the kernel and likelihood hyperparameters are stepped by Adam. Every ``--every`` steps ``NatGradMonitor``
checks, on the current parameters, that the next natural-gradient step is healthy and equals GPflow's.

Data: the diabetes data set shipped inside scikit-learn (``sklearn.datasets.load_diabetes``; 442 patients,
10 standardised baseline variables, target = disease progression after one year), from Efron, Hastie,
Johnstone and Tibshirani, "Least Angle Regression", Annals of Statistics 32(2), 2004. Install it with
``pip install natgrad-diag[data]`` (scikit-learn).

Usage:
    python scripts/train_svgp_natgrad.py                 # 100 steps, M = 20, about 15 s
    python scripts/train_svgp_natgrad.py --steps 500 --every 25 --gamma 0.5

Exit code 0 when every monitored check held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    p.add_argument("--num-inducing", type=int, default=20, metavar="M", help="inducing points (default 20)")
    p.add_argument("--gamma", type=float, default=1.0, help="natural-gradient step length (default 1.0)")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate for the hyperparameters (default 0.01)")
    p.add_argument("--every", type=int, default=10, help="run the monitor every k steps (default 10)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in ("steps", "num_inducing", "every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if not args.gamma > 0 or not args.lr > 0:
        p.error("--gamma and --lr must be positive")
    return args


def load_diabetes_split(seed: int):
    """Standardised diabetes data, 80 % train / 20 % test, as float64 arrays (X [N, 10], y [N, 1])."""
    import numpy as np

    try:
        from sklearn.datasets import load_diabetes
    except ImportError:
        from natgrad_diag.exceptions import MissingExtraError

        raise MissingExtraError(
            "this script reads scikit-learn's diabetes data set.",
            context=[("Needs", "scikit-learn"), ("Install", "pip install natgrad-diag[data]")],
            remedy="install scikit-learn, or adapt load_diabetes_split to your own data.",
        ) from None
    d = load_diabetes()
    X = np.asarray(d.data, dtype=np.float64)
    y = np.asarray(d.target, dtype=np.float64)[:, None]
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(X))
    n_train = int(0.8 * len(X))
    tr, te = idx[:n_train], idx[n_train:]
    x_mu, x_sd = X[tr].mean(0), X[tr].std(0)
    y_mu, y_sd = y[tr].mean(), y[tr].std()
    f = lambda a, m, s: (a - m) / s  # noqa: E731
    return (f(X[tr], x_mu, x_sd), f(y[tr], y_mu, y_sd)), (f(X[te], x_mu, x_sd), f(y[te], y_mu, y_sd))


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from natgrad_diag._tf import import_tensorflow_quietly

    import_tensorflow_quietly()  # TensorFlow's C++ start-up lines are not the script's output
    import gpflow
    import numpy as np
    import tensorflow as tf
    from gpflow.keras import tf_keras

    from natgrad_diag import NatGradMonitor
    from natgrad_diag.progress import progress_bar

    (X, Y), (Xt, Yt) = load_diabetes_split(args.seed)
    N, D = X.shape
    M = min(args.num_inducing, N)
    rng = np.random.default_rng(args.seed)
    Z = X[rng.choice(N, size=M, replace=False)].copy()
    model = gpflow.models.SVGP(
        gpflow.kernels.SquaredExponential(lengthscales=np.full(D, 2.0)),
        gpflow.likelihoods.Gaussian(variance=0.5),
        gpflow.inducing_variables.InducingPoints(Z),
        num_data=N,
    )
    gpflow.set_trainable(model.q_mu, False)  # natural gradients step these; Adam must not
    gpflow.set_trainable(model.q_sqrt, False)
    data = (tf.constant(X), tf.constant(Y))

    natgrad = gpflow.optimizers.NaturalGradient(gamma=args.gamma)
    adam = tf_keras.optimizers.Adam(args.lr)
    loss = model.training_loss_closure(data, compile=False)

    @tf.function
    def train_step() -> tf.Tensor:
        natgrad.minimize(loss, [(model.q_mu, model.q_sqrt)])
        adam.minimize(loss, model.trainable_variables)
        return loss()

    monitor = NatGradMonitor(model, data, gamma=args.gamma, every=args.every)
    start = time.perf_counter()
    with progress_bar(args.steps, "SVGP natgrad + Adam") as advance:
        for step in range(args.steps):
            monitor(step)  # checks the natural-gradient step about to be taken
            value = train_step()
            advance()
    elapsed = time.perf_counter() - start

    mean, var = model.predict_y(tf.constant(Xt))
    rmse = float(np.sqrt(np.mean((mean.numpy() - Yt) ** 2)))
    nlpd = float(-np.mean(model.predict_log_density((tf.constant(Xt), tf.constant(Yt))).numpy()))
    errors = [r.reproduction_error for r in monitor.records if r.reproduction_error is not None]
    print(f"diabetes (scikit-learn; Efron et al. 2004): N = {N} train, {len(Xt)} test, D = {D}, M = {M}")
    print(f"{args.steps} steps of natgrad (gamma = {args.gamma:g}) + Adam (lr = {args.lr:g}) in {elapsed:.1f} s")
    print(f"final training loss {float(value):.4f}; noise variance {float(model.likelihood.variance.numpy()):.4f}")
    print(f"test RMSE {rmse:.4f} (standardised units), test NLPD {nlpd:.4f}")
    print(
        f"monitor: {len(monitor.records)} checks, {len(monitor.failures)} failed, "
        f"max reproduction error {max(errors) if errors else float('nan'):.2e}"
    )
    for r in monitor.failures[:5]:
        print(f"  {r}")
    return 0 if not monitor.failures else 1


if __name__ == "__main__":
    sys.exit(main())
