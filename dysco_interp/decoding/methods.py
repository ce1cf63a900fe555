"""The decoding methods as strategy objects, chosen once from a `DecodingConfig`.

A method decides what one decoding step does on a backend: vanilla and UniAttnS run the plain
pass; DySCO runs the partial pass, updates relevance, selects and runs the biased pass; its
ablations change one piece (a set selected once, random heads, one pass per token). The running
relevance and the selection live in a `Selector`, the pure math in `relevance.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from dysco_interp.decoding import relevance
from dysco_interp.decoding.backends.base import Backend, DecodeState
from dysco_interp.decoding.choices import METHOD_NAMES
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, random_like
from dysco_interp.models import LoadedModel

if TYPE_CHECKING:
    from dysco_interp.decoding.config import DecodingConfig

SELECTION_FIELDS = frozenset({"beta", "top_p", "top_k", "top_k_fraction", "decay", "template_masking", "schedule"})


class Selector:
    """Each row's running relevance over key positions, and the selection made from it.

    `caps`: long `[B]`, each row's own key cap (`top_k_fraction`), or None for `top_k`.
    """

    def __init__(self, config: DecodingConfig, excluded: torch.Tensor, caps: torch.Tensor | None = None):
        self.config = config
        self.excluded = excluded  # bool [B, capacity]: keys never selected (pads, template tokens)
        self.top_k: int | torch.Tensor = config.top_k if caps is None else caps.to(excluded.device)
        self.relevance: torch.Tensor | None = None  # float32 [B, n_keys], rows sum to 1
        self.last: relevance.Selection | None = None  # the latest selection

    def update(self, attention: torch.Tensor) -> None:
        self.relevance = relevance.update_relevance(attention, self.relevance, self.config.decay)

    def select(self, n_keys: int) -> relevance.Selection:
        """Nucleus-then-K selection; excluded keys are never selected."""
        if self.relevance is None:
            raise RuntimeError("no relevance yet: update() with an attention read first")
        self.last = relevance.select_keys(self.relevance, self.config.top_p, self.top_k, self.excluded[:, :n_keys])
        return self.last

    def bias(self, mask: torch.Tensor) -> torch.Tensor:
        return relevance.scaling_bias(mask, self.config.beta)


class Method:
    """Vanilla decoding: no intervention. Subclasses override what they change."""

    name: ClassVar[str] = "vanilla"
    description: ClassVar[str] = "no intervention (equals plain decoding)"
    uses_heads: ClassVar[bool] = False  # reads the QRHeads (H*)
    fields: ClassVar[frozenset[str]] = frozenset()  # DecodingConfig fields beyond the shared ones it uses

    def __init__(self, config: DecodingConfig):
        self.config = config

    @property
    def temperature(self) -> float:
        """Attention temperature of every head, prefill included (1.0: none)."""
        return 1.0

    def heads(self, model: LoadedModel, heads: HeadSet | None) -> HeadSet | None:
        """The head set this method reads, checked against the model."""
        return None

    def step(self, backend: Backend, state: DecodeState, tokens: torch.Tensor,
             selector: Selector | None) -> tuple[torch.Tensor, relevance.Selection | None]:
        """One token per row through the model: (float32 logits, the selection applied or None)."""
        out = backend.step(state, tokens)
        assert out.logits is not None
        return out.logits, None


class UniAttnS(Method):
    name = "uniattns"
    description = "uniform attention temperature tau in every head and layer, prefill included"
    fields = frozenset({"tau"})

    @property
    def temperature(self) -> float:
        return self.config.tau


class Dysco(Method):
    name = "dysco"
    description = "dynamic attention scaling with the QRHeads"
    uses_heads = True
    fields = SELECTION_FIELDS

    def heads(self, model: LoadedModel, heads: HeadSet | None) -> HeadSet | None:
        if heads is None or len(heads) == 0:
            raise ConfigError(f"method {self.name!r} needs a non-empty head set (H*)")
        return heads.validate_for(model)  # the model, not its spec: its weights can match another name

    def step(self, backend, state, tokens, selector):
        assert selector is not None
        attention = backend.partial(state, tokens).attention
        assert attention is not None
        selector.update(attention)
        selection = selector.select(state.n_keys + 1)
        out = backend.step(state, tokens, bias=selector.bias(selection.mask))
        assert out.logits is not None
        return out.logits, selection


class DyscoStatic(Dysco):
    name = "dysco-static"
    description = "DySCO with the set selected once after the context warm-up, then kept"

    def __init__(self, config: DecodingConfig):
        super().__init__(config)
        self.kept: relevance.Selection | None = None

    def step(self, backend, state, tokens, selector):
        assert selector is not None
        if self.kept is None:
            if selector.relevance is None:  # no context warm-up: select from this token's partial pass
                attention = backend.partial(state, tokens).attention
                assert attention is not None
                selector.update(attention)
            assert selector.relevance is not None
            self.kept = selector.select(selector.relevance.shape[-1])
        mask = torch.nn.functional.pad(self.kept.mask, (0, state.n_keys + 1 - self.kept.mask.shape[-1]))
        out = backend.step(state, tokens, bias=selector.bias(mask))
        assert out.logits is not None
        return out.logits, self.kept


class DyscoRandom(Dysco):
    name = "dysco-random"
    description = "DySCO with |H*| random heads (seeded) instead of the QRHeads"
    fields = SELECTION_FIELDS | {"head_seed"}

    def heads(self, model, heads):
        checked = super().heads(model, heads)
        assert checked is not None
        return random_like(checked, model.spec, seed=self.config.head_seed)


class DyscoReuse(Dysco):
    name = "dysco-reuse"
    description = "DySCO in one pass per token: selection from layers 0..L*, bias only in the layers after L*"

    def step(self, backend, state, tokens, selector):
        assert selector is not None
        n_keys = state.n_keys + 1

        def select_bias(attention: torch.Tensor) -> torch.Tensor:
            selector.update(attention)
            return selector.bias(selector.select(n_keys).mask)

        out = backend.reuse_step(state, tokens, select_bias)
        assert out.logits is not None
        return out.logits, selector.last


REGISTRY: dict[str, type[Method]] = {
    cls.name: cls for cls in (Method, UniAttnS, Dysco, DyscoStatic, DyscoRandom, DyscoReuse)
}
assert tuple(REGISTRY) == METHOD_NAMES
METHODS: dict[str, str] = {name: cls.description for name, cls in REGISTRY.items()}
METHOD_FIELDS = frozenset().union(*(cls.fields for cls in REGISTRY.values()))


def method_for(config: DecodingConfig) -> Method:
    """The strategy of `config.method`, fresh for one run (some keep state across steps)."""
    return REGISTRY[config.method](config)
