"""Planning: sizing groups against latency budgets, and what the planner learns."""
