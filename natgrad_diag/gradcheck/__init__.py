"""Structure-aware gradient checks, full mode (explicit Jacobian) and fast mode (random directions), behind one
dispatcher. Internal: :mod:`natgrad_diag` and :mod:`natgrad_diag.testing` re-export the public names."""
