"""What a run and an export write has the modes the umask gives (0644/0755 under 022),
not ``tempfile``'s 0600/0700: an exported model or a run folder can be shared as it is."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from legato.atomic import make_temp_dir, write_text_atomic
from legato.cli.main import main


@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The process umask set to the test's parameter (0o022 by default), then restored."""
    mask = getattr(request, "param", 0o022)
    before = os.umask(mask)
    try:
        yield mask
    finally:
        os.umask(before)


def _modes(root: Path) -> dict[str, int]:
    """``{relative path: permission bits}`` of ``root``'s tree, ``root`` itself included."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.stat().st_mode)
    return found


@pytest.mark.parametrize("umask", [0o022, 0o027], indirect=True)
def test_atomic_writes_get_the_umask_modes(umask: int, tmp_path: Path) -> None:
    file = write_text_atomic(tmp_path / "a" / "file.json", "{}")
    folder = make_temp_dir(tmp_path / "a" / "folder")
    assert stat.S_IMODE(file.stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask
    assert folder.parent == file.parent and folder.name.startswith(".folder.")


def test_a_run_and_its_export_are_shareable(umask: int, small_train_args, tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "exported"
    args = small_train_args(run, "--parallel.nproc=1", "--train.steps=2", "--checkpoint.every=1")
    assert main(["train", *args]) == 0
    assert main(["export", str(run), str(out)]) == 0
    for root in (run, out):
        modes = _modes(root)
        wrong = {
            name: oct(mode)
            for name, mode in modes.items()
            if mode != (0o755 if (root / name).is_dir() else 0o644)
        }
        assert not wrong, f"{root}: {wrong}"
    assert "checkpoints/step_000002/meta.json" in _modes(run)
    assert "model.safetensors" in _modes(out)
