"""rackplan: planner."""
