"""rackplan: simulator."""
