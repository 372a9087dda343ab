"""rackplan: kernels."""
