"""The computation of one ensemble, as pure functions: the model (``model``), its losses
(``losses``), the train step and the ensemble's parameters and seeds (``train``), the induction-head
metrics and their registry (``metrics``, ``metric_registry``), and the update schedules
(``schedule``). No files, no devices chosen here."""
