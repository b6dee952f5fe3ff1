"""The lesson: what output_gradients computes, the torch.outer example and the seed scenario. Internal: the public
names are re-exported by :mod:`natgrad_diag`; PyTorch's side is :mod:`natgrad_diag.torch_bridge`."""
