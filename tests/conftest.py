import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dnn-partitioning"


def pytest_configure(config):
    # One torch thread in the suite and in the CLIs it starts: on a shared 2-core machine two threads
    # wait on each other at every small op (hp's contract took 138 s with two, 4 s with one)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    config.addinivalue_line("markers", "shared_data: reads the shared profiled workloads (the shared_data fixture)")


def pytest_collection_modifyitems(config, items):
    """Every test that takes the ``shared_data`` fixture is marked ``shared_data``, so a checkout
    without ``../shared`` runs the rest by choice: ``python -m pytest -m "not shared_data"``."""
    for item in items:
        if "shared_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.shared_data)


@pytest.fixture
def torch_one_thread():
    """One torch thread: deterministic reductions, and no oversubscription on a small shared machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def shared_data() -> Path:
    """The shared profiled workloads (external test inputs, DESIGN.md section 6), beside the clone.

    Where they are absent the tests that read them skip, everywhere alike (the project's rule for
    ``../shared``; no setting turns the skip into something else), and the skip says which folder is
    missing; ``-m "not shared_data"`` leaves them out on purpose."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent: these tests read the shared profiled workloads")
    return SHARED
