"""Offline analysis of ihsweep run directories (curves, emergence points, scaling-law fits).

Importable without training anything; it may import ``ihsweep``'s model and metrics, never the
other way round.
"""
