"""TensorRT-LLM's readiness, as data for the shared flow (:class:`workers.engines.interface.EngineDriver`): the
``/health`` wait with its rules and uvicorn's ready line, and its smoke request (``POST /v1/completions``: it
has no SGLang-style ``/generate``).

``launch_server`` binds the port before it builds the LLM and uvicorn listens only once the model is loaded,
so a loading server refuses connections (as vLLM's does); ``/health`` is 200 once it serves.
"""

from __future__ import annotations

from workers.engines import readiness

NAME = "TensorRT-LLM"
#: uvicorn's line once it listens (the recorded ``ready_line`` wins when the contract has one).
READY_LINE = readiness.UVICORN_READY_LINE
#: Greedy 16 tokens of ``POST /v1/completions`` (the served model from ``/v1/models``).
SMOKE = readiness.COMPLETIONS_SMOKE
