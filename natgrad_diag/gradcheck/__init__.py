"""Structure-aware gradient checks: full mode (explicit Jacobian) and fast mode (random directions) behind one dispatcher.

Internal: the public names are re-exported by :mod:`natgrad_diag` and :mod:`natgrad_diag.testing`.
"""
