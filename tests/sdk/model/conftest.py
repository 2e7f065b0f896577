"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def f64():
    """float64 as torch's default dtype for one test (exact equalities), restored after."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
