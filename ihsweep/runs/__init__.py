"""The run directory: its files and cells table (``rundir``), the workers' claims (``claims``),
orbax checkpoints, the reader, the notebook API and export."""
