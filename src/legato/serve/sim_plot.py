"""The figure of ``legato serve simulate --plot``: mean and p99 TTFT against the request
rate, one line per policy."""

from __future__ import annotations

from collections.abc import Sequence


def plot_latency(points: Sequence[dict], path: str) -> None:
    """``points``: results with ``policy``, ``rate``, ``mean_ttft_ms``, ``p99_ttft_ms``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for policy in dict.fromkeys(p["policy"] for p in points):
        mine = sorted((p for p in points if p["policy"] == policy), key=lambda p: p["rate"])
        for ax, key in zip(axes, ("mean_ttft_ms", "p99_ttft_ms"), strict=True):
            ax.plot([p["rate"] for p in mine], [p[key] for p in mine], marker="o", label=policy)
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(key.replace("_", " "))
            ax.set_yscale("log")
    axes[0].legend()
    fig.suptitle("multi-LoRA pool policies on a modelled GPU (not legato's engine speed)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
