"""The demo's data set: a fixed synthetic regression problem that ships with the example.

Inputs are drawn from a seeded generator and targets come from a fixed random
two-layer teacher network plus a little noise, so every run (and every rank) sees
exactly the same data and the loss has a known floor.
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

__all__ = ["FEATURES", "make_dataset"]

FEATURES = 16


def make_dataset(samples: int = 4096, seed: int = 1234) -> TensorDataset:
    """Return ``samples`` (input, target) pairs, identical for a given seed."""
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, FEATURES, generator=gen)
    teacher_in = torch.randn(FEATURES, 32, generator=gen) / FEATURES**0.5
    teacher_out = torch.randn(32, 1, generator=gen) / 32**0.5
    targets = torch.tanh(inputs @ teacher_in) @ teacher_out
    targets += 0.01 * torch.randn(samples, 1, generator=gen)
    return TensorDataset(inputs, targets)
