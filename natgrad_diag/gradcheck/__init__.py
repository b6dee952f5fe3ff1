"""Structure-aware gradient checks: full mode (explicit Jacobian) and fast mode (random directions) behind one dispatcher."""
