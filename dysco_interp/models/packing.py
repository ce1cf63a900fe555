"""Each decoder layer's query, key and value projections in one tensor, and its gate and up
projections in another, with the modules' parameters as views of them.

At batch 1 a decoding step reads every weight once, and a small matrix product reads its
weight at well under the copy bandwidth: on an H200, Qwen3-8B's key and value projections
(1024 x 4096 each) ran at about 40% of it, its query projection at 75%, and each product adds
a split-K reduction kernel. One product over the packed rows reads the same bytes in one
kernel. Packing moves the weights once, at load, and copies nothing: afterwards each module's
`weight` (and `bias`) is a slice of the packed tensor, so the bridge, the SDPA twin and every
other holder of those parameters see the same values in the same memory.

`packed` finds the packed tensor again from the parameters, and gives None when they are not
(or no longer) consecutive rows of one tensor: a model packed by nobody, or whose weights were
replaced or moved since. Its callers then run one product per projection, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

# group -> (the decoder layer's submodule, its projections packed together, in this order)
GROUPS = {"attention": ("self_attn", ("q_proj", "k_proj", "v_proj")), "mlp": ("mlp", ("gate_proj", "up_proj"))}


def projections(layer: torch.nn.Module, group: str) -> list[torch.nn.Linear] | None:
    """The layer's linear modules of `GROUPS[group]` (None: it has not all of them)."""
    owner_name, names = GROUPS[group]
    owner = getattr(layer, owner_name, None)
    found = [getattr(owner, name, None) for name in names]
    if all(isinstance(module, torch.nn.Linear) for module in found):
        return found
    return None


def packed(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The tensor whose rows are `tensors`' rows one after another, when they lie so in one
    storage (a view of it, nothing copied); None otherwise."""
    first = tensors[0]
    rows, at = 0, first.data_ptr()
    for t in tensors:
        if (not t.is_contiguous() or t.dtype != first.dtype or t.device != first.device
                or t.shape[1:] != first.shape[1:] or t.data_ptr() != at
                or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()):
            return None
        rows += t.shape[0]
        at += t.numel() * t.element_size()
    base = first.detach()
    return base.as_strided((rows, *first.shape[1:]), first.stride(), base.storage_offset())


def pack_group(modules: Sequence[torch.nn.Linear]) -> bool:
    """Pack the modules' weights (and biases, when all have one) into one tensor each; False when
    they cannot be (mixed dtypes or devices, weights on the meta device, some biases only)."""
    parts = [[m.weight for m in modules]]
    biases = [m.bias for m in modules]
    if any(b is not None for b in biases):
        if any(b is None for b in biases):
            return False
        parts.append(biases)
    for tensors in parts:
        first = tensors[0]
        if first.is_meta or any(t.dtype != first.dtype or t.device != first.device
                                or t.shape[1:] != first.shape[1:] for t in tensors):
            return False
    for tensors in parts:
        if packed(tensors) is not None:
            continue
        with torch.no_grad():
            whole = torch.cat([t.detach() for t in tensors])
            for t, rows in zip(tensors, whole.split([t.shape[0] for t in tensors])):
                t.data = rows
    return True


class Packed:
    """One group of a layer's projections as one product, when they are packed: `found()` gives
    the packed weight and bias (None when unpacked), looked up again only when a parameter's
    memory moved (the lookup it keeps holds the old memory, so a moved parameter never lands at
    a known address)."""

    def __init__(self, modules: Sequence[torch.nn.Linear]):
        self.modules = tuple(modules)
        self.sizes = [m.out_features for m in modules]
        self._key: tuple[int, ...] | None = None
        self._found: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def found(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if not self.modules:  # a layer without this group
            return None
        weights = [m.weight for m in self.modules]
        biases = [m.bias for m in self.modules if m.bias is not None]
        key = tuple(t.data_ptr() for t in (*weights, *biases))
        if key != self._key:
            weight = packed(weights)
            bias = packed(biases) if biases else None
            whole = weight is not None and (not biases or (len(biases) == len(weights) and bias is not None))
            self._key, self._found = key, (weight, bias) if whole else None
        return self._found


def pack_projections(layers: Iterable[torch.nn.Module]) -> int:
    """Pack every group of `GROUPS` that the layers have; returns how many groups were packed
    (or already were)."""
    done = 0
    for layer in layers:
        for group in GROUPS:
            modules = projections(layer, group)
            done += modules is not None and pack_group(modules)
    return done
