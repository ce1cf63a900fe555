"""The DySCO decode loop (and its baselines), for one prompt or a left-padded batch.

Schedule for one prompt (the official code's, `schedule="reference"`):
1. encode with the chat template (`chat=True`; token ids as given); n_gen = generation-prompt tokens;
2. prefill prompt[:-(T_w + n_gen)] without intervention (shareable across methods);
3. context warm-up: the next T_w - 1 tokens one at a time, no bias, relevance updated
   (T_w with `schedule="paper"`);
4. intervention warm-up: the last context token and the n_gen generation-prompt tokens with the
   method's full step (only the generation prompt with "paper");
5. decode with the full step until EOS or the budget, or feed the gold tokens (teacher forcing).
What a full step does is the method's (`methods.py`); where its passes run is the backend's
(`backends/`). `Stepper` feeds one token per row and records the trace; `generate_batch`,
`compare_methods` and `generate` run the whole schedule, all three over `generate_batch`. Inside
`observe(model, hooks=...)`, the bridge runs the user's TransformerLens hooks in every pass, and
`passes.current_pass()` says which one.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

from dysco_interp.chat import encode_text
from dysco_interp.checks import check_bool
from dysco_interp.decoding.arguments import (
    RETIRED,
    as_heads,
    check_config,
    check_configs,
    check_hooks,
    forced_ids,
    format_runs,
    retired_keywords,
    the_read,
    with_fields,
)
from dysco_interp.decoding.backends import (
    BackendSpec,
    DecodeState,
)
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.format_forced import BOTH_FORCED, RowWalk, Run, Segment
from dysco_interp.decoding.observe import current_observation
from dysco_interp.decoding.passes import scheduled
from dysco_interp.decoding.plan import Read
from dysco_interp.decoding.prompts import (
    PreparedPrompt,
    Prompt,
    PromptBatch,
    biased_prompt_steps,
    check_prompt,
    pad_id,
    prepare_prompt,
    prompt_list,
)
from dysco_interp.decoding.results import (
    DECODE,
    INTERVENTION_WARMUP,
    ForcedScores,
    GenerationResult,
    StepRecord,
    Timings,
    Trace,
)
from dysco_interp.decoding.sampling import Sampler
from dysco_interp.decoding.span_mass import SpanMass, Spans
from dysco_interp.decoding.stepper import HostRead, OnRead, PendingRecords, Stepper
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel
from dysco_interp.progress import tqdm

__all__ = ["OnRead", "Prefix", "Stepper", "as_heads", "compare_methods", "decode_batch", "dysco_generate", "forced_ids",
           "generate", "generate_batch", "iter_methods", "prefill_prefix", "with_fields"]


class Prefix:
    """A prefilled state for columns [0, n_tokens) of the rows, reusable by methods that keep
    prefill attention (it is copied, not consumed)."""

    def __init__(self, state: DecodeState, n_tokens: int, prefill_s: float):
        self.state, self.n_tokens, self.prefill_s = state, n_tokens, prefill_s


def prefill_prefix(model: LoadedModel, batch: PromptBatch, config: DecodingConfig,
                   backend: BackendSpec | str = "bridge", chunk_size: int | None = None,
                   hooks: Sequence[Hook] = (), name: str | None = None) -> Prefix:
    """Prefill everything but the warm-up and generation-prompt tokens (`name`: the method it
    serves, for `current_pass`; None when several share it)."""
    n_prefix = batch.n_prefix(config.warmup)
    runner = BackendSpec.of(backend).make(model, hooks=hooks)
    valid = batch.valid
    t0 = time.perf_counter()
    reserve = batch.width - n_prefix + config.max_new_tokens
    with scheduled(method=name):
        state = runner.prefill(batch.ids[:, :n_prefix].to(model.device),
                               None if valid is None else valid[:, :n_prefix], chunk_size=chunk_size, reserve=reserve,
                               scale=config.strategy.prefill_scale(config, model.spec.n_layers))
    return Prefix(state, n_prefix, time.perf_counter() - t0)


def decode_batch(model: LoadedModel, batch: PromptBatch, config: DecodingConfig, heads: HeadSet | None,
                 prefix: Prefix, backend: BackendSpec | str = "bridge", spans: Sequence[Spans | None] | None = None,
                 forced: Sequence[Sequence[int]] | None = None,
                 hooks: Sequence[Hook] = (), name: str | None = None,
                 read: Read | None = None,
                 on_read: OnRead | None = None,
                 format_forced: Sequence[Sequence[Run]] | None = None, **retired) -> list[GenerationResult]:
    """One method on every row, from a copy of the prefix; with `forced`, each row is fed its
    gold tokens instead of its own (teacher forcing through the method's steps); with
    `format_forced` (each row's answer as `format_forced.Run`s), its format tokens and its own
    content tokens (`format_forced` says where content ends). `hooks` run in
    every pass (bridge only); `name` is the method's name for `current_pass` (config.method if None);
    `backend` is a name or a `BackendSpec` with its options; `read` (the `Stepper`'s)
    is made in every pass that keeps a token and `on_read` is called with each `ReadOut`."""
    read = the_read(read, retired_keywords(retired, allowed=("read_out",)))
    with scheduled(method=config.method if name is None else name):
        return _decode_batch(model, batch, config, heads, prefix, BackendSpec.of(backend), spans, forced, hooks,
                             read, on_read, format_forced)


def _decode_batch(model, batch, config, heads, prefix, backend: BackendSpec, spans, forced, hooks,
                  read, on_read, format_forced) -> list[GenerationResult]:
    assert batch.prepared is not None
    if forced is not None and format_forced is not None:
        raise ConfigError(f"{BOTH_FORCED}: pass forced or format_forced")
    n_rows, width = len(batch.lengths), batch.width
    runner = backend.make(model, hooks=hooks)
    if runner.max_batch is not None and n_rows > runner.max_batch:
        raise ConfigError(f"the {backend.name} backend decodes at most {runner.max_batch} prompt(s) at a time")
    span_mass = None
    if spans is not None:
        span_mass = [None if s is None else SpanMass(s, n) for s, n in zip(spans, batch.lengths)]
    stepper = Stepper(runner, config, batch, span_mass, heads, read, on_read)
    heads = stepper.heads
    traces = [Trace(config.method, n, list(heads) if heads is not None else []) for n in batch.lengths]
    state = prefix.state.clone()
    ids = batch.ids.to(model.device)

    def keep(records: list[StepRecord], active: list[bool]) -> None:
        for trace, rec, on in zip(traces, records, active):
            if on:
                trace.steps.append(rec)

    everyone = [True] * n_rows
    t0 = time.perf_counter()
    logits = None
    first_biased = width - biased_prompt_steps(width - prefix.n_tokens, batch.n_gen, config.parameter("schedule"))
    for col in range(prefix.n_tokens, first_biased):
        logits, records = stepper.context_warmup(state, ids[:, col])
        keep(records, everyone)
    for col in range(first_biased, width):
        logits, records = stepper.step(state, ids[:, col], INTERVENTION_WARMUP)
        keep(records, everyone)
    warm_s = time.perf_counter() - t0
    assert logits is not None  # at least one prompt token is fed one at a time

    t0 = time.perf_counter()
    scores: list[ForcedScores] | list[None] = [None] * n_rows
    chosen: list[list[bool]] | list[None] = [None] * n_rows
    if format_forced is not None:
        outs, finished, chosen = _format_forced(model, stepper, state, logits, config, format_forced, keep)
    elif forced is None:
        outs, finished = _free(model, stepper, state, logits, config, keep)
    else:
        outs = [list(g)[: config.max_new_tokens] for g in forced]
        scores = _forced(stepper, state, logits, outs, keep)
        finished = [False] * n_rows
    decode_s = time.perf_counter() - t0

    results = []
    for i, p in enumerate(batch.prepared):
        timings = Timings(prefill_s=prefix.prefill_s, warmup_s=warm_s, decode_s=decode_s,
                          n_prompt=len(p.ids), n_new=len(outs[i]), batch_size=n_rows)
        text = model.tokenizer.decode(outs[i], skip_special_tokens=True)
        results.append(GenerationResult(text, outs[i], list(p.ids), finished[i], timings, trace=traces[i],
                                        method=config.method, forced=scores[i], prompt_text=p.text,
                                        chosen=chosen[i]))
    return results


Keep = Callable[[list[StepRecord], list[bool]], None]


def _free(model: LoadedModel, stepper: Stepper, state: DecodeState, logits: torch.Tensor, config: DecodingConfig,
          keep: Keep) -> tuple[list[list[int]], list[bool]]:
    """Each row's own tokens until EOS or the budget: (tokens, finished on EOS).

    Where the stepper runs ahead, the step feeding a token is queued before the host reads that
    token, and a step's records are read once the next one is queued: the host prepares a step while
    the device runs the one before. A step queued for a token that ends every row on EOS is thrown
    away."""
    n_rows = logits.shape[0]
    sampler = Sampler(config.sampling, logits.device)
    outs: list[list[int]] = [[] for _ in range(n_rows)]
    finished = [False] * n_rows
    active = [True] * n_rows
    eos = model.eos_token_ids
    tokens = sampler(logits)
    chosen = HostRead(tokens)
    last: tuple[PendingRecords, list[bool]] | None = None  # the last step's records, and the rows that keep them
    while True:
        queued = None
        # only EOS can end every row now: the budget is known here
        if stepper.runs_ahead and any(on and len(out) + 1 < config.max_new_tokens for on, out in zip(active, outs)):
            queued = stepper.launch(state, tokens, DECODE)
        toks = chosen.values()[0]
        assert toks is not None
        for i, tok in enumerate(map(int, toks)):
            if active[i]:
                outs[i].append(tok)
                finished[i] = tok in eos
                active[i] = not finished[i] and len(outs[i]) < config.max_new_tokens
        if last is not None:
            keep(last[0].records(), last[1])
        if not any(active):
            return outs, finished
        logits, pending = queued or stepper.launch(state, tokens, DECODE)  # finished rows idle along
        last = (pending, list(active))
        tokens = sampler(logits)
        chosen = HostRead(tokens)


def _format_forced(model: LoadedModel, stepper: Stepper, state: DecodeState, logits: torch.Tensor,
                   config: DecodingConfig, runs: Sequence[Sequence[Run]],
                   keep: Keep) -> tuple[list[list[int]], list[bool], list[list[bool]]]:
    """Each row's format tokens forced and its content tokens its own (`format_forced.RowWalk`):
    (tokens, finished on EOS, per token whether the model chose it)."""
    sampler = Sampler(config.sampling, logits.device)
    tokenizer = model.tokenizer
    walks = [RowWalk(r, lambda text: encode_text(tokenizer, text)[0],
                     lambda ids: tokenizer.decode(ids, skip_special_tokens=True), config.max_new_tokens,
                     model.eos_token_ids) for r in runs]
    fed = [0] * len(walks)
    while True:
        choices = sampler(logits).tolist()  # drawn for every row, as free decoding draws them
        for i, walk in enumerate(walks):
            if not walk.done:
                walk.step(choices[i])
                fed[i] = walk.tokens[-1]
        active = [not w.done for w in walks]
        if not any(active):
            return [w.tokens for w in walks], [w.finished for w in walks], [w.chosen for w in walks]
        # a finished row is fed its last token again; its records are dropped
        logits, records = stepper.step(state, torch.tensor(fed, device=logits.device), DECODE)
        keep(records, active)


def _forced(stepper: Stepper, state: DecodeState, logits: torch.Tensor, golds: list[list[int]],
            keep: Keep) -> list[ForcedScores]:
    """Feed each row its gold tokens; score the logits that predict each one. The gold tokens are
    known ahead, so each step is queued before the host reads the last one's scores and records."""
    argmax: list[list[int]] = [[] for _ in golds]
    logprob: list[list[float]] = [[] for _ in golds]
    margin: list[list[float]] = [[] for _ in golds]
    # a row past its own answer is fed its last token again; its records are dropped. On the
    # device at once: a tensor made from a list each step would wait for the device
    targets = torch.tensor([[g[min(j, len(g) - 1)] for g in golds] for j in range(max(map(len, golds)))],
                           device=logits.device)
    last: tuple[PendingRecords, list[bool]] | None = None
    j = 0
    while True:
        target = targets[j]
        logp = torch.log_softmax(logits.float(), dim=-1)
        # argmax keeps the first of tied tokens, as before margins were kept; topk's order on ties is unspecified
        top = logp.topk(2, dim=-1).values
        scores = HostRead(logp.argmax(-1), logp.gather(-1, target[:, None])[:, 0], top[:, 0] - top[:, 1])
        active = [j + 1 < len(g) for g in golds]
        queued = stepper.launch(state, target, DECODE) if any(active) else None
        best, gold, gap = scores.values()
        assert best is not None and gold is not None and gap is not None
        for i, g in enumerate(golds):
            if j < len(g):
                argmax[i].append(int(best[i]))
                logprob[i].append(float(gold[i]))
                margin[i].append(round(float(gap[i]), 6))
        if last is not None:
            keep(last[0].records(), last[1])
        if queued is None:
            return [ForcedScores(a, lp, m) for a, lp, m in zip(argmax, logprob, margin)]
        logits, pending = queued
        last = (pending, active)
        j += 1


def _prepare_all(model, prompts, configs, prepared, chat: bool) -> dict:
    """Encoded prompts per enable_thinking setting the configs use."""
    by_thinking: dict = {}
    if prepared is not None:
        thinking = {c.enable_thinking for c in configs.values()}
        if len(thinking) != 1:
            raise ConfigError("prepared prompts serve configs with one enable_thinking setting")
        if len(prepared) != len(prompts):
            raise ConfigError(f"{len(prepared)} prepared prompts for {len(prompts)} prompts")
        by_thinking[thinking.pop()] = list(prepared)
    for config in configs.values():
        if config.enable_thinking not in by_thinking:
            by_thinking[config.enable_thinking] = [prepare_prompt(model, p, config.enable_thinking, chat=chat)
                                                   for p in prompts]
    return by_thinking


def iter_methods(
    model: LoadedModel,
    prompts: Sequence[Prompt] | torch.Tensor,
    configs: Mapping[str, DecodingConfig],
    heads: HeadSet | None = None,
    *,
    backend: BackendSpec | str = "bridge",
    spans: Sequence[Spans | None] | None = None,
    prepared: Sequence[PreparedPrompt] | None = None,
    forced: Sequence[str | Sequence[int]] | None = None,
    format_forced: Sequence[Sequence[Segment]] | None = None,
    read: Read | None = None,
    chat: bool = True,
    progress: bool = False,
    **retired,
) -> Iterator[tuple[str, list[GenerationResult]]]:
    """`generate_batch` one method at a time, with its arguments: yields (name, results) as each
    method finishes."""
    # the retired keywords, each announced (`arguments.retired_keywords`), then taken in their new forms
    old = retired_keywords(retired)
    spec = BackendSpec.of(backend, old.get("graphs"), old.get("decode_attention"))
    check_configs(configs)
    check_bool("chat", chat)
    check_bool("progress", progress)
    seen = current_observation().merged(old.get("hooks"), the_read(read, old), old.get("on_read"))
    user_hooks = check_hooks(model, seen.hooks, spec.name)
    heads = as_heads(model, heads)
    seen.check(model)
    prompts = prompt_list(prompts)
    if not prompts:
        raise ConfigError("no prompts to decode")
    for i, prompt in enumerate(prompts):
        check_prompt(prompt, "prompt" if len(prompts) == 1 else f"prompt #{i}")
    if spans is not None and len(spans) != len(prompts):
        raise ConfigError(f"{len(spans)} span sets for {len(prompts)} prompts")
    if forced is not None and format_forced is not None:
        raise ConfigError(f"{BOTH_FORCED}: pass forced or format_forced")
    gold = None if forced is None else forced_ids(model, forced, len(prompts))
    runs = None if format_forced is None else format_runs(model, format_forced, len(prompts))
    by_thinking = _prepare_all(model, prompts, configs, prepared, chat)
    batches = {t: PromptBatch.of(p, pad_id(model)) for t, p in by_thinking.items()}
    # teacher-forced, a row takes its gold tokens only (at most max_new_tokens): a long prompt needs room for those
    longest_gold = None if gold is None else max(len(g) for g in gold)
    for batch in batches.values():
        for config in configs.values():
            model.check_fits(batch.width, config.max_new_tokens if longest_gold is None
                             else min(config.max_new_tokens, longest_gold))

    def key(name: str) -> tuple:
        config = configs[name]
        return (name,) if config.changes_prefill else (config.enable_thinking, config.warmup)

    sharing: dict[tuple, list[str]] = {}
    for name in configs:
        sharing.setdefault(key(name), []).append(name)
    shared: dict[tuple, Prefix] = {}
    with tqdm(total=len(configs), desc="methods", unit="method", disable=not progress) as bar:
        for name, config in configs.items():
            bar.set_postfix_str(name)
            batch = batches[config.enable_thinking]
            if key(name) not in shared:
                users = sharing[key(name)]
                shared[key(name)] = prefill_prefix(model, batch, config, spec, hooks=user_hooks,
                                                   name=users[0] if len(users) == 1 else None)
            results = decode_batch(model, batch, config, heads, shared[key(name)], spec, spans, gold,
                                   hooks=user_hooks, name=name, read=seen.read, on_read=seen.on_read,
                                   format_forced=runs)
            bar.update()
            yield name, results
            if len(sharing[key(name)]) == 1:
                del shared[key(name)]  # nobody else reads it: free its cache now


def generate_batch(
    model: LoadedModel,
    prompts: Sequence[Prompt] | torch.Tensor,
    configs: Mapping[str, DecodingConfig],
    heads: HeadSet | None = None,
    *,
    backend: BackendSpec | str = "bridge",
    spans: Sequence[Spans | None] | None = None,
    prepared: Sequence[PreparedPrompt] | None = None,
    forced: Sequence[str | Sequence[int]] | None = None,
    format_forced: Sequence[Sequence[Segment]] | None = None,
    read: Read | None = None,
    chat: bool = True,
    progress: bool = False,
    **retired,
) -> dict[str, list[GenerationResult]]:
    """Several methods on several prompts decoded together; one result per prompt per method.

    Methods that keep prefill attention share one prefill. Every row gets the tokens it would
    get alone, up to floating-point differences of the padded batch.

    With `forced`, decoding is teacher-forced: every step of the method runs as in free
    decoding (relevance, selection, bias, cache), but the token fed next is the gold one; each
    result's `forced` holds the argmax and the gold token's log-probability at every gold token
    (at most `max_new_tokens` of them; `tokens` are the gold tokens fed).

    With `format_forced`, each answer's format is forced and its content decoded: every token of a
    format segment is fed as the gold answer's tokenisation gives it, and inside a content segment
    the method chooses, until its token starts the next format segment's text (or it has taken
    3x the gold segment's tokens + 8); `decoding.format_forced` says how a boundary is read. Each
    result's `chosen` says which of its tokens the method chose.

    Your TransformerLens hooks, and a callback for each read-out, are scoped by a context
    around the call, `with observe(model, hooks=..., on_read=...)` (`decoding.observe`). For
    one release the call still takes `hooks=`, `read_out=` (now `read=`) and `on_read=`, and
    `graphs=` and `decode_attention=` beside a backend's name (now inside its `BackendSpec`),
    each with a DeprecationWarning.

    Args:
        model: the loaded model.
        prompts: a list of prompts (texts, chat-message lists, token-id lists or 1-D tensors),
            or a `[B, N]` integer tensor: B prompts of N tokens each (no token is taken for a
            pad; prompts of different lengths go as a list, and are left-padded here).
        configs: name -> method and parameters.
        heads: the QRHeads (H*) for the DySCO methods: a HeadSet, (layer, head) pairs,
            "shipped", an 'L17H3,L17H4' string or a head file.
        backend: a `BackendSpec` (a backend and its typed options, e.g.
            `BackendSpec("static", decode_attention="float32")`), or its name: "bridge" (TL
            hooks, one prompt), "sdpa" (fast; prompts of any lengths together, left-padded) or
            "static" (as sdpa, with fixed KV buffers and CUDA-graph steps on a GPU).
        spans: per prompt, named token spans whose relevance mass the traces report.
        prepared: the prompts already encoded (`prepare_prompt`) with the configs' one `enable_thinking`.
        forced: per prompt, the gold continuation (text, encoded on its own after the prompt, or
            token ids) to teacher-force; None decodes freely.
        format_forced: per prompt, its answer as consecutive (text, is_content) segments (the
            joined text encoded on its own after the prompt, as `forced` text is); None decodes
            freely. Not with `forced`.
        read: a `plan.Read` of any heads made in every pass that keeps a token, on every
            backend and for any method: their rows or their mass over key spans (positions in the
            batch's columns), without a full attention pattern; a span-mass read lands in each
            trace step's `read_mass`, and `observe(on_read=...)` receives each `ReadOut`. Not
            with a read set by an `observe` context.
        chat: render text and messages with the model's chat template (the default); False
            tokenizes text as `model.bridge.to_tokens` does. Token ids never get a template;
            each result's `prompt_text` is what was encoded.
        progress: a progress bar over the methods, naming the one that runs.

    Returns:
        name -> one `GenerationResult` per prompt, in order.
    """
    return dict(iter_methods(model, prompts, configs, heads, backend=backend, spans=spans, prepared=prepared,
                             forced=forced, format_forced=format_forced, read=read, chat=chat, progress=progress,
                             **retired))


# the keywords `generate` passes on to `generate_batch` (and for one release the retired ones); the
# rest are its config's fields
CALL_OPTIONS = frozenset({p.name for p in inspect.signature(generate_batch).parameters.values()
                          if p.kind is p.KEYWORD_ONLY} | set(RETIRED))


def compare_methods(model: LoadedModel, prompt: Prompt, configs: Mapping[str, DecodingConfig],
                    heads: HeadSet | None = None, *, spans: Spans | None = None,
                    prepared: PreparedPrompt | None = None, **options) -> dict[str, GenerationResult]:
    """`generate_batch` on one prompt: several methods, prefilling once for all that keep prefill attention.

    Args:
        model: as `generate_batch`.
        prompt: text, chat messages, or token ids (a list of ints, a 1-D or `[1, N]` tensor).
        configs: as `generate_batch`.
        heads: as `generate_batch`.
        spans: named token spans of the prompt whose relevance mass the traces report.
        prepared: the prompt already encoded with the configs' one `enable_thinking`.
        **options: `generate_batch`'s other keyword options (`backend`, `read`, `chat`, `progress`, ...).

    Returns:
        name -> its `GenerationResult`.
    """
    check_prompt(prompt)
    out = generate_batch(model, [prompt], configs, heads, spans=None if spans is None else [spans],
                         prepared=None if prepared is None else [prepared], **options)
    return {name: results[0] for name, results in out.items()}


def generate(model: LoadedModel, prompt: Prompt, config: DecodingConfig | None = None, *,
             heads: HeadSet | None = None, **options) -> GenerationResult:
    """Generate with one method; returns text, tokens and a per-step `Trace`.

    `generate(model, prompt_or_ids, method="dysco", heads="shipped", params={"beta": 2.5}, max_new_tokens=32)`
    works as well as passing a `DecodingConfig`: its settings given as keywords override it, and
    `params=` (a mapping) changes the parameters it names.

    Args:
        model: the loaded model.
        prompt: text, chat messages, or token ids (a list of ints, a 1-D or `[1, N]` integer
            tensor such as `model.bridge.to_tokens(text)`), used as given.
        config: the method and its parameters (None: vanilla decoding, 256 new tokens).
        heads: as `generate_batch`.
        **options: `compare_methods`' keyword options (`spans`, `prepared`; `backend`, `read`,
            `chat`, ... as `generate_batch`) and `DecodingConfig` settings (`method`,
            `max_new_tokens`, `params`, ...).

    Returns:
        A `GenerationResult` whose `trace` records every step.

    Wrong argument types (a string for `config`, an unknown option, an empty prompt, token ids
    of another shape) are ConfigErrors that say what to pass instead.
    """
    config = DecodingConfig(method="vanilla") if config is None else config
    check_config(config)
    config = with_fields(config, {k: v for k, v in options.items() if k not in CALL_OPTIONS})
    call = {k: v for k, v in options.items() if k in CALL_OPTIONS}
    return compare_methods(model, prompt, {config.method: config}, heads, **call)[config.method]


def dysco_generate(
    model: LoadedModel,
    prompt: Prompt,
    heads: HeadSet | None = None,
    config: DecodingConfig = DecodingConfig(),
    **options,
) -> GenerationResult:
    """`generate` with the heads first and DySCO's default preset (small-budget) by default
    (`config` None is an error); `options` are `generate`'s keyword options (`backend`, `chat`, `read`, ...),
    `DecodingConfig` fields included. Deprecated: call `generate(model, prompt, config, heads=heads)`."""
    warnings.warn("dysco_generate is deprecated and goes in the next release: call "
                  "generate(model, prompt, config, heads=heads)", DeprecationWarning, stacklevel=2)
    check_config(config)
    return generate(model, prompt, config, heads=heads, **options)
