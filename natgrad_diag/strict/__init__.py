"""PyTorch's seed rules for every ``tf.GradientTape.gradient`` call: a context, a pytest plugin and a script runner."""
