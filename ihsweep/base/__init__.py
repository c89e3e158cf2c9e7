"""The foundation every other folder may use, and which uses none of them: errors
(``errors``), small number helpers (``numbers``), the ``IHSWEEP_*`` environment variables
(``environment``), the config schema (``schema``: every field's default, kind and rule), atomic
files and locks (``atomic``), devices and meshes (``sharding``), and the emergence law as
arithmetic (``law``)."""
