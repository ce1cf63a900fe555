"""A model split over several devices by layers: which device runs each decoder layer.

The split is a pipeline without overlap: a pass runs the first device's layers, hands the
residual stream to the next device, and so on, so it needs the memory of all the devices
and takes the time of all their layers. The embedding goes with the first layers; the final
norm and the unembedding with the last (an unembedding tied to the embedding stays with the
embedding: one tensor cannot live on two devices).

HF forwards of a split model go through accelerate's dispatch hooks (`place`), the same
mechanism as transformers' `device_map`, which TransformerLens understands; each layer's
keys and values are cached on its device. The static backend's written-out decoder moves the
residual stream itself and captures one CUDA graph per device (`Placement.segments`).

The parts of a placement are counted by position, not by device, so a split over
("cpu", "cpu") runs every boundary of a two-device split on one machine: the CPU tests'
stand-in for two GPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dysco_interp.errors import ConfigError
from dysco_interp.models.devices import resolve_device

Segment = tuple[int, int, int]  # (part, first layer, one past the last layer)


@dataclass(frozen=True)
class Placement:
    """`devices[parts[layer]]` runs decoder layer `layer`; the embedding runs on `devices[0]`."""

    devices: tuple[torch.device, ...]
    parts: tuple[int, ...]  # layer -> index into devices, non-decreasing

    @classmethod
    def single(cls, device: torch.device, n_layers: int) -> "Placement":
        return cls((device,), (0,) * n_layers)

    @classmethod
    def even(cls, devices: Sequence[torch.device], n_layers: int) -> "Placement":
        """Layers in contiguous runs of equal size (the first devices take one more when they
        do not divide evenly)."""
        if len(devices) > n_layers:
            raise ConfigError(f"{len(devices)} devices for a model of {n_layers} layers: give at most one per layer")
        base, extra = divmod(n_layers, len(devices))
        parts = [part for part in range(len(devices)) for _ in range(base + (part < extra))]
        return cls(tuple(devices), tuple(parts))

    @property
    def split(self) -> bool:
        return len(self.devices) > 1

    @property
    def n_layers(self) -> int:
        return len(self.parts)

    def layer_device(self, layer: int) -> torch.device:
        return self.devices[self.parts[layer]]

    def segments(self, start: int = 0, stop: int | None = None) -> list[Segment]:
        """Layers start..stop-1 as runs on one part each, in order."""
        stop = self.n_layers if stop is None else stop
        runs: list[Segment] = []
        for layer in range(start, stop):
            part = self.parts[layer]
            if runs and runs[-1][0] == part:
                runs[-1] = (part, runs[-1][1], layer + 1)
            else:
                runs.append((part, layer, layer + 1))
        return runs

    def device_map(self, hf: torch.nn.Module) -> dict[str, str]:
        """The accelerate/transformers device map of `hf` (an HF causal LM of `n_layers` layers
        under `hf.model.layers`) for this placement."""
        first, last = str(self.devices[0]), str(self.devices[-1])
        tied = hf.get_output_embeddings() is not None and \
            hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
        mapping: dict[str, str] = {}
        for name, _ in hf.model.named_children():
            if name == "layers":
                mapping.update({f"model.layers.{i}": str(self.layer_device(i)) for i in range(self.n_layers)})
            else:
                mapping[f"model.{name}"] = last if name == "norm" else first
        for name, _ in hf.named_children():
            if name != "model":
                mapping[name] = first if tied else last
        return mapping


def parse_devices(devices: str | Sequence[str | torch.device]) -> tuple[torch.device, ...]:
    """"cuda:0,cuda:1" or a sequence of devices, each checked (`resolve_device`); at least two,
    all of one type."""
    items = [d.strip() for d in devices.split(",")] if isinstance(devices, str) else list(devices)
    resolved = tuple(resolve_device(d) for d in items if not isinstance(d, str) or d)
    if len(resolved) < 2:
        raise ConfigError(f"a split needs at least two devices, got {devices!r} (one device: device=, or --device)")
    if len({d.type for d in resolved}) > 1:
        raise ConfigError(f"a split runs on devices of one type (all cuda or all cpu), got {devices!r}")
    if resolved[0].type == "cuda":
        resolved = tuple(torch.device("cuda", torch.cuda.current_device() if d.index is None else d.index)
                         for d in resolved)
        if len(set(resolved)) < len(resolved):
            raise ConfigError(f"a GPU split names each GPU once, got {devices!r}")
        missing = [str(d) for d in resolved if d.index is not None and d.index >= torch.cuda.device_count()]
        if missing:
            raise ConfigError(f"no such GPU: {', '.join(missing)} (this machine has {torch.cuda.device_count()})")
    return resolved


def place(hf: torch.nn.Module, placement: Placement) -> None:
    """Move `hf`'s modules to the placement's devices and hook its HF forward so that each
    module runs on its own device (a no-op placement for one device: plain `.to`)."""
    if not placement.split:
        hf.to(placement.devices[0])
        return
    dispatch(hf, placement.device_map(hf))


def place_like(twin: torch.nn.Module, original: torch.nn.Module) -> None:
    """Give `twin` (sharing `original`'s tensors) the same dispatch hooks, when it is split."""
    device_map = getattr(original, "hf_device_map", None)
    if device_map:
        dispatch(twin, device_map)


def dispatch(hf: torch.nn.Module, device_map: dict[str, str]) -> None:
    from accelerate import dispatch_model

    # accelerate reads an all-"cpu" map as CPU offload and says so; here it is the CPU stand-in
    log = logging.getLogger("accelerate.big_modeling")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        # force_hooks: a split over one device twice still goes through the hooks
        dispatch_model(hf, device_map, skip_keys="past_key_values", force_hooks=True)
    finally:
        log.setLevel(level)


def materialize(hf: torch.nn.Module, placement: Placement) -> None:
    """Random weights for a model built on the meta device (at its dtype), each module made
    directly on its device, so a model too large for one device never exists whole on any;
    then placed."""
    for name, device in placement.device_map(hf).items():
        hf.get_submodule(name).to_empty(device=device)
    hf.init_weights()  # also recomputes the rotary frequencies that to_empty left unset
    place(hf, placement)
