"""Natural gradients: the step as GPflow takes it, its closed-form maps, the checks against independent oracles, and the monitor."""
