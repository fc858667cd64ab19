"""The import direction of docs/design.md is a rule: lower layers never import upper ones, and
the planning layers (specs, cost, schedule, plan) never import torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "legato"

# Rank of each sub-package; a module may import packages of equal or lower rank only.
LAYER_RANK = {
    "errors": 0,
    "csv_rows": 1,
    "atomic": 1,
    "local_ray": 0,
    "specs": 1,
    "devices": 1,  # device profiles: below cost/, reading specs/
    "layout": 1,  # SBP layouts: what a tensor layout sends, below cost/, reading specs/
    "cost": 2,
    "schedule": 2,
    "plan": 3,
    "parallel": 4,
    "calibrate": 4,
    "memory": 4,
    "precision": 4,
    "moe": 4,
    "models": 4,
    "data": 4,
    "train": 5,
    "serve": 5,
    "cluster": 5,
    "lora": 5,
    "cli": 6,
}
# Same-rank packages that may import each other (runtime pieces built on the models).
ALLOWED_SIDEWAYS = {
    ("parallel", "models"), ("parallel", "moe"), ("parallel", "memory"), ("parallel", "precision"), ("calibrate", "parallel"),
    ("models", "moe"), ("models", "precision"), ("models", "memory"), ("memory", "models"),
    ("moe", "precision"), ("devices", "specs"), ("layout", "specs"), ("lora", "train"), ("serve", "lora"), ("serve", "train"), ("cluster", "train"),
}  # fmt: skip
TORCH_FREE = ("specs", "devices", "layout", "cost", "schedule", "plan")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _package_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py") if rel.parts else ""


MODULES = sorted(p for p in SRC.rglob("*.py") if _package_of(p) in LAYER_RANK)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_respect_layering(path: Path) -> None:
    here = _package_of(path)
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] == "torch" and here in TORCH_FREE:
            pytest.fail(f"{path.relative_to(SRC)} imports torch; {here}/ must stay torch-free")
        if parts[0] != "legato" or len(parts) < 2 or parts[1] not in LAYER_RANK:
            continue
        there = parts[1]
        if there == here or (here, there) in ALLOWED_SIDEWAYS:
            continue
        assert LAYER_RANK[there] < LAYER_RANK[here], (
            f"{path.relative_to(SRC)} imports legato.{there}: {here}/ may not import a layer "
            "at or above its own"
        )


# Modules that must import without torch: every module of the planning packages, and the
# cluster level's policies and simulator (DESIGN.md: decisions are pure functions of state).
TORCH_FREE_MODULES = {
    "planning layers": ["legato.specs", "legato.devices", "legato.cost"],
    "cluster policies and simulator": [
        *(f"legato.cluster.{m}" for m in ("workloads", "jobs", "trace", "placement", "speed")),
        "legato.cluster.simulator",
        "legato.cluster.report",
        "legato.cluster.policies",
    ],
}


@pytest.mark.parametrize("packages", TORCH_FREE_MODULES.values(), ids=TORCH_FREE_MODULES.keys())
def test_loads_without_torch(packages: list[str]) -> None:
    """`legato plan` and `legato cluster simulate` answer on a laptop without torch."""
    code = (
        "import sys, importlib, pkgutil\n"
        f"for name in {packages!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    for m in pkgutil.walk_packages(getattr(module, '__path__', []), name + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
