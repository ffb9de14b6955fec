"""What every loader asks of weights read from a file it did not write: real, finite numbers."""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["check_finite_weights"]


def check_finite_weights(state: Mapping[str, torch.Tensor], where: str) -> None:
    """Refuse, by tensor name, weights a model cannot compute with: non-finite values (NaN, infinity) and integer,
    boolean or complex tensors where a model keeps real numbers. ``where`` names the file in the error."""
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        if not tensor.is_floating_point():
            raise ValueError(f"{where}: tensor {name} is {str(tensor.dtype).removeprefix('torch.')}, not floating "
                             "point; weights are real numbers")
        if not tensor.is_meta and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(f"{where}: tensor {name} has {bad} non-finite value(s) (NaN or infinity) of "
                             f"{tensor.numel()}; refusing weights no model can compute with")
