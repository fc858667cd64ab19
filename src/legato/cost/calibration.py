"""The cost model's tuned constants, in one place, each with where it came from.

Everything the cost model does not derive from a spec (FLOPs, bytes, link figures) is one
of these numbers. They are global: no constant belongs to one model or one published run.

* Collective constants: least squares on the relative error of the measured A100 NCCL
  all-reduce (``cost/data/a100_nccl_allreduce_{2,4,8}gpu.txt``), by
  ``legato.cost.link_fit.fit_collective_model``; ``tests/cost/test_cost_collectives.py``
  checks that they are that fit.
* Compute constants (``peak_fraction*``, ``gemm_half_dim``, ``attention_fraction``,
  ``memory_bw_fraction``, ``launch_s``): fitted by ``legato.cost.held_out.fit_constants``
  on every calibration row (the published runs, MosaicML's FSDP table, vTrain's sweep),
  minimising the mean over source tables of each table's mean error (every table weighs
  alike) from public priors (``held_out.FITTED``), rounded. What they are worth on data the fit did not see is the
  leave-one-source-out table in BENCHMARKS.md (``cost_model_accuracy.py --held-out``).
* ``kernel_overhead_s``: 0 for the GPU constants (a GPU's host cost is ``launch_s``, a
  floor under each pass, not an addition); ``legato calibrate`` measures it on a CPU host
  (``<stem>.calibration.json``), where ``launch_s`` is 0.
* The rest: counted or typical values, stated at each field.

``load_calibration`` reads such constants back: a JSON object of ``Calibration`` fields
(those missing keep ``CALIBRATION``'s values), or a ``legato calibrate`` side file whose
``"calibration"`` entry is that object; ``side_path`` names the side file of a cluster
file, ``calibration_beside`` loads it when it is there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from legato.errors import ConfigError
from legato.specs.typed import from_dict, read_table_file, to_dict


@dataclass(frozen=True)
class Calibration:
    """Constants of the compute, collective and memory models.

    Compute: a GEMM of shape (M, N, K) reaches ``peak * fraction / (1 + d0/M + d0/N +
    d0/K)`` FLOP/s, capped by its roofline over ``memory_bw_fraction`` of the memory
    bandwidth. ``peak_fraction`` is what GEMMs sustain in training of the datasheet peak;
    it differs by device generation (``peak_fraction_by_device``, matched by the start of
    the device name; default ``peak_fraction``).

    Collectives: ``base_latency_us + steps * latency_scale * link.latency_us +
    wire_bytes / (bandwidth_fraction * link.bandwidth)``; a kind in
    ``collective_fits`` uses its own latency and bandwidth instead of the link's.
    """

    # A100 class: 0.73 of 312 TFLOP/s (228) sustained in training; fitted (public cuBLAS
    # peaks are 85-90% for isolated large GEMMs; clocks drop under sustained load).
    peak_fraction: float = 0.73
    # H100 SXM: 0.70 of 989 TFLOP/s (~690; public sustained figures 650-750); fitted on the
    # Llama 3 rows, the only H100 data.
    peak_fraction_by_device: tuple[tuple[str, float], ...] = (
        ("h100", 0.70),
        ("h200", 0.70),
        ("h800", 0.70),
    )
    # A GEMM with one dimension this small (the others large) runs at half the rate (tile
    # quantisation, too few tiles to fill the device); fitted. Below the prior 32: once the
    # host's issue rate (``launch_s``) bounds small passes, less is left for shapes to explain.
    gemm_half_dim: float = 23.0
    # Fused attention's forward runs at this share of the GEMM rate; its backward takes
    # 2.5x the forward (5 matmuls instead of 2). Fitted (FlashAttention-2 reports 50-70% of
    # A100 peak forward, less backward).
    attention_fraction: float = 0.42
    # An FP8 GEMM reaches this share of the bf16 GEMM's efficiency (of its own 2x peak):
    # public H100 cuBLAS figures put large FP8 GEMMs at 1.5-1.6x bf16, and tile-wise
    # scaling promotes partial sums to FP32 every 128 elements. Not fitted: no calibration
    # row trained in FP8.
    fp8_gemm_share: float = 0.8
    # Streaming kernels (norms, activations, softmax, optimizer) reach this share of the
    # datasheet memory bandwidth; fitted (STREAM-like copies reach 80-90% on A100/H100,
    # short or strided kernels less).
    memory_bw_fraction: float = 0.78
    # Collective model, fitted on the NCCL measurements (per-step latency held at the
    # link's nominal value: sizes of 1 MB and up cannot separate it from the base).
    base_latency_us: float = 46.6
    latency_scale: float = 1.0
    bandwidth_fraction: float = 0.714
    # Bytes moved per parameter by an Adam step: read fp32 master, grad, m, v; write master,
    # m, v and the low-precision copy; gradient zeroing and norm (counted).
    optimizer_bytes_per_param: float = 40.0
    # CUDA context, allocator fragmentation and workspaces: PyTorch on 80 GB GPUs typically
    # keeps 2-4 GiB beyond what tensors need.
    framework_gib: float = 3.0
    # Seconds every eager kernel costs beyond its bytes and FLOPs (dispatch, and on a CPU
    # the fork/join of its threads), times ``runtime.kernels_per_pass``. 0 here: GPU launch
    # costs hide behind the queue and the fitted efficiencies above absorb the rest.
    kernel_overhead_s: float = 0.0
    # Host seconds to issue one kernel on a GPU (Python, dispatcher, autograd, the
    # launch): a pass takes at least its kernels times this, as the device waits for a
    # host that cannot run ahead (small models, high tp). Fitted: vTrain's small GPTs take
    # as long per micro-batch at tp=4 as at tp=1, which only a host-bound pass explains.
    launch_s: float = 37e-6
    # (kind, latency_us per ring step, bandwidth_gbps) fitted per collective kind on a host
    # ``legato calibrate`` measured; they replace the link's figures for that kind. Gloo
    # implements each kind its own way (a 4 KiB all-reduce of 2 processes takes ~2 ms, an
    # all-to-all ~0.3 ms), so one fit for every kind is ~60% off. Empty: the link's.
    collective_fits: tuple[tuple[str, float, float], ...] = ()

    def gemm_peak_fraction(self, device_name: str) -> float:
        name = device_name.lower()
        for prefix, fraction in self.peak_fraction_by_device:
            if name.startswith(prefix):
                return fraction
        return self.peak_fraction


CALIBRATION = Calibration()


def load_calibration(path: str | Path) -> Calibration:
    """The constants in JSON file ``path`` over ``CALIBRATION``'s (lists become tuples);
    ConfigError (one line, naming the key) for an unknown field or a bad value."""
    data = read_table_file(path, ConfigError)
    if "calibration" in data:  # a ``legato calibrate`` side file: a CPU host's measurements
        data = data["calibration"]
        if isinstance(data, dict):  # files written before launch_s existed meant none
            data = {"launch_s": 0.0, **data}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: calibration must be a JSON object of Calibration fields")
    where = f"{path}: calibration"
    merged = {**to_dict(CALIBRATION), **data}
    # rows of (name, numbers...): typed apart
    by_device = merged.pop("peak_fraction_by_device")
    fits = merged.pop("collective_fits")
    calibration = from_dict(Calibration, merged, where, ConfigError)
    return replace(
        calibration,
        peak_fraction_by_device=_rows(by_device, f"{where}.peak_fraction_by_device",
                                      "[device prefix, fraction]"),
        collective_fits=_rows(fits, f"{where}.collective_fits",
                              "[kind, latency_us, bandwidth_gbps]"),
    )  # fmt: skip


def _rows(value: object, where: str, shape: str) -> tuple[tuple, ...]:
    """A list of ``[name, number, ...]`` rows of ``shape``'s length as tuples."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: expected a list of {shape} rows")
    arity = shape.count(",") + 1
    rows = []
    for i, row in enumerate(value):
        ok = isinstance(row, (list, tuple)) and len(row) == arity and isinstance(row[0], str)
        numbers = row[1:] if ok else []
        if not ok or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in numbers):
            raise ConfigError(f"{where}[{i}]: expected {shape}, got {row!r}")
        rows.append((row[0], *(float(x) for x in numbers)))
    return tuple(rows)


SIDE_SUFFIX = ".calibration.json"


def side_path(cluster_file: str | Path) -> Path:
    """Where ``legato calibrate`` puts the measurements and constants of ``cluster_file``."""
    path = Path(cluster_file)
    return path.with_name(path.stem + SIDE_SUFFIX)


def calibration_beside(cluster_file: str | Path) -> Calibration | None:
    """The constants ``legato calibrate`` wrote beside ``cluster_file``, or None when it is
    not such a file (a preset name, a file without a side file)."""
    path = Path(cluster_file)
    side = side_path(path)
    if not (path.suffix == ".toml" and path.is_file() and side.is_file()):
        return None
    return load_calibration(side)
