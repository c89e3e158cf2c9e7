"""Workers: processes that take groups from the run directory (``sweep``), the sweep's progress and
status, and the compilation cache."""
