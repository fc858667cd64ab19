"""What a request asks of generation, and drawing its next token.

The parameters and their checks follow the OpenAI completions API (``temperature`` 0 is
greedy; ``top_p``, ``seed``, ``stop``, ``max_tokens``) with vLLM's extensions (``top_k``,
``ignore_eos``). Each request draws from its own generator, seeded when it gives a seed, so
its tokens do not depend on which requests share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from legato.errors import LegatoError


class RequestError(LegatoError):
    """A request the server refuses: ``status`` is the HTTP code, the message names the
    field (OpenAI's ``invalid_request_error`` shape is built from both)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param

    def sent_as(self, field: str, name: str) -> RequestError:
        """This error, with ``field`` called ``name`` if it is about ``field``: the name the
        request sent it under (chat's ``max_completion_tokens`` for ``max_tokens``)."""
        if self.param != field or name == field:
            return self
        return RequestError(str(self).replace(field, name), self.status, name)


_SEEDS = range(-(2**63), 2**63)  # what a generator's seed holds (vLLM's bounds too)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = no limit
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        checks = (
            ("max_tokens", isinstance(self.max_tokens, int) and self.max_tokens >= 1, "an integer >= 1"),
            ("temperature", 0 <= self.temperature <= 2, "in [0, 2]"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= -1, "-1, 0 (off) or >= 1"),
            ("stop", len(self.stop) <= 4 and all(isinstance(s, str) and s for s in self.stop),
             "up to 4 non-empty strings"),
            ("seed", self.seed is None or (isinstance(self.seed, int) and self.seed in _SEEDS),
             "a 64-bit integer, in [-2**63, 2**63)"),
        )  # fmt: skip
        for name, ok, allowed in checks:
            if not ok:
                raise RequestError(
                    f"{name}: must be {allowed}, got {getattr(self, name)!r}", param=name
                )

    def generator(self) -> torch.Generator:
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**62, ()).item())
        return torch.Generator().manual_seed(seed)


def next_token(logits: Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The token drawn from ``logits`` [vocab] (float32) under ``params``."""
    if params.temperature == 0:
        return int(logits.argmax())
    # Drawn on the CPU, where the request's generator lives: one row per request, and the
    # same seed gives the same tokens whichever device computed the logits.
    scaled = logits.cpu() / params.temperature
    if params.top_k > 0 and params.top_k < scaled.numel():
        kth = scaled.topk(params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(-1)
    if params.top_p < 1:
        sorted_probs, order = probs.sort(descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p  # keep the first past p
        probs = probs.scatter(0, order, sorted_probs.masked_fill(outside, 0.0))
    return int(torch.multinomial(probs, 1, generator=generator))
