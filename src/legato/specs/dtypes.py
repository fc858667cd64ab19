"""The number formats legato knows, with what each level needs of them.

One table in the lowest layer (no torch), because the strategy, the device peaks, the
cost model's byte counts, the trainer's config and the FP8 converter all name dtypes and
used to keep their own lists. Torch-side modules map a name to a ``torch.dtype`` from
``compute``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DtypeKind:
    """``bytes``: per element as the GEMM operands are stored; ``compute``: what the
    activations and the non-FP8 GEMMs run in; ``fp8_recipe``: the scaling of the FP8
    linears (``legato.precision``) for the FP8 training dtypes; ``trainable``: accepted as
    ``train.dtype``."""

    name: str
    bytes: int
    compute: str
    fp8_recipe: str | None = None
    trainable: bool = False

    @property
    def is_fp8(self) -> bool:
        return self.fp8_recipe is not None

    @property
    def priced_as(self) -> str:
        """The strategy dtype the cost model prices it as (every FP8 recipe as 'fp8')."""
        return "fp8" if self.is_fp8 else self.name


DTYPE_KINDS: dict[str, DtypeKind] = {
    kind.name: kind
    for kind in (
        DtypeKind("fp32", 4, "fp32", trainable=True),
        DtypeKind("tf32", 4, "tf32"),
        DtypeKind("bf16", 2, "bf16", trainable=True),
        DtypeKind("fp16", 2, "fp16", trainable=True),
        DtypeKind("fp8", 1, "bf16", fp8_recipe="tilewise", trainable=True),
        DtypeKind("fp8-rowwise", 1, "bf16", fp8_recipe="rowwise", trainable=True),
        DtypeKind("fp8-tensorwise", 1, "bf16", fp8_recipe="tensorwise"),
    )
}
FP8_TRAIN_DTYPES = tuple(n for n, k in DTYPE_KINDS.items() if k.is_fp8 and k.trainable)
