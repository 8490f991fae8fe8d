"""The engines benchbot drives: what every engine shares here, all one engine knows in ``<kind>/``.

Start at :mod:`workers.engines.interface` (the driver interface and what an engine folder exposes) and
:mod:`workers.engines.registry` (which folders there are); ``docs/architecture.md`` says how to add one.
"""
