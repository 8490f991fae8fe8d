"""SGLang's bounded profile: ``POST /start_profile`` with ``num_steps``, which stops by itself, and
``POST /stop_profile`` at the level's end to disarm one whose level ended before the steps were reached.

Read from the 0.5.23 wheel (``srt/managers/io_struct.py`` ``ProfileReq``; ``scheduler_components/
profiler_manager.py``): ``output_dir`` (default ``$SGLANG_TORCH_PROFILER_DIR`` or ``/tmp``), ``num_steps``
(profiling stops after that many forward steps; ``/stop_profile`` stops it sooner, and is refused, HTTP 500
"Profiling is not in progress", once it stopped), ``activities`` (``CPU``,
``GPU``), ``profile_id`` (default the time). Each TP rank writes ``<profile_id>-TP-<rank>.trace.json.gz``
into ``output_dir`` when the capture stops. A second start while one runs is refused ("Profiling is already
in progress").
"""

from __future__ import annotations

from workers.engines.profiling import ProfileCall


def profile_call(steps: int, profile_id: str, output_dir: str) -> ProfileCall:
    """``steps`` forward steps of CPU and GPU activity into ``output_dir``, files named by ``profile_id``."""
    return ProfileCall(
        start_path="/start_profile",
        start_body={
            "output_dir": output_dir,
            "num_steps": steps,
            "activities": ["CPU", "GPU"],
            "profile_id": profile_id,
        },
        stop_path="/stop_profile",
        stops_itself=True,
        trace_dir=output_dir,
        file_prefix=profile_id,
    )
