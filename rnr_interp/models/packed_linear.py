"""Linear layers on prepacked weights for inference on a CPU.

Why it exists: on a CPU the linear layers are most of a decoding step (65-80% in the
profiles in the README), and a step multiplies a few rows by every weight matrix. oneDNN
runs that product faster on a copy of the weight reordered once into its kernel's
blocked layout than MKL does on the plain row-major weight: on the demo model, one
thread, the 210 block linears took 133 ms against 172 ms at 64 rows and 74 against 103
at 32, and the engine's quick sampling case ran 1.21x faster (README, engines). This is
what PyTorch's own compiler does for frozen CPU models (weight prepacking), done here
for the eager modules the bridge calls.

The rule: an `nn.Linear` made a `PackedLinear` by `install` computes exactly what it
computed before, up to float32 rounding (another summation order: outputs differ by
about 3e-6 of their size), on the oneDNN path only when the call is inference on a CPU
in float32 (no gradient recorded). Anything else (training, another dtype or device, an
empty input) takes `F.linear` as before. The packed copy is made on the first such call
and made again whenever the weight changes (in place, replaced, or its storage swapped),
so edited weights are never stale; it is dropped on a training call. Hooks are
untouched: TransformerLens's sit on the bridge around the module, and torch hooks on the
module itself still run around `forward`.

`RNR_LINEAR=dense` keeps the plain path everywhere (to compare against, or to reproduce
earlier runs' float rounding exactly).
"""

from __future__ import annotations

import os

import torch
from jaxtyping import Float
from torch import Tensor, nn
from torch.nn import functional as F

#: the row count the reorder is tuned for (a decoding step's rows; any count works)
PACK_ROWS = 64


def available() -> bool:
    """Whether this torch has oneDNN's prepacked linear, and `RNR_LINEAR` allows it."""
    if os.environ.get("RNR_LINEAR", "").strip().lower() == "dense":
        return False
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class PackedLinear(nn.Linear):
    """`nn.Linear` with a prepacked inference path (see the module docstring). Only
    `install` makes one, by swapping the class of an existing layer."""

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        w = self.weight
        if (torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32
                or w.dtype != torch.float32 or not x.numel()):
            self.__dict__.pop("_packed", None)  # training: the copy would only go stale
            return F.linear(x, w, self.bias)
        key = (id(w), w.data_ptr(), w._version)
        packed = self.__dict__.get("_packed")
        if packed is None or packed[0] != key:
            # Kept out of parameters and buffers: no state dict, no `.to()`, no optimiser sees it.
            packed = (key, torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS))
            self.__dict__["_packed"] = packed
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed[1], self.bias, "none", [], "")
        return y.view(*x.shape[:-1], y.shape[-1])

    def __getstate__(self):
        # The packed copy is an opaque oneDNN tensor: it cannot be copied or pickled,
        # and a copy of the layer makes its own on first use.
        state = dict(super().__getstate__())
        state.pop("_packed", None)
        return state


def install(model: nn.Module) -> int:
    """Give every plain `nn.Linear` of `model` on a CPU the packed path; returns how many
    (0 where `available()` says no)."""
    if not available():
        return 0
    swapped = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.device.type == "cpu":
            module.__class__ = PackedLinear
            swapped += 1
    return swapped


def uninstall(model: nn.Module) -> None:
    """Back to plain `nn.Linear` everywhere (for comparisons and tests)."""
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__dict__.pop("_packed", None)
            module.__class__ = nn.Linear
