"""What the simulated host is made of: its GPUs and the model the engine pretends to load.

Kept as plain frozen data so the server, the performance model and the ``nvidia-smi`` stand-in all
read the same facts (a server on "8 x RTX PRO 6000" must show 8 x 97887 MiB in ``nvidia-smi``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from workers.errors import BenchbotError


@dataclass(frozen=True)
class GpuProfile:
    """One host's GPUs. ``mem_bw_tbs`` and ``allreduce_us`` feed the performance model."""

    name: str
    gpu_name: str
    count: int
    memory_mib: int
    compute_cap: str
    interconnect: str  # "PCIe" or "NVLink"
    nvlink: bool
    mem_bw_tbs: float
    allreduce_us: float  # NCCL latency of one small all-reduce at 8 GPUs
    driver_version: str = "580.95.05"
    cuda_version: str = "13.0"
    power_limit_w: int = 600

    @property
    def sm(self) -> int:
        """SM number as SGLang spells it (``12.0`` -> 120)."""
        major, _, minor = self.compute_cap.partition(".")
        return int(major) * 10 + int(minor or 0)

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


PROFILES: dict[str, GpuProfile] = {
    "rtx-pro-6000-x8": GpuProfile(
        name="rtx-pro-6000-x8",
        gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        count=8,
        memory_mib=97887,
        compute_cap="12.0",
        interconnect="PCIe",
        nvlink=False,
        mem_bw_tbs=1.79,
        allreduce_us=52.0,
    ),
    "h100-x8": GpuProfile(
        name="h100-x8",
        gpu_name="NVIDIA H100 80GB HBM3",
        count=8,
        memory_mib=81559,
        compute_cap="9.0",
        interconnect="NVLink",
        nvlink=True,
        mem_bw_tbs=3.35,
        allreduce_us=14.0,
        power_limit_w=700,
    ),
    "b200-x8": GpuProfile(
        name="b200-x8",
        gpu_name="NVIDIA B200",
        count=8,
        memory_mib=183359,
        compute_cap="10.0",
        interconnect="NVLink",
        nvlink=True,
        mem_bw_tbs=8.0,
        allreduce_us=10.0,
        power_limit_w=1000,
    ),
}
PROFILES["rtx-pro-6000-x4"] = replace(PROFILES["rtx-pro-6000-x8"], name="rtx-pro-6000-x4", count=4)
DEFAULT_PROFILE = "rtx-pro-6000-x8"


def load_profile(spec: str | None = None) -> GpuProfile:
    """A profile by name, inline JSON, or a JSON file path; ``None`` reads ``BENCHBOT_SIM_PROFILE``.

    JSON may name a ``base`` profile and override any field, e.g. ``{"base": "rtx-pro-6000-x8", "count": 4}``.
    """
    spec = spec if spec is not None else os.environ.get("BENCHBOT_SIM_PROFILE") or DEFAULT_PROFILE
    spec = spec.strip()
    if spec in PROFILES:
        return PROFILES[spec]
    text = spec
    if not spec.startswith("{"):
        path = Path(spec)
        if not path.is_file():
            known = ", ".join(sorted(PROFILES))
            raise BenchbotError(f"unknown GPU profile {spec!r}: use one of {known}, inline JSON or a JSON file")
        text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchbotError(f"GPU profile is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BenchbotError("GPU profile JSON must be an object")
    base = PROFILES.get(str(data.pop("base", DEFAULT_PROFILE)))
    if base is None:
        raise BenchbotError(f"unknown base profile in GPU profile JSON: use one of {', '.join(sorted(PROFILES))}")
    fields = set(base.to_dict())
    unknown = sorted(set(data) - fields)
    if unknown:
        raise BenchbotError(f"unknown GPU profile field(s): {', '.join(unknown)}")
    data.setdefault("name", "custom")
    try:
        return replace(base, **data)
    except TypeError as exc:  # pragma: no cover - replace() only raises on bad names, checked above
        raise BenchbotError(f"bad GPU profile: {exc}") from exc


@dataclass(frozen=True)
class ModelSpec:
    """The few model facts that drive memory, speed and architecture-specific checks."""

    arch: str
    model_type: str
    hybrid: bool  # GatedDeltaNet/mamba layers: needs --mamba-scheduler-strategy care with spec decoding
    layers: int
    full_attn_layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    weight_gb: float  # whole checkpoint in GB (all TP ranks together)
    expert_gb: float  # part of weight_gb that is routed experts (0 for dense)
    experts: int
    active_experts: int
    active_params_b: float
    context_len: int
    has_mtp: bool
    quant: str  # checkpoint quantization found in hf_quant_config.json ("" for none)


QWEN35_397B = ModelSpec(
    arch="Qwen3_5MoeForConditionalGeneration",
    model_type="qwen3_5_moe",
    hybrid=True,
    layers=60,
    full_attn_layers=15,
    hidden=4096,
    kv_heads=2,
    head_dim=256,
    weight_gb=223.0,
    expert_gb=215.0,
    experts=512,
    active_experts=10,
    active_params_b=17.0,
    context_len=262144,
    has_mtp=True,
    quant="modelopt_fp4",
)


def model_spec_for(model_path: str) -> ModelSpec:
    """Guess the model from its path: Qwen3.5 by name, otherwise a dense model sized by ``<N>B``."""
    low = model_path.lower()
    if "qwen3.5" in low or "qwen3_5" in low or "qwen3-5" in low:
        quant = "modelopt_fp4" if ("fp4" in low or "nvfp4" in low) else ""
        weight = QWEN35_397B.weight_gb if quant else 397 * 2.0
        return replace(QWEN35_397B, quant=quant, weight_gb=weight, expert_gb=weight * 0.964)
    match = re.search(r"(\d+(?:\.\d+)?)b\b", low)
    params_b = float(match.group(1)) if match else 8.0
    fp4 = "fp4" in low
    bytes_per_param = 0.56 if fp4 else 2.0
    return ModelSpec(
        arch="LlamaForCausalLM",
        model_type="llama",
        hybrid=False,
        layers=32 if params_b < 20 else 80,
        full_attn_layers=32 if params_b < 20 else 80,
        hidden=4096 if params_b < 20 else 8192,
        kv_heads=8,
        head_dim=128,
        weight_gb=params_b * bytes_per_param,
        expert_gb=0.0,
        experts=0,
        active_experts=0,
        active_params_b=params_b,
        context_len=131072,
        has_mtp=False,
        quant="modelopt_fp4" if fp4 else "",
    )
