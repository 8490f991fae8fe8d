"""Benchmarking: the load generator, its metrics, and what a /bench asks for."""
