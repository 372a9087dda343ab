"""rackplan executor: a plan rendered as vLLM processes (launch backends to come)."""

from executor.render import Process, Rendered, check_rules, render, role_flags

__all__ = ["Process", "Rendered", "check_rules", "render", "role_flags"]
