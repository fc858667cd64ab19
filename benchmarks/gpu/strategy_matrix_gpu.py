"""The strategy matrix on one GPU: ``legato train`` on CUDA, predicted (the GPU's node
preset, e.g. ``hgx-h200``) against measured, for the one-process rows of
``benchmarks/strategy_matrix.py`` and the GPU's own ``auto`` pick.

Prepared for a machine with CUDA; without one it prints a ``skipped`` line and exits 0.

    python benchmarks/gpu/strategy_matrix_gpu.py [--quick]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print('{"benchmark": "strategy_matrix_gpu", "skipped": "no CUDA device"}')
        return 0
    script = HERE.parent / "strategy_matrix.py"
    extra = ["--quick"] if "--quick" in sys.argv else []
    command = [sys.executable, str(script), "--device", "cuda", "--nproc", "1", *extra]
    return subprocess.run(command, cwd=HERE.parent, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
