"""What the simulated model knows: the answers to benchbot's built-in eval questions, per backend.

Everything else the sim writes is seeded word salad (``text.py``); a prompt that contains a built-in
question (``workers.evaluation.tasks.parse_builtin`` reads it back: arithmetic or exact copy) gets its
answer instead, in a few prose shapes, then EOS, as a model with a working kernel path would. The
quality of the answer depends on the kernels, so the accuracy gate can be tested. ``kernel_quality`` is
the one place that says which kernels are good, degraded or garbage, in kernel names both engines use
(SGLang's ``--moe-runner-backend`` / ``--fp4-gemm-backend`` and vLLM's ``--moe-backend`` /
``--linear-backend`` name them alike); each personality resolves its own flags to the kernels first
(``quality_for`` here for SGLang, ``workers/sim/vllm_config.py`` for vLLM):

* ``good``: every answer is right;
* ``degraded``: MoE kernel ``flashinfer_cutlass`` with FP4 GEMM ``flashinfer_cutlass`` (SGLang presets
  ``cutlass fp4-cutlass``, also 0.5.9's default FP4 GEMM and 0.5.23's ``auto`` on SM120; vLLM's
  ``cutlass fp4-cutlass``, also its ``auto`` kernels on SM120), the FP4 path whose numerics the team's
  ``cudnn`` preset avoids: about ``DEGRADED_SHARE`` of the questions are answered wrong (one digit or
  one character off), always the same ones (chosen by a hash of the question), a few points down and
  nothing that a smoke test would notice;
* ``garbage``: MoE kernel ``flashinfer_cutedsl`` answers ``!!!!`` to everything (the stream's own garbage
  mode: the Oracle has no reply for any prompt).
"""

from __future__ import annotations

import argparse
import hashlib

from workers.evaluation.tasks import parse_builtin
from workers.sim import text
from workers.sim.args import is_new_layout
from workers.sim.engine import Stream

GOOD, DEGRADED, GARBAGE = "good", "degraded", "garbage"
DEGRADED_SHARE = 0.05
_BUCKETS = 10_000

#: MoE kernels whose logits are NaN on the simulated GPUs: every token is ``!``.
GARBAGE_MOE = frozenset({"flashinfer_cutedsl"})
#: (MoE kernel, FP4 GEMM kernel) pairs that answer a few percent of questions wrong.
DEGRADED_KERNELS = frozenset({("flashinfer_cutlass", "flashinfer_cutlass")})


def kernel_quality(moe: str, fp4_gemm: str) -> str:
    """``garbage``, ``degraded`` or ``good`` for the kernels a server runs (both engines' one table)."""
    if moe in GARBAGE_MOE:
        return GARBAGE
    if (moe, fp4_gemm) in DEGRADED_KERNELS:
        return DEGRADED
    return GOOD


def fp4_gemm_backend(args: argparse.Namespace, version: str, sm: int) -> str:
    """The FP4 GEMM runner the server would use: the flag, resolving 0.5.23's ``auto`` as its help says."""
    value = str(getattr(args, "fp4_gemm_runner_backend", None) or "auto")
    if value == "auto" and is_new_layout(version):
        return "flashinfer_cutedsl" if sm == 100 else "marlin" if sm in (80, 86, 89, 90) else "flashinfer_cutlass"
    return value


def quality_for(args: argparse.Namespace, version: str, sm: int) -> str:
    """An SGLang server's answer quality from its MoE runner and its resolved FP4 GEMM runner."""
    return kernel_quality(str(args.moe_runner_backend), fp4_gemm_backend(args, version, sm))


def _digest(prompt: str) -> int:
    return int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8, person=b"sim-eval").digest(), "big")


def degraded_wrong(prompt: str) -> bool:
    """Whether the degraded path gets this question wrong: a fixed ``DEGRADED_SHARE`` of questions."""
    return _digest(prompt) % _BUCKETS < DEGRADED_SHARE * _BUCKETS


def _off_by_one_place(answer: str, h: int, number: bool) -> str:
    """``answer`` with one digit (or letter) changed, deterministically: the wrong answer of a bad kernel."""
    places = [i for i, ch in enumerate(answer) if ch.isalnum()]
    i = places[h % len(places)]
    ch = answer[i]
    if ch.isdigit():
        new = str((int(ch) + 1 + (h >> 8) % 8) % 10)
        if number and i == 0 and new == "0":
            new = "1" if ch != "1" else "2"
    else:
        base = ord("a") if ch.islower() else ord("A")
        new = chr(base + (ord(ch) - base + 1 + (h >> 8) % 24) % 26)
    return answer[:i] + new + answer[i + 1 :]


def _with_commas(number: str) -> str:
    return f"{int(number):,}"


def reply_for(prompt: str, quality: str) -> str | None:
    """The sim's reply to a prompt holding a built-in question (None: not one of ours, or a garbage
    server, whose streams say ``!!!!`` by themselves)."""
    if quality == GARBAGE:
        return None
    parsed = parse_builtin(prompt)
    if parsed is None:
        return None
    kind, answer = parsed
    h = _digest(prompt)
    if quality == DEGRADED and degraded_wrong(prompt):
        answer = _off_by_one_place(answer, h >> 16, kind != "copy")
    if kind == "copy":
        return answer
    shapes = (
        f"The answer is {answer}.",
        _with_commas(answer),
        f"Let me compute it: the result is **{answer}**.",
        f"Answer: {_with_commas(answer)}\n",
    )
    return shapes[h % len(shapes)]


def _chat_text(messages: list) -> str | None:
    """The last user message's text (OpenAI content parts joined)."""
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, list):
                content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return content if isinstance(content, str) else None
    return None


class Oracle:
    """One server's answering: its quality, and the replies for each prompt shape of the API."""

    def __init__(self, quality: str) -> None:
        self.quality = quality

    @classmethod
    def for_server(cls, args: argparse.Namespace, version: str, sm: int) -> Oracle:
        return cls(quality_for(args, version, sm))

    @property
    def garbage(self) -> bool:
        """The server answers ``!!!!`` to everything: the streams' garbage mode, no replies from here."""
        return self.quality == GARBAGE

    def replies(self, prompt: object) -> list[str | None]:
        """One entry per prompt, flattened as ``SimServer._prompt_list`` does (token ids: None)."""
        if isinstance(prompt, str):
            return [reply_for(prompt, self.quality)]
        if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            return [None]
        if isinstance(prompt, list):
            return [r for p in prompt for r in self.replies(p)]
        return []

    def chat_replies(self, messages: list) -> list[str | None]:
        content = _chat_text(messages)
        return [reply_for(content, self.quality) if content else None]


def apply(stream: Stream, reply: str, max_new: int, stops: bool) -> None:
    """Make ``stream`` say ``reply``: then EOS when the request may stop, else the usual words up to
    ``max_new`` (``ignore_eos``); cut at ``max_new`` like any reply."""
    pieces = text.encode_chars(reply)
    if stops:
        stream.target = max(1, min(len(pieces), max_new))
        stream.finish = "stop" if len(pieces) <= max_new else "length"
        stream.pieces = pieces[: stream.target]
    else:
        stream.pieces = (pieces + stream.pieces)[: stream.target]
