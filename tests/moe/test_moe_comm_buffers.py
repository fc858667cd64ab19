"""An asynchronous all-to-all keeps what it sends alive until it is waited on.

On the CPU gloo reads the send buffer on its own thread after ``issue`` returns; a
temporary (``contiguous()`` of a strided tensor, a gradient autograd frees) would go back to
the allocator and be overwritten while still being sent (NaNs in Comet's output under
load, once, in the GPU-readiness dry run)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys, torch, torch.distributed as dist
from legato.moe.comm import Transfer
dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
try:
    for _ in range(50):
        source = torch.randn(64, 4096).t()  # strided: issue sends a contiguous copy
        transfer = Transfer([4096], [4096], dist.group.WORLD)
        out = transfer.issue(source, [4096], [4096])
        assert transfer.sending is not None and transfer.sending.is_contiguous()
        sent = transfer.sending.data_ptr()
        junk = [torch.full((4096, 64), float("nan")) for _ in range(8)]  # reuse freed memory
        assert all(j.data_ptr() != sent for j in junk)
        transfer.wait()
        assert transfer.sending is None
        assert torch.equal(out, source.contiguous())
    print("ok")
finally:
    dist.destroy_process_group()
"""


def test_the_send_buffer_lives_until_the_wait_and_arrives_intact(tmp_path) -> None:
    store = tmp_path / "store"  # the file store gloo meets in; pytest removes it
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(store)], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
