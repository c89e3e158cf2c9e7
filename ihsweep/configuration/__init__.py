"""Configuration: a config checked before anything compiles — one field at a time (``fields``:
``ConfigError``, the sections' defaults, ``check``; the fields themselves are
``ihsweep.base.schema``), the rules between fields (``config.validate``, with ``data_rules`` for
data sources, probes and evaluation) — and the sweep's grid of cells and groups (``grid``)."""
