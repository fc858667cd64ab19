"""Pipeline schedule IR: per rank, the ordered list of actions it executes.

A schedule is plain data so that the same object can be simulated here and executed by
the torch runtime. Vocabulary (one *unit* = micro-batch ``mb``, sequence slice ``j``,
virtual stage ``vs``):

* ``F``  forward of a unit;
* ``B``  input-gradient backward (torch's ``I`` / BACKWARD_INPUT), on the critical path;
* ``W``  weight-gradient backward (torch's ``W``), deferrable; ``subtask`` numbers the
  independent GEMM groups when W is split finely (``Schedule.w_subtasks`` > 1);
* ``BW`` fused backward, B and W together (torch's ``B`` / FULL_BACKWARD);
* ``SEND_F``/``RECV_F`` move the output activation of stage ``vs`` to stage ``vs + 1``:
  ``SEND_F`` is tagged with the producing stage, ``RECV_F`` with the consuming stage;
* ``SEND_B``/``RECV_B`` move the input gradient of stage ``vs`` to stage ``vs - 1``:
  ``SEND_B`` is tagged with the producing stage, ``RECV_B`` with the consuming stage.

Every micro-batch runs every virtual stage in order, except under the ``dual`` placement
(DualPipe): there the model is held twice, stages ``0..p-1`` down the ranks and stages
``p..2p-1`` (the second copy) back up, and a micro-batch crosses only one copy: the first
half of the micro-batches the first, the second half the second (``Schedule.route``).

Sends are asynchronous (isend); a receive blocks its rank until the message has arrived.
Stages next to each other on the same rank (the tip of the V shape) exchange tensors
locally, with no send or receive.

Compact text form of an action: ``<kind><mb>[.<slice>]@<virtual stage>[#<subtask>]``,
slice and subtask omitted when zero: ``F3.1@4``, ``BW0@0``, ``W2.3@5#1``, ``SEND_F3@0``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

from legato.schedule.errors import ScheduleError

COMPUTE_KINDS = ("F", "B", "W", "BW")
COMM_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
KINDS = COMPUTE_KINDS + COMM_KINDS
_TOKEN = re.compile(r"^(SEND_F|RECV_F|SEND_B|RECV_B|BW|F|B|W)(\d+)(?:\.(\d+))?@(\d+)(?:#(\d+))?$")


@dataclass(frozen=True)
class Action:
    """One step of one rank: a computation or a point-to-point transfer of one unit."""

    kind: str
    microbatch: int
    stage: int
    seq_slice: int = 0
    subtask: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScheduleError(
                f"action kind: must be one of {', '.join(KINDS)}, got {self.kind!r}"
            )
        if min(self.microbatch, self.stage, self.seq_slice, self.subtask) < 0:
            raise ScheduleError(f"action {self}: indices must be non-negative")
        if self.subtask and self.kind != "W":
            raise ScheduleError(f"action {self}: only W actions have a subtask")

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def unit(self) -> tuple[int, int, int]:
        """(micro-batch, slice, virtual stage): what owns the activations."""
        return (self.microbatch, self.seq_slice, self.stage)

    def __str__(self) -> str:
        text = f"{self.kind}{self.microbatch}"
        if self.seq_slice:
            text += f".{self.seq_slice}"
        text += f"@{self.stage}"
        return f"{text}#{self.subtask}" if self.subtask else text

    @classmethod
    def parse(cls, token: str) -> Action:
        match = _TOKEN.match(str(token).strip())
        if not match:
            raise ScheduleError(
                f"action {token!r}: expected <kind><mb>[.<slice>]@<stage>[#<subtask>], "
                f"kind one of {', '.join(KINDS)}"
            )
        kind, mb, sl, stage, sub = match.groups()
        return cls(kind, int(mb), int(stage), int(sl or 0), int(sub or 0))


@dataclass(frozen=True)
class StagePlacement:
    """Which rank holds which virtual stage.

    ``interleaved``: chunk c of rank d is virtual stage c*p + d (Megatron).
    ``v``: even chunks run down the ranks, odd chunks back up (chunk 1 of rank d is
    stage 2p - 1 - d), so with 2 chunks rank 0 holds the first and the last stage (ZB-V).
    ``dual``: the V's ranks for two copies of a p-stage model (DualPipe): chunk 0 of rank
    d is stage d of the first copy, chunk 1 stage p + (p - 1 - d) of the second, which
    is the model's stage p - 1 - d; a micro-batch crosses one copy, one chunk per rank.
    """

    ranks: int
    chunks: int = 1
    shape: Literal["interleaved", "v", "dual"] = "interleaved"

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.chunks < 1:
            raise ScheduleError(f"placement: ranks and chunks must be >= 1, got {self}")
        if self.shape not in ("interleaved", "v", "dual"):
            raise ScheduleError(
                f"placement: must be 'interleaved', 'v' or 'dual', got {self.shape!r}"
            )
        if self.shape == "dual" and self.chunks != 2:
            raise ScheduleError(f"placement: dual holds 2 chunks per rank, got {self.chunks}")

    @property
    def num_stages(self) -> int:
        return self.ranks * self.chunks

    @property
    def chunks_per_pass(self) -> int:
        """Chunks of one rank a micro-batch runs: all of them, one under ``dual``."""
        return 1 if self.shape == "dual" else self.chunks

    def _reversed(self, chunk: int) -> bool:
        return self.shape in ("v", "dual") and chunk % 2 == 1

    def stage(self, rank: int, chunk: int) -> int:
        offset = self.ranks - 1 - rank if self._reversed(chunk) else rank
        return chunk * self.ranks + offset

    def rank(self, stage: int) -> int:
        chunk, offset = divmod(stage, self.ranks)
        return self.ranks - 1 - offset if self._reversed(chunk) else offset

    def chunk(self, stage: int) -> int:
        return stage // self.ranks


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered actions plus the sizes needed to interpret them.

    ``ranks[d]`` is what rank d executes, in order. ``slice_bounds`` are the k+1 cut
    points of the sequence as fractions (0 = start, 1 = end); the runtime rounds them to
    token positions (``legato.schedule.slicing.token_bounds``). ``backward`` says whether
    units use fused ``BW`` or split ``B`` + ``W`` (``w_subtasks`` W actions per unit).
    """

    name: str
    placement: StagePlacement
    microbatches: int
    slices: int = 1
    backward: Literal["fused", "split"] = "fused"
    w_subtasks: int = 1
    slice_bounds: tuple[float, ...] = ()
    ranks: tuple[tuple[Action, ...], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        for name in ("microbatches", "slices", "w_subtasks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScheduleError(f"{name}: must be a positive integer, got {value!r}")
        if self.backward not in ("fused", "split"):
            raise ScheduleError(f"backward: must be 'fused' or 'split', got {self.backward!r}")
        if not self.slice_bounds:
            bounds = tuple(j / self.slices for j in range(self.slices + 1))
            object.__setattr__(self, "slice_bounds", bounds)
        if len(self.slice_bounds) != self.slices + 1:
            raise ScheduleError(
                f"slice_bounds: need {self.slices + 1} cut points for {self.slices} slices, "
                f"got {len(self.slice_bounds)}"
            )
        if self.placement.shape == "dual" and self.microbatches % 2:
            raise ScheduleError(
                f"microbatches: the dual placement sends half each way, needs an even "
                f"number, got {self.microbatches}"
            )
        b = self.slice_bounds
        if b[0] != 0.0 or b[-1] != 1.0 or any(y <= x for x, y in pairwise(b)):
            raise ScheduleError(f"slice_bounds: must rise from 0 to 1, got {list(b)}")

    @property
    def stages(self) -> int:
        """Number of pipeline ranks p."""
        return self.placement.ranks

    @property
    def chunks(self) -> int:
        """Model chunks per rank v."""
        return self.placement.chunks

    @property
    def num_stages(self) -> int:
        return self.placement.num_stages

    @property
    def chunks_per_pass(self) -> int:
        """Chunks of a rank one micro-batch runs (``v``; 1 under the dual placement)."""
        return self.placement.chunks_per_pass

    def route(self, microbatch: int) -> range:
        """The virtual stages ``microbatch`` runs, in order."""
        if self.placement.shape != "dual":
            return range(self.num_stages)
        p = self.stages
        return range(p, 2 * p) if microbatch >= self.microbatches // 2 else range(p)

    @property
    def fused(self) -> bool:
        return self.backward == "fused"

    def unit_weight(self, seq_slice: int) -> float:
        """Activation size of one slice on one chunk, in slice units (1 for equal slices)."""
        return self.slices * (self.slice_bounds[seq_slice + 1] - self.slice_bounds[seq_slice])

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stages": self.stages,
            "microbatches": self.microbatches,
            "chunks": self.chunks,
            "placement": self.placement.shape,
            "slices": self.slices,
            "slice_bounds": list(self.slice_bounds),
            "backward": self.backward,
            "w_subtasks": self.w_subtasks,
            "ranks": [[str(a) for a in actions] for actions in self.ranks],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Schedule:
        known = {
            "name", "stages", "microbatches", "chunks", "placement", "slices",
            "slice_bounds", "backward", "w_subtasks", "ranks",
        }  # fmt: skip
        unknown = sorted(set(data) - known)
        if unknown:
            raise ScheduleError(f"schedule.{unknown[0]}: unknown field; allowed: {sorted(known)}")
        try:
            placement = StagePlacement(int(data["stages"]), int(data.get("chunks", 1)),
                                  data.get("placement", "interleaved"))  # fmt: skip
            ranks = tuple(tuple(Action.parse(t) for t in rank) for rank in data["ranks"])
            return cls(
                name=str(data.get("name", "custom")),
                placement=placement,
                microbatches=int(data["microbatches"]),
                slices=int(data.get("slices", 1)),
                backward=data.get("backward", "fused"),
                w_subtasks=int(data.get("w_subtasks", 1)),
                slice_bounds=tuple(float(x) for x in data.get("slice_bounds", ())),
                ranks=ranks,
            )
        except ScheduleError:
            raise
        except KeyError as exc:
            raise ScheduleError(f"schedule.{exc.args[0]}: required field is missing") from None
        except (TypeError, ValueError) as exc:
            raise ScheduleError(f"schedule: {exc}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScheduleError(f"schedule: malformed JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ScheduleError("schedule: expected a JSON object at the top level")
        return cls.from_dict(data)

    def to_text(self) -> str:
        """One line per rank: ``rank 0: F0@0 SEND_F0@0 ...``."""
        return "\n".join(
            f"rank {d}: " + " ".join(str(a) for a in actions)
            for d, actions in enumerate(self.ranks)
        )
