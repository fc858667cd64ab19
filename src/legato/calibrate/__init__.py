"""Measure the machine: ``legato calibrate``'s GEMM, memory, attention and collective
timings of this host (``host.calibrate``), the cluster file written from them
(``cluster_file``), and the device peak behind the trainer's MFU (``device_peak``).

What is measured lives here (torch, torch.distributed); the laws fitted to it are the
cost model's and live, torch-free, in ``cost.gemm_fit`` and ``cost.link_fit``.
"""
