"""The "bridge" backend: the TransformerBridge with plain TransformerLens hooks.

Eager attention, one prompt at a time: the reference the fast backends are tested against,
and the backend analyses hook into. The method's hooks are those of `bridge_hooks.py`;
the user's hooks run after them on every pass, the prefill included (which then goes through
the bridge instead of the SDPA twin), and each pass is announced to `passes.current_pass()`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dysco_interp.decoding import runtime
from dysco_interp.decoding.backends.base import Backend, DecodeState, StepOutput
from dysco_interp.decoding.backends.bridge_hooks import BiasWriter, LogitScale, RelevanceReader
from dysco_interp.decoding.passes import running
from dysco_interp.decoding.plan import PassPlan, Scale, keep_mask
from dysco_interp.decoding.readout import read_outs
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import Hook, act_name
from dysco_interp.models import LoadedModel


class BridgeBackend(Backend):
    """The TransformerBridge with TL hooks (eager attention), one row at a time."""

    name = "bridge"
    max_batch = 1
    runs_hooks = True
    runs_keep = True

    def __init__(self, model: LoadedModel, *, graphs: bool | None = None, hooks: Sequence[Hook] = (),
                 tau: float | None = None):
        super().__init__(model, graphs=graphs, hooks=hooks, tau=tau)
        self.readers: dict[PassPlan, RelevanceReader] = {}  # one per plan structure that reads
        self.writers: dict[PassPlan, BiasWriter] = {}
        self.scales: dict[Scale, LogitScale] = {}
        self.keepers: dict[PassPlan, BiasWriter] = {}  # a keep, as the -inf on every key it does not name

    def _scale_hooks(self, scale: Scale | None, first: int) -> list[Hook]:
        """The hooks of `scale` for a forward whose first query sits at position `first`."""
        if scale is None:
            return []
        if scale not in self.scales:
            self.scales[scale] = LogitScale(self.model.spec, scale)
        return self.scales[scale].at(first).hooks()

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None, *, chunk_size: int | None = None,
                reserve: int = 0, scale: Scale | None = None) -> DecodeState:
        if ids.shape[0] != 1 or valid is not None:
            raise ConfigError("the bridge backend decodes one prompt at a time; "
                              "use backend='sdpa' or 'static' for batches")
        scale, chunk = self.prefill_scale(scale), runtime.chunk_or_default(chunk_size)
        cache = runtime.new_cache(self.model)
        # chunk by chunk here, so that a log-n scale knows where each chunk's queries sit; with no
        # hooks at all, runtime.prefill takes the SDPA twin (no n x n score matrix)
        with running("prefill", 0, ids.shape[1], range(self.model.spec.n_layers)):
            for start in range(0, ids.shape[1], chunk):
                runtime.prefill(self.model, ids[:, start:start + chunk], chunk_size=chunk, cache=cache,
                                hooks=self._scale_hooks(scale, start) + self.user_hooks)
        return DecodeState(cache, ids.shape[1])

    def _reader(self, plan: PassPlan, n_keys: int) -> RelevanceReader | None:
        if not plan.reads:
            return None
        if plan not in self.readers:
            pairs = [(layer, h) for layer, hs in plan.read_heads().items() for h in hs]
            # a read in a kept layer covers every key: its rows come from the scores before the keep's -inf
            self.readers[plan] = RelevanceReader(HeadSet(pairs), self.model.spec,
                                                 from_scores=plan.keep.layers if plan.keep is not None else ())
        reader = self.readers[plan]
        reader.set_length(n_keys)
        return reader

    def _writer(self, plan: PassPlan) -> BiasWriter | None:
        bias = plan.additive
        if bias is None:
            return None
        if plan not in self.writers:
            heads = None if bias.heads is None else {layer: bias.heads_in(layer) or () for layer in bias.layers}
            self.writers[plan] = BiasWriter(self.model.spec, layers=bias.layers, heads=heads)
        return self.writers[plan]

    def run(self, state: DecodeState, tokens: torch.Tensor, plan: PassPlan) -> StepOutput:
        plan = self.checked(plan)
        n_keys, batch = state.n_keys + 1, tokens.shape[0]
        reader, writer = self._reader(plan, n_keys), self._writer(plan)
        # the scale first: a bias is added to the scores the pass's temperature made
        hooks = self._scale_hooks(plan.scale, state.n_keys) + (reader.hooks() if reader is not None else [])
        if writer is not None:
            given = self.given_bias(plan, batch, n_keys)
            writer.set_bias(given)
            if given is None:  # a rule: the bias comes from this pass's read, before its first biased layer
                assert reader is not None

                def build(resid, hook):
                    [first] = read_outs(plan, reader.rows, n_keys, self.model.device, first_only=True)
                    writer.set_bias(self.ruled_bias(plan, first, batch, n_keys))

                assert plan.bias is not None
                hooks.append((act_name(plan.bias.layers[0], "hook_in"), build))
            hooks += writer.hooks()
        if reader is not None:
            hooks += reader.score_hooks()
        if plan.keep is not None:  # the reference: a -inf on every key outside the kept ones
            kept = self.given_keep(plan, batch, n_keys)
            assert kept is not None
            if plan not in self.keepers:
                self.keepers[plan] = BiasWriter(self.model.spec, layers=plan.keep.layers)
            keeper = self.keepers[plan]
            hidden = torch.zeros(batch, 1, 1, n_keys, device=kept[0].device)
            keeper.set_bias(hidden.masked_fill_(~keep_mask(*kept, n_keys)[:, None, None, :], -torch.inf))
            hooks += keeper.hooks()
        last = plan.last_layer(self.model.spec.n_layers)
        with running(plan.kind, state.n_keys, 1, range(last + 1)):
            if plan.stop_after is not None:
                runtime.partial_step(self.model, state.cache, tokens[:, None], last + 1, hooks + self.user_hooks)
                logits = None
            else:
                cache = state.cache if plan.write_cache else runtime.FrozenCache(state.cache)
                logits = runtime.step(self.model, cache, tokens[:, None], hooks + self.user_hooks)
        if plan.write_cache:
            state.advance()
        reads = read_outs(plan, reader.rows, n_keys, self.model.device) if reader is not None else ()
        return StepOutput(logits, reads)
