"""Automatic differentiation with checked seeds: checked_gradient, vjp and the explicit block Jacobian.

Internal: the public names are re-exported by :mod:`natgrad_diag`.
"""
