"""rackplan: app."""
