"""DySCO's open variants (dysco-lagged, dysco-hard, dysco-middle): the same tokens on every backend
and in batches, the same tokens as an independent implementation in TransformerLens hooks, their
degenerate settings, and their parameters' checks."""

import math

import pytest
import torch

import dysco_interp.decoding.baselines.dysco_variants  # noqa: F401  (registers the variants)
from dysco_interp import DecodingConfig, generate, generate_batch
from dysco_interp.decoding.baselines.dysco_variants import DyscoMiddle, middle_layers
from dysco_interp.decoding.loop import compare_methods
from dysco_interp.decoding.observe import observe
from dysco_interp.decoding.passes import current_pass
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, shipped_heads
from dysco_interp.hooks import layer_of, pattern_name, scores_name
from dysco_interp.models.tiny import STYLES, tiny_model

PROMPT = (
    "You can travel from Paris to Berlin by train. Rome is quiet. " * 6 + "Please give a route from Paris to Berlin."
)
OTHER = "Oslo has a harbour. Bergen is rainy. " * 3 + "Which city has a harbour?"
N_NEW = 10
STEERING = {"beta": 4.0, "select_p": 0.7}


def heads_for(model, pairs=((1, 0), (2, 3), (1, 2))):
    s = model.spec
    return HeadSet(list(pairs), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def config(method, n_new=N_NEW, **params):
    return DecodingConfig(method=method, params=params, max_new_tokens=n_new, record_positions=True)


VARIANTS = {
    "lagged": config("dysco-lagged", **STEERING),
    # no context warm-up: the first step reads the QRHeads in a partial pass before it biases
    "lagged-no-warmup": DecodingConfig(method="dysco-lagged", params=STEERING, warmup=1, max_new_tokens=N_NEW,
                                       record_positions=True),
    "hard": config("dysco-hard", select_p=0.9),
    "hard-generated": config("dysco-hard", select_p=0.5, keep_generated=True),
    "middle": config("dysco-middle", **STEERING),
}


def selections(result):
    return [(s.position, s.selected) for s in result.trace.steps]


def chosen(result):
    """Each full step's selected positions (the context warm-up selects nothing)."""
    return [s.selected for s in result.trace.steps if s.selected is not None]


@pytest.mark.parametrize("style", STYLES)
def test_every_backend_gives_the_bridges_tokens_and_a_padded_batch_gives_each_row_its_own(style):
    model = tiny_model(style)
    heads = heads_for(model)
    configs = {"vanilla": config("vanilla"), **VARIANTS}
    bridge = [compare_methods(model, prompt, configs, heads, backend="bridge") for prompt in (PROMPT, OTHER)]
    for name in VARIANTS:  # each variant steers: the test can tell it from vanilla
        assert any(b[name].tokens != b["vanilla"].tokens for b in bridge), name
    for backend in ("sdpa", "static"):
        batched = generate_batch(model, [PROMPT, OTHER], configs, heads, backend=backend)  # OTHER is left-padded
        for name in configs:
            for row, alone in zip(batched[name], bridge):
                assert row.tokens == alone[name].tokens, (backend, name)
                assert selections(row) == selections(alone[name]), (backend, name)
    alone = compare_methods(model, OTHER, configs, heads, backend="sdpa")
    for name in configs:
        assert alone[name].tokens == bridge[1][name].tokens, name


# ------------------------------------------------------------------ the variants again, as TL hooks


class HookVariant:
    """A DySCO variant written again as TransformerLens hooks on the bridge, sharing nothing with
    the methods: the QRHeads' rows (hook_pattern), the running relevance, the nucleus-then-K
    selection and the edit of the scores (hook_attn_scores) are all computed here.

    It rides on a scaffold method's passes, told apart by `current_pass()`: vanilla's (one plain
    pass per token) for "lagged"; DySCO's at beta = 1 (an unbiased partial pass that caches
    nothing, then a full pass whose own bias is 0) for "hard" and "middle". One prompt, no pads:
    key j is the j-th token.
    """

    def __init__(self, model, heads, template, variant, *, select_p, select_k=8, decay=0.75, beta=1.5,
                 layers=None, keep_generated=False):
        self.n_layers = model.spec.n_layers
        self.heads = sorted(tuple(h) for h in heads)
        self.deepest = self.heads[-1][0]
        self.template = template.bool()  # [n_prompt]: never selected (DySCO's "reference" masking)
        self.n_prompt = len(template)
        self.variant, self.select_p, self.select_k, self.decay = variant, select_p, select_k, decay
        self.log_beta = math.log(beta)
        self.layers = range(self.n_layers) if layers is None else layers
        self.keep_generated = keep_generated
        self.relevance = None  # float32 [n_keys]
        self.rows = {}  # layer -> float32 [heads read there, n_keys]
        self.edit = None  # float32 [n_keys]: what the steered pass adds to every chosen layer's scores
        self.selected = []  # each step's selected positions
        self.steps_seen = set()

    def hooks(self):
        read = [(pattern_name(layer), self.read) for layer in sorted({layer for layer, _ in self.heads})]
        return read + [(scores_name(layer), self.steer) for layer in range(self.n_layers)]

    # the pieces

    def mean_row(self):
        total, count = None, 0
        for layer in sorted(self.rows):
            rows = self.rows[layer]
            total = rows.sum(dim=0) if total is None else total + rows.sum(dim=0)
            count += rows.shape[0]
        return total / count

    def update(self):
        a = self.mean_row()
        if self.relevance is None:
            self.relevance = a.clone()
        else:
            previous = torch.cat([self.relevance, torch.zeros(len(a) - len(self.relevance))])
            self.relevance = (a + self.decay * previous) / (1.0 + self.decay)

    def select(self, n_keys):
        r = torch.cat([self.relevance, torch.zeros(n_keys - len(self.relevance))])  # this token's key: 0
        order = sorted(range(n_keys), key=lambda i: (-float(r[i]), i))  # ties: the earlier key first
        mass = torch.cumsum(r[order], dim=0)
        kept = []
        for rank, i in enumerate(order):
            if rank >= self.select_k or (rank > 0 and self.select_p < 1 and mass[rank] > self.select_p):
                break
            kept.append(i)
        template = torch.zeros(n_keys, dtype=torch.bool)  # the prompt's template tokens among these keys
        template[: min(n_keys, self.n_prompt)] = self.template[:n_keys]
        chosen = sorted(i for i in kept if not template[i])
        self.selected.append(chosen)
        edit = torch.zeros(n_keys)
        if self.variant == "hard":
            visible = torch.zeros(n_keys, dtype=torch.bool)
            visible[chosen] = True
            visible |= template
            if self.keep_generated:
                visible[self.n_prompt:] = True
            visible[-1] = True
            edit[~visible] = -math.inf
        else:
            edit[chosen + [n_keys - 1]] = self.log_beta
        self.edit = edit

    # the hooks

    def read(self, pattern, hook):
        now = current_pass()
        if now is None or now.kind in ("prefill", "biased"):  # the scaffold's full pass after a partial one
            return None
        layer = layer_of(hook)
        self.rows[layer] = pattern[0, [h for l_, h in self.heads if l_ == layer], -1, :].float()
        if layer == self.deepest:
            self.update()
            self.rows = {}
            if now.kind == "partial":  # hard, middle: select before the full pass
                self.select(pattern.shape[-1])
        return None

    def steer(self, scores, hook):
        now = current_pass()
        if now is None or now.phase in ("prefill", "context-warmup"):
            return None
        layer = layer_of(hook)
        if self.variant == "lagged" and layer == 0:  # select once per token, from the reads before it
            assert now.step not in self.steps_seen  # one pass per token
            self.steps_seen.add(now.step)
            self.select(scores.shape[-1])
        if now.kind == "partial" or layer not in self.layers:
            return None
        return scores + self.edit


def reference(model, heads, prompt, variant, n_new=N_NEW, **params):
    """(tokens, selections) of the hook implementation."""
    template = prepare_prompt(model, prompt).template("reference")
    ours = HookVariant(model, heads, template, variant, **params)
    scaffold = config("vanilla", n_new) if variant == "lagged" else config("dysco", n_new, beta=1.0)
    with observe(model, hooks=ours.hooks()):
        result = generate(model, prompt, scaffold, heads=heads)
    return result.tokens, ours.selected


def variant_run(model, heads, prompt, method, n_new=N_NEW, **params):
    # a hook that changes nothing, so that the prefill runs through the bridge as the reference's does
    with observe(model, hooks=[(pattern_name(0), lambda pattern, hook: None)]):
        return generate(model, prompt, config(method, n_new, **params), heads=heads)


CASES = {  # name -> method, its parameters, the hook implementation's
    "lagged": ("dysco-lagged", STEERING, {"variant": "lagged", "select_p": 0.7, "beta": 4.0}),
    "hard": ("dysco-hard", {"select_p": 0.9}, {"variant": "hard", "select_p": 0.9}),
    "hard-generated": ("dysco-hard", {"select_p": 0.5, "keep_generated": True},
                       {"variant": "hard", "select_p": 0.5, "keep_generated": True}),
}


@pytest.mark.parametrize("case", [*CASES, "middle"])
def test_the_hook_implementation_gives_the_variants_tokens_and_selections(tiny_llama, case):
    heads = heads_for(tiny_llama)
    if case == "middle":
        params = {**STEERING, "depth_from": 0.5, "depth_to": 1.0}  # layers 2 and 3 of 4
        layers = middle_layers(tiny_llama.spec.n_layers, 0.5, 1.0)
        assert list(layers) == [2, 3]
        method, ref = "dysco-middle", {"variant": "middle", "select_p": 0.7, "beta": 4.0, "layers": layers}
    else:
        method, params, ref = CASES[case]
    ours = variant_run(tiny_llama, heads, PROMPT, method, **params)
    tokens, selected = reference(tiny_llama, heads, PROMPT, **ref)
    assert ours.tokens == tokens
    assert chosen(ours) == selected
    assert ours.tokens != generate(tiny_llama, PROMPT, config("vanilla"), heads=heads).tokens


@pytest.mark.real_model
def test_the_hook_implementation_gives_the_variants_tokens_on_the_real_model(real_model):
    heads = shipped_heads("smollm2-135m", spec=real_model.spec)
    strong = {"beta": 8.0, "select_p": 0.9, "select_k": 32}  # the middle layers alone change this prompt's answer
    cases = {"lagged": ("dysco-lagged", strong, {"variant": "lagged", **strong}),
             "hard": CASES["hard"],
             "middle": ("dysco-middle", strong, {"variant": "middle", **strong,
                                                 "layers": middle_layers(real_model.spec.n_layers, 0.25, 0.75)})}
    plain = generate(real_model, PROMPT, config("vanilla", 8), heads=heads).tokens
    for name, (method, params, ref) in cases.items():
        ours = variant_run(real_model, heads, PROMPT, method, 8, **params)
        tokens, selected = reference(real_model, heads, PROMPT, n_new=8, **ref)
        assert ours.tokens == tokens, name
        assert chosen(ours) == selected, name
        assert len(ours.tokens) == 8 and ours.tokens != plain, name


# ------------------------------------------------------------------ degenerate settings


def test_the_degenerate_settings_are_dysco_s_and_vanilla_s_tokens(tiny):
    heads = heads_for(tiny)
    out = compare_methods(tiny, PROMPT, {
        "vanilla": config("vanilla"),
        "dysco": config("dysco", **STEERING),
        "middle-everywhere": config("dysco-middle", **STEERING, depth_from=0.0, depth_to=1.0),
        "hard-everything": config("dysco-hard", select_p=1.0, select_k=10**6),
        "hard-everything-off": config("dysco-hard", select_p=1.0, select_k=10**6, template_masking="off"),
        "lagged-beta-1": config("dysco-lagged", select_p=0.7, beta=1.0),
    }, heads)
    assert out["dysco"].tokens != out["vanilla"].tokens  # else the test could not tell them apart
    assert out["middle-everywhere"].tokens == out["dysco"].tokens
    assert selections(out["middle-everywhere"]) == selections(out["dysco"])
    for name in ("hard-everything", "hard-everything-off", "lagged-beta-1"):
        assert out[name].tokens == out["vanilla"].tokens, name


def test_lagged_runs_one_pass_per_token_and_its_first_step_selects_from_the_warmup(tiny_llama):
    heads = heads_for(tiny_llama)
    kinds = []

    def count(scores, hook):
        now = current_pass()
        if now.phase not in ("prefill", "context-warmup"):
            kinds.append((now.step, now.kind))

    with observe(tiny_llama, hooks=[(scores_name(0), count)]):
        lagged = generate(tiny_llama, PROMPT, config("dysco-lagged", **STEERING), heads=heads)
    steps = [s for s in lagged.trace.steps if s.selected is not None]
    assert [kind for _, kind in kinds] == ["biased"] * len(steps)
    assert len({step for step, _ in kinds}) == len(steps)
    # the first full step's keys come from the context warm-up's tokens and those before them only
    first = steps[0]
    assert first.selected and max(first.selected) < first.position


def test_middle_layers_are_the_fractions_of_the_depth(tiny_llama):
    assert middle_layers(30, 0.25, 0.75) == range(7, 23)
    assert middle_layers(4, 0.25, 0.75) == range(1, 3)
    assert middle_layers(10, 0.3, 0.7) == range(3, 7)  # no round-off layer
    assert middle_layers(4, 0.0, 1.0) == range(4)
    assert middle_layers(4, 0.9, 0.95) == range(3, 4)  # never empty
    method = DyscoMiddle(config("dysco-middle"), heads_for(tiny_llama), tiny_llama.spec)
    assert method.biased.bias is not None and method.biased.bias.layers == (1, 2)


# ------------------------------------------------------------------ bad parameters


@pytest.mark.parametrize("method,params,match", [
    ("dysco-middle", {"depth_from": 0.8, "depth_to": 0.2}, "depth_from"),
    ("dysco-middle", {"depth_from": 0.5, "depth_to": 0.5}, "depth_from"),
    ("dysco-middle", {"depth_from": -0.1}, "depth_from"),
    ("dysco-middle", {"depth_to": 1.5}, "depth_to"),
    ("dysco-middle", {"depth_to": "0.5"}, "depth_to"),
    ("dysco-middle", {"depth_to": float("nan")}, "depth_to"),
    ("dysco-hard", {"keep_generated": "yes"}, "keep_generated"),
    ("dysco-hard", {"select_p": 0.0}, r"select_p must be in \(0, 1\]"),
    ("dysco-hard", {"beat": 2.0}, "no parameter 'beat'"),
    ("dysco-lagged", {"beta": 0.0}, "beta"),
    ("dysco-lagged", {"decay": -1.0}, "decay"),
])
def test_bad_parameters_are_one_config_error_line_before_any_model_loads(no_model, method, params, match):
    with pytest.raises(ConfigError, match=match) as caught:
        DecodingConfig(method=method, params=params)
    assert "\n" not in str(caught.value) and method in str(caught.value)


def test_lagged_makes_each_selection_once_at_the_end_of_the_step_before(tiny_llama, monkeypatch):
    from dysco_interp.decoding.baselines.dysco_variants import DyscoLagged

    heads = heads_for(tiny_llama)
    made = []
    prepared = DyscoLagged.prepared

    def counted(self, n_keys):
        made.append(n_keys)
        return prepared(self, n_keys)

    monkeypatch.setattr(DyscoLagged, "prepared", counted)
    ahead = generate(tiny_llama, PROMPT, config("dysco-lagged", **STEERING), heads=heads)
    steps = [s for s in ahead.trace.steps if s.selected is not None]
    # the first full step makes its own; every step makes the next one's, the last one's unused
    assert len(made) == len(steps) + 1 and made == list(range(made[0], made[0] + len(made)))
    monkeypatch.setattr(DyscoLagged, "planned", lambda self, n_keys: counted(self, n_keys))
    at_start = generate(tiny_llama, PROMPT, config("dysco-lagged", **STEERING), heads=heads)
    assert at_start.tokens == ahead.tokens and chosen(at_start) == chosen(ahead)


@pytest.mark.parametrize("method", ["dysco-lagged", "dysco-sparse"])
def test_a_relevance_set_between_steps_is_the_one_the_next_step_selects_from(tiny_llama, method):
    import dysco_interp.decoding.baselines  # noqa: F401  (registers dysco-sparse)
    from dysco_interp.decoding.backends import make_backend
    from dysco_interp.decoding.prompts import PromptBatch
    from dysco_interp.decoding.stepper import Stepper

    ids = torch.randint(20, 500, (1, 40), generator=torch.Generator().manual_seed(3))
    backend = make_backend(tiny_llama, "sdpa")
    state = backend.prefill(ids[:, :36], None, reserve=8)
    stepper = Stepper(backend, DecodingConfig(method=method, params=STEERING, record_positions=True),
                      PromptBatch.from_ids(ids[:, :36]), heads=heads_for(tiny_llama))
    stepper.relevance = torch.full((1, 36), 1 / 36)
    stepper.step(state, ids[:, 36])
    one_key = torch.zeros(1, state.n_keys)
    one_key[0, 5] = 1.0
    stepper.relevance = one_key  # the selection made at the end of the last step is now stale
    _, records = stepper.step(state, ids[:, 37])
    assert records[0].selected == [5]
