"""The training loop: one group = one vmapped ensemble, its model, train step, schedule, hooks and
online metrics."""
