"""Swap a model's linear layers (and stacked MoE expert GEMMs) for FP8 ones, in place.

Modules keep their parameters (same objects, same state-dict keys): only their class
changes, so optimizers, checkpoints and Hugging Face key mapping are unaffected. Convert
*before* ``fully_shard``. As in DeepSeek-V3, the embedding, the LM head (``skip``), the
router, norms and attention itself stay in high precision.

The stacked experts are recognised by shape (3-D ``up_proj`` weight) and by the
``_project(x, weight, bias, groups)`` grouped-GEMM method of
``legato.moe.experts.GroupedExperts``; precision/ may not import moe/, so the FP8 subclass
is made from whatever class the model uses and overrides only that method.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

from legato.precision.linear import Fp8Linear, fp8_grouped_mm
from legato.precision.tiles import Fp8Recipe, get_recipe


class Fp8ExpertsMixin:
    """Routes the grouped expert GEMMs through :func:`fp8_grouped_mm`."""

    fp8_recipe: Fp8Recipe
    fp8_backend: str

    def _project(self, x: Tensor, weight: Tensor, bias: Tensor | None, groups) -> Tensor:
        y = fp8_grouped_mm(x, weight, groups.sizes, self.fp8_recipe, self.fp8_backend)
        return y if bias is None else y + bias.index_select(0, groups.row_expert)


_expert_classes: dict[type, type] = {}


def _is_stacked_experts(module: nn.Module) -> bool:
    up = getattr(module, "up_proj", None)
    return isinstance(up, nn.Parameter) and up.dim() == 3 and hasattr(module, "_project")


def _fp8_experts_class(cls: type) -> type:
    if cls not in _expert_classes:
        _expert_classes[cls] = type(f"Fp8{cls.__name__}", (Fp8ExpertsMixin, cls), {})
    return _expert_classes[cls]


def convert_to_fp8(
    model: nn.Module,
    recipe: str | Fp8Recipe = "tilewise",
    *,
    backend: str = "auto",
    skip: Iterable[str] = ("lm_head",),
    experts: bool = True,
) -> list[str]:
    """Make every ``nn.Linear`` (exactly that class) whose name does not end with one of
    ``skip``, and the stacked MoE experts when ``experts``, compute in FP8. Returns the
    qualified names of the converted modules."""
    fp8 = get_recipe(recipe)
    skipped = tuple(skip)
    converted = []
    for name, module in model.named_modules():
        if any(name == s or name.endswith("." + s) for s in skipped):
            continue
        if type(module) is nn.Linear:
            module.__class__ = Fp8Linear
        elif experts and _is_stacked_experts(module) and not isinstance(module, Fp8ExpertsMixin):
            module.__class__ = _fp8_experts_class(type(module))
        elif not isinstance(module, (Fp8Linear, Fp8ExpertsMixin)):
            continue
        module.fp8_recipe = fp8
        module.fp8_backend = backend
        converted.append(name)
    return converted
