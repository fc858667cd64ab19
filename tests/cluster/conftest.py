from __future__ import annotations

import pytest

from legato.cluster.workloads import load_workloads


@pytest.fixture(scope="session")
def workloads():
    """The bundled Gavel V100 table and Pollux profiles."""
    return load_workloads()
