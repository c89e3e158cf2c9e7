"""Checkpoints and the run directory: its files, atomic writes, orbax checkpoints, the reader, the
notebook API and export."""
