"""How far the static backend's fast decoding paths are from its float32 reference, on one prompt.

The reference is the static backend with the float32 decoding attention (float32 scores and
softmax) and its small operations as written. Against it, each path in `PATHS` prefills the same
prompt and takes the same two steps: a reading step (its logits and the QRHeads' relevance), then
a biased step whose bias is the same for every path (the reference's DySCO selection, so a
different selection cannot hide or inflate a difference). Reported per path: the largest
absolute logit difference of each step, the largest relevance difference, and whether both
steps' argmax agree.

`token_agreement` asks the question a user asks of a whole generation: greedy decoding with
vanilla and with DySCO on every path, against the TransformerLens bridge's tokens, and the first
new token where each path leaves them (None: never). In bf16 a path may leave at a near-tie of
two tokens, as any two bf16 kernels may; where every path leaves at the same token, the bridge's
own rounding is the likelier cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from dysco_interp.decoding import relevance
from dysco_interp.decoding.backends import BackendSpec
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import compare_methods
from dysco_interp.decoding.plan import Bias, PassPlan, Read
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel

REFERENCE = "float32-plain"


@dataclass(frozen=True)
class DecodePath:
    """A backend and, for the static one, its decoding attention, its kernels and whether a step's
    products go through the Triton kernel (`backends.matvec`; None: on CUDA devices)."""

    backend: str
    decode_attention: str | None = None
    compile_kernels: bool | None = None
    matvec: bool | None = None

    def spec(self, graphs: bool | None = None) -> BackendSpec:
        # an option left None is no option at all: the backend's own default (`BackendOptions.of`)
        return BackendSpec(self.backend, graphs, decode_attention=self.decode_attention,
                           compile_kernels=self.compile_kernels, matvec=self.matvec)


PATHS: dict[str, DecodePath] = {
    REFERENCE: DecodePath("static", "float32", False),
    "fused-compiled": DecodePath("static", "sdpa", True),  # the static backend's default on CUDA
    "fused-compiled-cublas": DecodePath("static", "sdpa", True, matvec=False),  # the products by cuBLAS
    "fused-plain": DecodePath("static", "sdpa", False),
    "hf-sdpa": DecodePath("sdpa"),
}


def paths_for(device: torch.device) -> dict[str, DecodePath]:
    """The paths a device can run: compiled kernels need CUDA."""
    return {name: p for name, p in PATHS.items() if device.type == "cuda" or not p.compile_kernels}


@dataclass
class StepReadout:
    logits: torch.Tensor  # float32 [1, vocab], the reading step
    attention: torch.Tensor  # float32 [1, n_keys], the QRHeads' relevance of the reading step
    biased: torch.Tensor  # float32 [1, vocab], the biased step


def two_steps(model: LoadedModel, heads: HeadSet, ids: torch.Tensor, path: DecodePath,
              bias_of: "BiasOf") -> StepReadout:
    """Prefill all but the last two tokens of `ids` `[1, n]`, read at the next one, bias the last."""
    # eager on every backend (one that captures no graphs has none to turn off): the paths differ
    # in their kernels, not in replaying them
    backend = path.spec(graphs=False).make(model)
    n = ids.shape[1] - 2
    ids = ids.to(model.device)
    state = backend.prefill(ids[:, :n], None, reserve=4)
    read = backend.run(state, ids[:, n], PassPlan(reads=(Read(tuple(heads)),)))
    assert read.logits is not None and read.attention is not None
    biased_plan = PassPlan(bias=Bias(range(model.spec.n_layers)))
    biased = backend.run(state, ids[:, n + 1], biased_plan.with_bias(bias_of(read.attention))).logits
    assert biased is not None
    return StepReadout(read.logits.float(), read.attention.float(), biased.float())


class BiasOf:
    """The bias every path shares: made once, from the first (reference) path's relevance."""

    def __init__(self, top_p: float, top_k: int, beta: float):
        self.top_p, self.top_k, self.beta = top_p, top_k, beta
        self.selected: torch.Tensor | None = None

    def __call__(self, attention: torch.Tensor) -> torch.Tensor:
        if self.selected is None:
            self.selected = relevance.select_keys(attention, self.top_p, self.top_k).mask
        return relevance.scaling_bias(torch.nn.functional.pad(self.selected, (0, 1)), self.beta)


def differences(reference: StepReadout, other: StepReadout) -> dict:
    return {
        "max_abs_logit_diff_plain": float((reference.logits - other.logits).abs().max()),
        "max_abs_logit_diff_biased": float((reference.biased - other.biased).abs().max()),
        "max_abs_relevance_diff": float((reference.attention - other.attention).abs().max()),
        "argmax_equal": bool(torch.equal(reference.logits.argmax(-1), other.logits.argmax(-1))
                             and torch.equal(reference.biased.argmax(-1), other.biased.argmax(-1))),
    }


def compare_paths(model: LoadedModel, heads: HeadSet, ids: torch.Tensor, *, top_p: float = 0.975,
                  top_k: int = 4096, beta: float = 2.0,
                  paths: Mapping[str, DecodePath] | None = None) -> dict:
    """Every path against the reference on the prompt `ids` `[1, n]` (n >= 3)."""
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 3:
        raise ValueError(f"expected one prompt of at least 3 tokens as [1, n], got {tuple(ids.shape)}")
    paths = paths_for(model.device) if paths is None else paths
    bias_of = BiasOf(top_p, top_k, beta)
    reference = two_steps(model, heads, ids, PATHS[REFERENCE], bias_of)
    assert bias_of.selected is not None
    out: dict = {"prompt_tokens": int(ids.shape[1]), "logit_scale": float(reference.logits.abs().max()),
                 "n_selected": int(bias_of.selected.sum())}
    for name, path in paths.items():
        if name == REFERENCE:
            continue
        out[name] = differences(reference, two_steps(model, heads, ids, path, bias_of))
        if model.device.type == "cuda":
            torch.cuda.empty_cache()  # one path's buffers at a time on the card
    return out


def first_difference(tokens: list[int], reference: list[int]) -> int | None:
    """The index of the first new token where `tokens` leave `reference` (None: they never do;
    a shorter run that stops early leaves at its end)."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def token_agreement(model: LoadedModel, heads: HeadSet, ids: torch.Tensor, new_tokens: int,
                    paths: Mapping[str, DecodePath] | None = None) -> dict:
    """Greedy vanilla and DySCO (its defaults) on the prompt `ids` `[1, n]` through the bridge and
    every path (each as it runs by default: CUDA graphs where it captures them): for each path and
    method, the first new token where it leaves the bridge's (None: never)."""
    paths = paths_for(model.device) if paths is None else paths
    methods = {"vanilla": DecodingConfig(method="vanilla", max_new_tokens=new_tokens),
               "dysco": DecodingConfig(method="dysco", max_new_tokens=new_tokens)}
    reference = compare_methods(model, ids, methods, heads, backend="bridge")
    out: dict = {"prompt_tokens": int(ids.shape[1]), "new_tokens": new_tokens}
    for name, path in paths.items():
        runs = compare_methods(model, ids, methods, heads, backend=path.spec())
        out[name] = {method: first_difference(runs[method].tokens, reference[method].tokens) for method in methods}
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
    return out


QUESTION = "Which function above computes the relevance update? Name it and explain it."


def source_prompt(model: LoadedModel, n_tokens: int) -> torch.Tensor:
    """A long prompt of real text that every installation has: this package's own source, cut to
    about `n_tokens` tokens, then a question, in the model's chat template; `[1, n]`."""
    root = Path(__file__).resolve().parents[1]
    code = "".join(path.read_text() for path in sorted(root.rglob("*.py")))
    room = n_tokens - len(model.tokenizer(QUESTION)["input_ids"]) - 32  # the template's tokens
    if room < 1:
        raise ValueError(f"{n_tokens} tokens leave no room for the source text")
    body = model.tokenizer.decode(model.tokenizer(code)["input_ids"][:room])
    return torch.tensor(list(prepare_prompt(model, body + "\n\n" + QUESTION).ids))[None]
