"""`LoadedModel`: a model ready for interpretability work and DySCO decoding (the
TransformerLens bridge, an SDPA twin sharing its weight tensors, the tokenizer, the spec and
the weights identity), and `from_hf`, which builds one from an HF causal LM."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from dysco_interp.errors import ContextLengthError
from dysco_interp.models.identity import WeightsId, in_memory_weights_id, model_fingerprint
from dysco_interp.models.packing import pack_projections
from dysco_interp.models.placement import Placement, parse_devices, place, place_like
from dysco_interp.models.spec import ModelSpec

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PretrainedConfig, PreTrainedTokenizerBase


@dataclass(eq=False)
class LoadedModel:
    """A model ready for interpretability work and for DySCO decoding."""

    bridge: TransformerBridge  # eager attention, hook points
    tokenizer: PreTrainedTokenizerBase
    spec: ModelSpec
    prefill_model: torch.nn.Module  # SDPA twin sharing the bridge's weight tensors
    source: str
    _reference_factory: Callable[[str], torch.nn.Module] = field(repr=False)
    # the identity, or how to compute it on first use; None: from the weights in memory
    _weights_id: WeightsId = field(default=None, repr=False)
    # which device runs each layer; one device unless split (`load_model(..., devices=)`)
    placement: Placement | None = field(default=None, repr=False)
    _fingerprint: str | None = field(default=None, init=False, repr=False)

    def __repr__(self) -> str:
        # One line, TransformerLens-style: the dataclass default prints the whole module tree.
        s = self.spec
        dtype = str(self.dtype).removeprefix("torch.")
        where = ", ".join(map(str, self.layout.devices))
        return (
            f"LoadedModel({s.name!r}, {s.architecture}, {s.n_layers} layers x {s.n_heads} heads "
            f"({s.n_kv_heads} kv), {dtype}, {where}, context {s.context_length})"
        )

    @property
    def weights_id(self) -> str:
        """What the model computes, as a string to store beside every result.

        Two models with the same `weights_id` give the same outputs at the same dtype and
        device (record those separately). It covers the weights, the tokenizer and the
        settings that change outputs at fixed weights (YaRN):
        - packaged alias: ``gguf-sha256:<hex>``, the recorded hash of its GGUF (no rehash);
        - local folder: ``files-sha256:<hex>`` over the names, sizes and SHA-256 of its files
          (weights, config, tokenizer; README/licence files and hidden files excepted), each
          file's hash cached by (path, size, mtime) in the cache folder, so a 6.7 GB folder
          is hashed once (about 20 s), on first use of this property; a folder loaded
          from its .gguf file: ``gguf-sha256:<hex>`` of that file, as for a packaged alias;
        - hub model: ``hf:<repo>@<commit>`` of the snapshot it was loaded from;
        - tiny and in-memory models: ``state-sha256:<hex>`` over the state dict (names, dtypes,
          shapes, bytes), the config (rope scaling included) and the tokenizer's vocabulary.
        `load_model(..., yarn_factor=f)` appends ``;yarn=f`` to the first three.
        """
        if not isinstance(self._weights_id, str):
            compute = self._weights_id or (lambda: in_memory_weights_id(self.prefill_model, self.tokenizer))
            self._weights_id = compute()
        return self._weights_id

    @property
    def weights_fingerprint(self) -> str:
        """``weights-fp:<hex>``: the same for every load of the same weights (a registry alias,
        its converted folder or a copy of it, a tiny model saved with `save_pretrained`), at any
        dtype or YaRN factor; a head file made for a model is accepted by the same weights under
        another name (`HeadSet.validate_for`). Read from the ends of every weight tensor."""
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self.prefill_model)
        return self._fingerprint

    @property
    def layout(self) -> Placement:
        """Which device runs each layer: `placement`, or every layer on `device`."""
        return self.placement or Placement.single(self.device, self.spec.n_layers)

    @property
    def device(self) -> torch.device:
        """Where inputs go and outputs come back: the embedding's device (the first of a split)."""
        # read at every decoding step: the embedding directly, not a walk over the modules
        return self.prefill_model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.prefill_model.parameters()).dtype

    @property
    def hf_config(self) -> PretrainedConfig:
        return self.prefill_model.config

    @property
    def eos_token_ids(self) -> frozenset[int]:
        ids = set()
        gen_eos = getattr(getattr(self.prefill_model, "generation_config", None), "eos_token_id", None)
        for value in (gen_eos, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif value is not None:
                ids.update(int(v) for v in value)
        return frozenset(ids)

    def load_reference_hf(self, attn_implementation: str = "eager") -> torch.nn.Module:
        """A separately loaded HF model with the same weights (the bridge mutates its own)."""
        return self._reference_factory(attn_implementation)

    def check_fits(self, n_prompt: int, n_new: int = 0) -> None:
        """ContextLengthError unless n_prompt + n_new tokens fit the model's context."""
        if n_prompt + n_new > self.spec.context_length:
            raise ContextLengthError(
                f"prompt of {n_prompt} tokens plus {n_new} new tokens exceeds the context of "
                f"{self.spec.name} ({self.spec.context_length} tokens)"
            )


def _model_from_config(config: PretrainedConfig, attn_implementation: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    # A config object of its own: from_config and the bridge set the attention backend on it.
    return AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=attn_implementation)


def share_weights_twin(hf_model: torch.nn.Module, attn_implementation: str) -> torch.nn.Module:
    """A second HF model object whose parameters and buffers are the same tensors."""
    with torch.device("meta"):
        twin = _model_from_config(hf_model.config, attn_implementation)
    twin.load_state_dict(hf_model.state_dict(), assign=True, strict=True)
    # Non-persistent buffers (rotary frequencies) are not in the state dict.
    for name, buf in hf_model.named_buffers():
        module_name, _, attr = name.rpartition(".")
        twin.get_submodule(module_name)._buffers[attr] = buf
    if hasattr(hf_model, "generation_config"):
        twin.generation_config = hf_model.generation_config
    place_like(twin, hf_model)
    return twin.eval()


def split(model: LoadedModel, devices: str | Sequence[str | torch.device]) -> LoadedModel:
    """`model`'s weights moved to `devices` (e.g. "cuda:0,cuda:1"), layers split evenly
    (`Placement.even`), as a new `LoadedModel` with the same identity; `model` itself must not
    be used afterwards (its bridge keeps the weights where they were). `load_model(...,
    devices=)` is the usual way in."""
    placement = Placement.even(parse_devices(devices), model.spec.n_layers)
    hf = model.prefill_model
    place(hf, placement)

    def reference_factory(attn_implementation: str) -> torch.nn.Module:
        ref = model.load_reference_hf(attn_implementation)
        place(ref, placement)
        return ref

    return from_hf(hf, model.tokenizer, model.spec.name, source=model.source, reference_factory=reference_factory,
                   weights_id=model._weights_id, placement=placement)


def from_hf(
    hf_model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    name: str,
    *,
    source: str = "<in memory>",
    reference_factory: Callable[[str], torch.nn.Module] | None = None,
    weights_id: WeightsId = None,
    placement: Placement | None = None,
) -> LoadedModel:
    """Wrap an HF causal LM (already on its device and dtype) as a `LoadedModel`.

    Args:
        hf_model: the model, loaded with SDPA attention; it becomes `prefill_model`, and the
            bridge wraps an eager twin of it that shares every weight tensor. Each decoder
            layer's query, key and value projections, and its gate and up projections, are
            packed into one tensor first, the modules' parameters becoming views of it
            (`models.packing`): the values are unchanged and nothing is copied.
        tokenizer: its tokenizer.
        name: the name recorded in the spec.
        source: where it came from (a folder or hub id), for `LoadedModel.source`.
        reference_factory: builds a separate copy for `load_reference_hf`; by default the
            weights in memory are cloned into a model built from the config.
        weights_id: a string, or a function computing it on first use; None hashes the model
            in memory (see `LoadedModel.weights_id`).
        placement: how `hf_model`'s layers are split over devices, when they are (it must
            already be placed there: `placement.place` or `split`).

    Returns:
        The `LoadedModel`.
    """
    from transformer_lens.model_bridge import TransformerBridge

    if not hf_model.config.architectures:
        hf_model.config.architectures = [type(hf_model).__name__]
    hf_model.eval()
    pack_projections(getattr(getattr(hf_model, "model", None), "layers", ()))  # before any twin shares them
    prefill_model = hf_model
    eager = share_weights_twin(hf_model, "eager")
    param = next(hf_model.parameters())
    bridge = TransformerBridge.boot_transformers(
        name, hf_model=eager, tokenizer=tokenizer, device=param.device, dtype=param.dtype
    )
    bridge.eval()
    if reference_factory is None:

        def reference_factory(attn_implementation: str) -> torch.nn.Module:
            ref = _model_from_config(hf_model.config, attn_implementation)
            ref.load_state_dict({k: v.clone() for k, v in prefill_model.state_dict().items()})
            ref.to(dtype=param.dtype)
            place(ref, placement or Placement.single(param.device, hf_model.config.num_hidden_layers))
            return ref.eval()

    spec = ModelSpec.from_hf_config(name, hf_model.config, getattr(tokenizer, "chat_template", None))
    return LoadedModel(bridge, tokenizer, spec, prefill_model, source, reference_factory, weights_id, placement)
