"""Run history: every benchmark result benchbot measured, one noun per module.

- :mod:`workers.results.record`: :class:`~workers.results.record.RunRecord`, its validation and metric accessors
- :mod:`workers.results.store`: records in Redis (ids, save/get/list, tags and baselines)
- :mod:`workers.results.export`: JSONL and CSV exports
- :mod:`workers.results.tables`: the ``/runs``, ``/compare`` and per-level text tables
"""
