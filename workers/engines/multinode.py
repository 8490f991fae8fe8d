"""How each engine is told it is one rank of several hosts: a data table, spelt as the recorded contracts spell it.

A gang launch (issue 38) starts the same engine on every member host, each with the group's flags plus
its rank's: how many nodes, which one this is, where they meet. The spelling is the engine's, and only
options its recorded contracts hold are used (``tests/test_multinode.py`` checks each against every
recorded release):

* **SGLang** (``sglang-*.json``, ``ServerArgs``): ``--nnodes N --node-rank R --dist-init-addr HEAD:PORT``;
  rank 0 serves HTTP, the others run their schedulers only. Each rank logs
  ``Init torch distributed ends.`` once ``init_process_group`` returned, i.e. once every rank met.
* **vLLM** (``vllm-*.json``, its ``ParallelConfig`` options): ``--nnodes N --node-rank R --master-addr HEAD
  --master-port PORT``, and ``--headless`` on every rank above 0 (no API server there). No recorded text
  says a rank joined, so a vLLM rank is judged by being alive only.
* **TensorRT-LLM** (``trtllm-1.3.0rc3.json``): ``trtllm-serve`` records no node-rank option at all; its
  multi-node form is one MPI launch (``mpirun`` over ``trtllm-llmapi-launch``) that starts every rank
  itself, which benchbot does not drive. A group of TensorRT-LLM hosts is refused with that reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from workers.engines.args import FlagValue
from workers.engines.contract import Contract
from workers.errors import BenchbotError


@dataclass(frozen=True)
class MultiNodeForm:
    """One engine's multi-node flags: templates over ``{nnodes}``, ``{rank}``, ``{head}`` and ``{port}``."""

    #: Every rank's flags, in order; a value of True is a bare flag.
    every_rank: tuple[tuple[str, str], ...]
    #: Flags only the ranks above 0 take (vLLM's ``--headless``: no API server on a follower).
    followers: tuple[str, ...] = ()
    #: A log line every rank writes once all ranks met (None: the engine records none; alive is all we know).
    joined_line: str | None = None

    def flags(self, *, nnodes: int, rank: int, head: str, port: int) -> tuple[tuple[str, FlagValue], ...]:
        """This rank's flags, filled in."""
        words = {"nnodes": str(nnodes), "rank": str(rank), "head": head, "port": str(port)}
        filled: list[tuple[str, FlagValue]] = [(flag, value.format(**words)) for flag, value in self.every_rank]
        return (*filled, *((flag, True) for flag in (self.followers if rank > 0 else ())))

    def names(self) -> tuple[str, ...]:
        """Every flag this form may add (the ones that differ between ranks, and the follower-only ones)."""
        return (*(flag for flag, _ in self.every_rank), *self.followers)


#: engine kind -> its multi-node form; a kind named in :data:`UNSUPPORTED` has none, with the reason.
FORMS: Mapping[str, MultiNodeForm] = {
    "sglang": MultiNodeForm(
        every_rank=(("--nnodes", "{nnodes}"), ("--node-rank", "{rank}"), ("--dist-init-addr", "{head}:{port}")),
        joined_line="Init torch distributed ends.",
    ),
    "vllm": MultiNodeForm(
        every_rank=(
            ("--nnodes", "{nnodes}"),
            ("--node-rank", "{rank}"),
            ("--master-addr", "{head}"),
            ("--master-port", "{port}"),
        ),
        followers=("--headless",),
    ),
}

UNSUPPORTED: Mapping[str, str] = {
    "trtllm": (
        "TensorRT-LLM's recorded trtllm-serve options have no node rank: it runs across hosts as one MPI launch "
        "(mpirun over trtllm-llmapi-launch) that starts every rank itself, which benchbot does not drive"
    ),
}


def form_for(kind: str, name: str) -> MultiNodeForm:
    """The multi-node form of engine ``kind`` (``name`` for messages); a friendly refusal when it has none."""
    form = FORMS.get(kind)
    if form is None:
        why = UNSUPPORTED.get(kind, f"benchbot knows no multi-node form of {name}")
        raise BenchbotError(f"a group of {name} hosts cannot launch one model across them: {why}")
    return form


def unrecorded(form: MultiNodeForm, contract: Contract) -> list[str]:
    """The form's flags that ``contract`` does not record (nothing is sent that the release would refuse)."""
    return [flag for flag in form.names() if flag not in contract.by_flag]


def without_rank_flags(form: MultiNodeForm, flags: Mapping[str, object]) -> dict[str, object]:
    """``flags`` less the ones that differ between ranks (to compare two ranks' configs)."""
    drop = set(form.names())
    return {flag: value for flag, value in flags.items() if flag not in drop}
