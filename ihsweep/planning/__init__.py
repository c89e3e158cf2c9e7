"""Sweep planning and placement: grid → cells → groups, budgets, costs, where groups run and how
long they take (no training)."""
