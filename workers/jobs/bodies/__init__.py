"""The job bodies, one module per kind (``launch``, ``bench``, ``stop``, ``sweep``, ``eval``).

Each is a :class:`~workers.jobs.bodies.base.JobBody` that overrides its one hook, ``run``, as rq's worker
variants each override one method of the worker; ``workers.jobs.runner`` routes a payload to its body.
"""
