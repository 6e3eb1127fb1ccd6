import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dnn-partitioning"


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
    """The shared profiled workloads; skipped where absent, but a failure under CI (where they must be)."""
    if not SHARED.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{SHARED} is missing under CI, where shared/ is always beside the clone")
        pytest.skip(f"{SHARED} not present")
    return SHARED
