"""Which GPU architectures the FlashInfer that an imitated SGLang pins builds trtllm-gen MoE kernels for.

The simulator used to kill every ``--moe-runner-backend flashinfer_trtllm`` launch off SM100, in every
version. Read from the wheels instead: FlashInfer's ``flashinfer/jit/fused_moe.py``
(``gen_trtllm_gen_fused_moe_sm100_module``) passes ``supported_major_versions=[10]`` in 0.6.3 (pinned by
SGLang 0.5.9) and ``[10, 12]`` from 0.6.7.post2 (SGLang 0.5.10) through 0.7.2 (SGLang 0.5.23); checked
in every FlashInfer wheel SGLang 0.5.9-0.5.23 pins. So on SM120 the JIT finds no target arch only with
the oldest pin; the recorded contract names the pin (``recorded_from.companions``).
"""

from __future__ import annotations

from workers.engines.contract import Contract, parse_version

#: The first FlashInfer whose trtllm-gen MoE JIT accepts SM major 12.
SM12_FROM = (0, 6, 7)


def trtllm_moe_majors(contract: Contract) -> tuple[int, ...]:
    """SM major versions the trtllm-gen MoE kernels build for with ``contract``'s pinned FlashInfer.

    A contract without a recorded FlashInfer pin is judged by its SGLang version (0.5.10 moved to 0.6.7)."""
    companions = contract.recorded_from.get("companions") or {}
    pinned = companions.get("flashinfer-python") if isinstance(companions, dict) else None
    if isinstance(pinned, str):
        new = parse_version(pinned) >= SM12_FROM
    else:
        new = parse_version(contract.version) >= (0, 5, 10)
    return (10, 12) if new else (10,)
