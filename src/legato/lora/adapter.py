"""A task's LoRA adapter: low-rank factors ``A`` [r, in] and ``B`` [out, r] per target layer.

Targets are named the way PEFT names them: the last component of a linear layer's path
(``q_proj``, ``v_proj``, ``gate_proj``, ``lm_head``), matching every layer of that name.
Initialisation follows PEFT's default (``A`` Kaiming-uniform with a = sqrt(5), ``B`` zero),
drawn from the task's own seed so a task's adapter does not depend on which tasks run next
to it. The adapter holds parameters only; the fused backbone applies them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from legato.errors import ConfigError
from legato.moe import MoELayer


@dataclass(frozen=True)
class AdapterShape:
    """What PEFT's ``adapter_config.json`` records about an adapter."""

    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def linear_layers(model: nn.Module) -> dict[str, nn.Linear]:
    """The linear layers a LoRA can adapt: every ``nn.Linear`` the block's linear backend
    runs, so none inside an MoE layer (its router and shared experts run plain)."""
    inside_moe = tuple(f"{path}." for path, m in model.named_modules() if isinstance(m, MoELayer))
    return {
        path: m
        for path, m in model.named_modules()
        if isinstance(m, nn.Linear) and not path.startswith(inside_moe)
    }


def resolve_targets(model: nn.Module, names: Sequence[str], where: str) -> list[str]:
    """Paths of the linear layers whose last name is one of ``names``; every name must match."""
    layers = linear_layers(model)
    available = sorted({p.rsplit(".", 1)[-1] for p in layers})
    paths = []
    for name in names:
        found = [p for p in layers if p.rsplit(".", 1)[-1] == name]
        if not found:
            raise ConfigError(
                f"{where}.target_modules: {name!r} is not a linear layer of the base model; "
                f"available: {', '.join(available)}"
            )
        paths += found
    return sorted(set(paths), key=list(layers).index)


def _key(path: str) -> str:
    return path.replace(".", "__")  # parameter names may not contain dots


class LoraAdapter(nn.Module):
    """One task's factors for every target path, in float32 (master weights)."""

    def __init__(
        self,
        name: str,
        shape: AdapterShape,
        model: nn.Module,
        *,
        seed: int = 0,
        where: str | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.shape = shape
        self.paths = resolve_targets(model, shape.target_modules, where or f"tasks.{name}")
        layers = linear_layers(model)
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        generator = torch.Generator().manual_seed(seed)
        for path in self.paths:
            layer = layers[path]
            bound = 1.0 / math.sqrt(layer.in_features)  # kaiming_uniform_(a=sqrt(5))
            a = torch.rand(shape.rank, layer.in_features, generator=generator) * 2 - 1
            self.lora_A[_key(path)] = nn.Parameter((a * bound).to(device))
            self.lora_B[_key(path)] = nn.Parameter(
                torch.zeros(layer.out_features, shape.rank, device=device)
            )
        self.dropout_generator = torch.Generator(device=device or "cpu").manual_seed(seed + 1)

    def factors(self, path: str) -> tuple[Tensor, Tensor] | None:
        key = _key(path)
        if key not in self.lora_A:
            return None
        return self.lora_A[key], self.lora_B[key]

    def named_factors(self) -> Iterator[tuple[str, Tensor, Tensor]]:
        for path in self.paths:
            yield path, self.lora_A[_key(path)], self.lora_B[_key(path)]
