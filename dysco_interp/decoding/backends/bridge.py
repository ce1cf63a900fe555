"""The "bridge" backend: the TransformerBridge with plain TransformerLens hooks.

Eager attention, one prompt at a time: the reference the fast backends are tested against,
and the backend analyses hook into. The method's hooks are those of `decoding/interventions.py`;
the user's hooks run after them on every pass, the prefill included (which then goes through
the bridge instead of the SDPA twin), and each pass is announced to `passes.current_pass()`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dysco_interp.decoding import runtime
from dysco_interp.decoding.backends.base import Backend, DecodeState, SelectBias, StepOutput
from dysco_interp.decoding.interventions import AttentionTemperature, BiasWriter, RelevanceReader
from dysco_interp.decoding.passes import running
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import Hook, act_name
from dysco_interp.models import LoadedModel


class BridgeBackend(Backend):
    """The TransformerBridge with TL hooks (eager attention), one row at a time."""

    name = "bridge"
    max_batch = 1
    runs_hooks = True

    def __init__(self, model: LoadedModel, heads: HeadSet | None, *, tau: float = 1.0, graphs: bool | None = None,
                 hooks: Sequence[Hook] = ()):
        super().__init__(model, heads, tau=tau, graphs=graphs, hooks=hooks)
        self.reader = RelevanceReader(heads, model.spec) if heads is not None else None
        self.writer = BiasWriter(model.spec)
        self.temperature: list[Hook] = AttentionTemperature(model.spec, tau).hooks() if tau != 1.0 else []

    @property
    def all_layers(self) -> range:
        return range(self.model.spec.n_layers)

    def _reader(self, n_keys: int) -> RelevanceReader:
        self.needs_heads()
        assert self.reader is not None
        self.reader.set_length(n_keys)
        return self.reader

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None, *, chunk_size: int | None = None,
                reserve: int = 0) -> DecodeState:
        if ids.shape[0] != 1 or valid is not None:
            raise ConfigError("the bridge backend decodes one prompt at a time; "
                              "use backend='sdpa' or 'static' for batches")
        # with no hooks at all, runtime.prefill takes the SDPA twin (no n x n score matrix)
        with running("prefill", 0, ids.shape[1], self.all_layers):
            cache, _ = runtime.prefill(self.model, ids, chunk_size=runtime.chunk_or_default(chunk_size),
                                       hooks=self.temperature + self.user_hooks)
        return DecodeState(cache, ids.shape[1])

    def step(self, state: DecodeState, tokens: torch.Tensor, *, bias: torch.Tensor | None = None,
             read: bool = False) -> StepOutput:
        self.check_step(bias, read)
        hooks = list(self.temperature)
        reader = self._reader(state.n_keys + 1) if read else None
        if reader is not None:
            hooks += reader.hooks()
        if bias is not None:
            self.writer.set_bias(bias)
            hooks += self.writer.hooks()
        with running("plain" if bias is None else "biased", state.n_keys, 1, self.all_layers):
            logits = runtime.step(self.model, state.cache, tokens[:, None], hooks + self.user_hooks)
        state.advance()
        return StepOutput(logits, None if reader is None else reader.attention(self.model.device))

    def partial(self, state: DecodeState, tokens: torch.Tensor) -> StepOutput:
        reader = self._reader(state.n_keys + 1)
        stop = reader.max_layer + 1
        with running("partial", state.n_keys, 1, range(stop)):
            runtime.partial_step(self.model, state.cache, tokens[:, None], stop, reader.hooks() + self.user_hooks)
        return StepOutput(attention=reader.attention(self.model.device))

    def reuse_step(self, state: DecodeState, tokens: torch.Tensor, select_bias: SelectBias) -> StepOutput:
        reader = self._reader(state.n_keys + 1)
        after = reader.max_layer + 1
        n_layers = self.model.spec.n_layers
        writer = BiasWriter(self.model.spec, layers=range(after, n_layers))
        read: list[torch.Tensor] = []

        def select(resid, hook):
            read.append(reader.attention(self.model.device))
            writer.set_bias(select_bias(read[0]))

        hooks = list(self.temperature) + reader.hooks() + writer.hooks()
        if after < n_layers:
            hooks.append((act_name(after, "hook_in"), select))
        with running("reuse", state.n_keys, 1, self.all_layers):
            logits = runtime.step(self.model, state.cache, tokens[:, None], hooks + self.user_hooks)
        if after == n_layers:  # the deepest QRHead is in the last layer: nothing left to bias
            read.append(reader.attention(self.model.device))
            select_bias(read[0])
        state.advance()
        return StepOutput(logits, read[0])
