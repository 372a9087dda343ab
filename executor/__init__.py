"""rackplan: executor."""
