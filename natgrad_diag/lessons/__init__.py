"""The lesson: what output_gradients computes, the torch.outer example, the seed scenario and the PyTorch bridge."""
