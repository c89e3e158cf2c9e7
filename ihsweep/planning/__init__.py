"""Sweep planning and placement: budgets, costs, where groups run and how long they take, target
devices (no training). The grid → cells → groups expansion is the configuration's
(``ihsweep.configuration.grid``)."""
