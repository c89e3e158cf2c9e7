"""One group's training: a vmapped ensemble run from its config (``runner.fit``), its loop and
hooks, the device-memory choice (``memory``), the data loader, the online evaluation and stop
rule, resume, and the logs."""
