"""A new backend is a `prefill`, a `run(state, tokens, plan)` and one registration: this file's
backend, written from plain TransformerLens hooks alone, runs every method, built-in or a user's,
and gives the bridge backend's tokens and selections."""

import pytest
import torch

from dysco_interp import DecodingConfig, generate_batch
from dysco_interp.decoding import runtime
from dysco_interp.decoding.backends import REGISTRY, Backend, BackendSpec, DecodeState, StepOutput, register_backend
from dysco_interp.decoding.config import with_flat
from dysco_interp.decoding.readout import read_outs
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import act_name, layer_of, pattern_name, scores_name

PROMPT = "You can travel from Paris to Berlin by train. Rome is quiet. " * 4 + "Give a route from Paris to Berlin."


class HookBackend(Backend):
    """Each pass through the bridge with hooks of its own: a plan's temperature on whole layers
    (UniAttnS's; this small backend refuses finer scales), one that reads the last query's pattern
    row of the read heads, one that adds the bias to the scores of the biased layers (and heads)."""

    name = "test-hooks"
    max_batch = 1

    @staticmethod
    def temperature(scale):
        if scale is None:
            return []
        if not scale.uniform:
            raise ConfigError("this backend scales whole layers by a temperature only")

        def divide(scores, hook):
            return scores / scale.temperature

        return [(scores_name(layer), divide) for layer in scale.layers]

    def prefill(self, ids, valid, *, chunk_size=None, reserve=0, scale=None):
        cache, _ = runtime.prefill(self.model, ids, hooks=self.temperature(self.prefill_scale(scale)))
        return DecodeState(cache, ids.shape[1])

    def run(self, state, tokens, plan):
        plan = self.checked(plan)
        n_keys, device = state.n_keys + 1, self.model.device
        rows: dict[int, torch.Tensor] = {}
        wanted = plan.read_heads()
        bias = {"now": self.given_bias(plan, 1, n_keys)}

        def read(pattern, hook):
            rows[layer_of(hook)] = pattern[:, list(wanted[layer_of(hook)]), -1, :].float()

        def add(scores, hook):
            heads = plan.bias.heads_in(layer_of(hook))
            out = scores.float().clone()
            out[:, slice(None) if heads is None else list(heads)] += bias["now"].to(out.device)
            return out

        def rule(resid, hook):
            bias["now"] = self.ruled_bias(plan, read_outs(plan, rows, n_keys, device, first_only=True)[0], 1, n_keys)

        hooks = self.temperature(plan.scale) + [(pattern_name(layer), read) for layer in wanted]
        if plan.bias is not None:
            hooks += [(scores_name(layer), add) for layer in plan.bias.layers]
            if plan.bias.source == "rule":
                hooks.append((act_name(plan.bias.layers[0], "hook_in"), rule))
        if plan.stop_after is not None:
            runtime.partial_step(self.model, state.cache, tokens[:, None], plan.stop_after + 1, hooks)
            logits = None
        else:
            cache = state.cache if plan.write_cache else runtime.FrozenCache(state.cache)
            logits = runtime.step(self.model, cache, tokens[:, None], hooks)
        if plan.write_cache:
            state.advance()
        return StepOutput(logits, read_outs(plan, rows, n_keys, device) if plan.reads else ())


def selections(result):
    return [(s.position, s.n_selected, s.selected) for s in result.trace.steps]


def test_a_backend_defined_here_runs_every_method_as_the_bridge_does(tiny_llama):
    register_backend(HookBackend)
    try:
        s = tiny_llama.spec
        heads = HeadSet([(1, 0), (2, 3)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads,
                        n_kv_heads=s.n_kv_heads)
        # one set of values for every method: each takes those it has
        configs = {m: with_flat(DecodingConfig(method=m, max_new_tokens=8, record_positions=True),
                                {"beta": 4.0, "top_p": 0.7, "tau": 0.5})
                   for m in ("vanilla", "uniattns", "dysco", "dysco-static", "dysco-random", "dysco-reuse")}
        ours = generate_batch(tiny_llama, [PROMPT], configs, heads, backend=BackendSpec(HookBackend.name))
        ref = generate_batch(tiny_llama, [PROMPT], configs, heads, backend="bridge")
        for name in configs:
            assert ours[name][0].tokens == ref[name][0].tokens, name
            assert selections(ours[name][0]) == selections(ref[name][0]), name
        with pytest.raises(ConfigError, match="already registered"):
            register_backend(type("Other", (HookBackend,), {"name": "sdpa"}))
    finally:
        REGISTRY.pop(HookBackend.name, None)
