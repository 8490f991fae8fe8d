"""SGLang engine knowledge, one noun per module; pure or HTTP only (host access lives in ``workers.host``).

- :mod:`workers.engines.sglang.flags`: flag <-> server-arg names via the recorded contracts, requested
  args, argv parsing, requested-vs-observed comparison
- :mod:`workers.engines.sglang.server_info`: parsing ``/server_info``, telling SGLang from other servers
- :mod:`workers.engines.sglang.diagnosis`: the failure RULES, texts SGLang survives, ``diagnose``
- :mod:`workers.engines.sglang.readiness`: waiting for ``/health``, the smoke generation, garbage detection

Facts come from the contracts recorded from the real wheels (``workers/engines/contracts/``) and docs/observe.md.
"""
