"""Configuration: the config's fields, defaults and checks (validated before anything compiles)."""
