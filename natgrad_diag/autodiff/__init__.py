"""Automatic differentiation with checked seeds: checked_gradient, vjp and the explicit block Jacobian."""
