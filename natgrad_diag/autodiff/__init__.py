"""Automatic differentiation with checked seeds (checked_gradient, vjp) and the explicit block Jacobian. Internal:
:mod:`natgrad_diag` re-exports the public names."""
