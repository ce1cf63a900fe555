"""Attention replay: per generated token, how much attention each context span got.

For every generated token, the query is the position whose logits produced it (the last
prompt token for the first one). One teacher-forced pass over prompt + generated tokens
sums each such attention row over named token spans (Path Traversal edges, documents),
averaged over the QRHeads and over all heads. DySCO's selected positions for the same
steps, from the run's trace, become the fraction of each span's tokens that got log(beta).

The pass runs the unmodified model: for a DySCO run it shows what the model attends to
given the tokens DySCO wrote, not the rescaled attention of the run itself (whose cache
was written under the bias).

The span math (selection fractions, route steps, token pieces) is pure and separate from
the one model pass (`edge_attention.span_attention_by_layer`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from dysco_interp.analysis.edge_attention import span_attention_by_layer, span_attention_by_readout
from dysco_interp.decoding.backends import BackendSpec
from dysco_interp.decoding.readout import span_sums
from dysco_interp.errors import ConfigError
from dysco_interp.models import LoadedModel
from dysco_interp.tasks.path_traversal import ROUTE_CLOSE, PathTraversalInstance

Span = tuple[int, int]
Head = tuple[int, int]


# ---------------------------------------------------------------------------- pure span math


def named_spans(spans: Mapping[str, Span] | Sequence[Span]) -> tuple[list[str], list[Span]]:
    """(names, spans) from a name -> span mapping or a plain list (named by index)."""
    items = list(spans.items()) if isinstance(spans, Mapping) else [(str(i), s) for i, s in enumerate(spans)]
    if not items:
        raise ConfigError("no spans given")
    names, out = [], []
    for name, span in items:
        if len(span) != 2 or not 0 <= int(span[0]) < int(span[1]):
            raise ConfigError(f"span {name!r} = {tuple(span)} is not a non-empty half-open (start, end)")
        names.append(str(name))
        out.append((int(span[0]), int(span[1])))
    return names, out


def query_positions(n_prompt: int, n_generated: int) -> list[int]:
    """Position whose logits produced each generated token (generated token j sits at n_prompt + j)."""
    return list(range(n_prompt - 1, n_prompt + n_generated - 1))


def selection_per_token(trace, n_prompt: int, n_generated: int) -> list[list[int] | None] | None:
    """DySCO's selected positions at the step that produced each generated token.

    None when the run selected nothing at all (vanilla, UniAttnS); an entry is None when
    that token's step had no selection (e.g. a prompt without generation-prompt tokens).
    """
    if trace is None:
        return None
    by_position = {s.position: s for s in trace.steps}
    if all(s.n_selected is None for s in trace.steps):
        return None
    out: list[list[int] | None] = []
    for pos in query_positions(n_prompt, n_generated):
        step = by_position.get(pos)
        if step is None or step.n_selected is None:
            out.append(None)
        elif step.selected is None:
            raise ConfigError("the trace has no selected positions; run with DecodingConfig(record_positions=True)")
        else:
            out.append(list(step.selected))
    return out


def selected_fractions(selected: Sequence[Sequence[int] | None], spans: Sequence[Span], n_keys: int) -> torch.Tensor:
    """Fraction of each span's tokens in each step's selection: float32 `[n_steps, n_spans]`.

    Rows of steps without a selection are NaN (no selection is not "nothing selected").
    """
    mask = torch.zeros(len(selected), n_keys)
    missing = torch.zeros(len(selected), dtype=torch.bool)
    for i, positions in enumerate(selected):
        if positions is None:
            missing[i] = True
            continue
        idx = torch.as_tensor(list(positions), dtype=torch.long)
        if idx.numel() and (idx.min() < 0 or idx.max() >= n_keys):
            raise ValueError(f"step {i}: selected positions must lie in [0, {n_keys})")
        mask[i, idx] = 1.0
    lengths = torch.tensor([b - a for a, b in spans], dtype=torch.float32)
    out = span_sums(mask, spans) / lengths
    out[missing] = math.nan
    return out


def route_steps(pieces: Sequence[str], n_hops: int) -> list[int | None]:
    """The route step each generated token works on, or None past the route.

    Step k is the line after k finished "From ..." lines; a header line (`<Route>`, or a
    variant a model writes instead) counts as part of step 0. A token's step is decided by
    the text before it, as the model saw it; after `</Route>` there is none.
    """
    out: list[int | None] = []
    prefix = ""
    for piece in pieces:
        finished = prefix.split("\n")[:-1]
        step = sum(line.strip().startswith("From") for line in finished)
        out.append(None if ROUTE_CLOSE in prefix or step >= n_hops else step)
        prefix += piece
    return out


def token_pieces(tokenizer, tokens: Sequence[int]) -> list[str]:
    """The text each token adds to the decoded output (special tokens kept visible)."""
    pieces, previous = [], ""
    for j in range(len(tokens)):
        text = tokenizer.decode(list(tokens[: j + 1]), skip_special_tokens=False)
        # a token that completes a multi-byte character changes the previous text's tail
        pieces.append(text[len(previous):] if text.startswith(previous) else tokenizer.decode([tokens[j]]))
        previous = text
    return pieces


def edge_names(instance: PathTraversalInstance) -> list[str]:
    """Short labels of a Path Traversal instance's edges, in context order."""
    return [f"{e.src} → {e.dst}" for e in instance.edges]


# ---------------------------------------------------------------------------- the replay


@dataclass
class AttentionReplay:
    """Per generated token: span attention of the QRHeads and of all heads, DySCO's selection."""

    method: str
    names: list[str]  # span names
    spans: list[Span]
    tokens: list[int]  # generated tokens
    pieces: list[str]  # their text
    query_positions: list[int]  # the position whose attention row produced each token
    qr_heads: torch.Tensor  # float32 [n_tokens, n_spans]: mean over the QRHeads
    all_heads: torch.Tensor  # float32 [n_tokens, n_spans]: mean over every head of every layer
    heads: list[Head]
    selected: torch.Tensor | None = None  # [n_tokens, n_spans] fraction of span tokens selected (NaN: no selection)
    gold: list[int | None] | None = None  # per token, the span that should be read (e.g. the gold edge)
    details: list[str] | None = None  # per span, a longer description (hover text)

    def __len__(self) -> int:
        return len(self.tokens)

    def outside_spans(self, row: str, j: int) -> float:
        """Share of token j's attention (`row`: "qr_heads" or "all_heads") that fell on no span:
        each head's row sums to 1 over all keys, so what the spans lack lies elsewhere."""
        return max(0.0, 1.0 - float(getattr(self, row)[j].sum()))

    def to_dict(self) -> dict:
        def rows(t):
            return None if t is None else [[None if math.isnan(v) else round(v, 6) for v in r] for r in t.tolist()]

        return {
            "method": self.method, "names": self.names, "spans": [list(s) for s in self.spans],
            "tokens": self.tokens, "pieces": self.pieces, "query_positions": self.query_positions,
            "qr_heads": rows(self.qr_heads), "all_heads": rows(self.all_heads), "heads": [list(h) for h in self.heads],
            "selected": rows(self.selected), "gold": self.gold, "details": self.details,
        }


def _head_list(model: LoadedModel, heads) -> list[Head]:
    if hasattr(heads, "validate_for"):
        heads = heads.validate_for(model.spec)
    out = [(int(layer), int(head)) for layer, head in heads]
    if not out:
        raise ConfigError("the replay needs a non-empty head set (the QRHeads)")
    spec = model.spec
    bad = [h for h in out if not (0 <= h[0] < spec.n_layers and 0 <= h[1] < spec.n_heads)]
    if bad:
        raise ConfigError(f"heads {bad} are outside the model's {spec.n_layers} layers x {spec.n_heads} heads")
    return out


def replay_attention(
    model: LoadedModel,
    prompt_ids: Sequence[int],
    tokens: Sequence[int],
    spans: Mapping[str, Span] | Sequence[Span],
    heads: Iterable[Head],
    *,
    trace=None,
    method: str = "",
    gold: Sequence[int | None] | None = None,
    details: Sequence[str] | None = None,
    backend: BackendSpec | str | None = None,
) -> AttentionReplay:
    """Span attention of every generated token's query row, from one teacher-forced pass.

    `spans`: token spans of the prompt. `heads`: the QRHeads (a HeadSet or (layer, head)
    pairs). `trace`: a DySCO trace recorded with `record_positions=True`, for the selection.
    `backend`: None reads every head through the bridge in one pass; a backend (e.g. "static")
    feeds the tokens one at a time and reads every head's row through its read-outs, which
    reaches the lengths the static backend does (`edge_attention.span_attention_by_readout`).
    """
    if backend is None and model.spec.sliding_window is not None:
        raise ConfigError("the replay through the bridge needs full-attention layers; "
                          "pass a backend (read-outs) for sliding-window models")
    prompt_ids, tokens = [int(t) for t in prompt_ids], [int(t) for t in tokens]
    if len(prompt_ids) < 2 or not tokens:
        raise ConfigError("the replay needs a prompt of at least 2 tokens and at least one generated token")
    names, span_list = named_spans(spans)
    if span_list and max(b for _, b in span_list) > len(prompt_ids):
        raise ConfigError(f"spans must lie inside the prompt of {len(prompt_ids)} tokens")
    head_list = _head_list(model, heads)
    n_prompt, n_gen = len(prompt_ids), len(tokens)
    if gold is not None and len(gold) != n_gen:
        raise ConfigError(f"gold has {len(gold)} entries for {n_gen} generated tokens")
    selection = selection_per_token(trace, n_prompt, n_gen)  # fails early if positions were not recorded

    spec = model.spec
    by_layer: dict[int, list[int]] = {}
    for layer, head in head_list:
        by_layer.setdefault(layer, []).append(head)
    qr_sum = torch.zeros(n_gen, len(span_list))
    all_sum = torch.zeros(n_gen, len(span_list))

    def accumulate(layer: int, sums: torch.Tensor) -> None:  # sums: [H, n_gen, n_spans]
        all_sum.add_(sums.sum(0))
        if layer in by_layer:
            qr_sum.add_(sums[by_layer[layer]].sum(0))

    # the last generated token is never fed: its row is the one before it
    ids = prompt_ids + tokens[:-1]
    if backend is None:
        span_attention_by_layer(model, ids, n_prompt - 1, torch.arange(n_gen), span_list, accumulate)
    else:
        every = [(layer, head) for layer in range(spec.n_layers) for head in range(spec.n_heads)]
        read, sums, _ = span_attention_by_readout(model, ids, list(query_positions(n_prompt, n_gen)), span_list,
                                                  every, backend)
        for layer in range(spec.n_layers):  # read.heads is in (layer, head) order
            accumulate(layer, sums[:, layer * spec.n_heads:(layer + 1) * spec.n_heads].transpose(0, 1))
    return AttentionReplay(
        method=method or (trace.method if trace is not None else ""),
        names=names,
        spans=span_list,
        tokens=tokens,
        pieces=token_pieces(model.tokenizer, tokens),
        query_positions=query_positions(n_prompt, n_gen),
        qr_heads=qr_sum / len(head_list),
        all_heads=all_sum / (spec.n_layers * spec.n_heads),
        heads=head_list,
        selected=None if selection is None else selected_fractions(selection, span_list, n_prompt + n_gen),
        gold=None if gold is None else list(gold),
        details=None if details is None else list(details),
    )


def replay_path_traversal(model: LoadedModel, instance: PathTraversalInstance, result, heads,
                          backend: BackendSpec | str | None = None) -> AttentionReplay:
    """The replay of one generation (a `GenerationResult`) on a Path Traversal instance.

    Spans are the edge lines; each token's gold edge is the gold route's edge of the answer
    line it belongs to (see `route_steps`). `backend` as `replay_attention`.
    """
    if len(result.prompt_ids) != instance.n_tokens:
        raise ConfigError(
            f"the run's prompt has {len(result.prompt_ids)} tokens, the instance {instance.n_tokens}: "
            "was it generated from this instance's prompt with this model's tokenizer?"
        )
    pieces = token_pieces(model.tokenizer, result.tokens)
    steps = route_steps(pieces, instance.n_hops)
    gold = [None if k is None else instance.gold_edge_indices[k] for k in steps]
    return replay_attention(
        model,
        result.prompt_ids,
        result.tokens,
        dict(zip(edge_names(instance), instance.edge_token_spans)),  # unique: one outgoing edge per city
        heads,
        trace=result.trace,
        method=result.method,
        gold=gold,
        details=instance.edge_lines,
        backend=backend,
    )

