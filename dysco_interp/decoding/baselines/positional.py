"""Positional calibration as a plan program: the attention a neutral document gets by position alone, taken out.

The method (Hsieh et al., 2024, "Found in the Middle: Calibrating Positional Attention Bias
Improves Long Context Utilization", arXiv:2406.16008): the attention a document gets is modelled
as its relevance plus a bias that depends only on where it sits; the attention that a dummy
document gets at the same place estimates that bias, and subtracting it leaves the relevance
("calibrated attention"). Their Appendix C fits the same model in log space (log attention =
relevance + bias(position)) about as well as the linear one; in log space, subtracting a
position's bias is adding minus its log to the scores of that position's keys, which a plan
carries as one `plan.Bias`.

What this method does, per prompt of a batch (`start`, before any pass):
1. The neutral document (`neutral_ids`): the prompt with every token of its messages' contents
   replaced by a fixed content-free filler (`FILLER`, the passkey-retrieval haystack text, its
   tokens tiled in order), and the chat template's own tokens (`template_masking="skeleton"`) and
   the tokenizer's special tokens kept where they are. It has the prompt's length, its template
   and its generation prompt, and nothing to find. Deterministic: the same prompt always gives
   the same neutral document.
2. The calibration (`baseline_shares`): the neutral document's attention row of its last query
   position (the generation prompt's last token: the query the first decoded token comes from),
   the mean over every head of the biased layers, summed over each of `buckets` buckets of the
   calibrated keys. The calibrated keys are the content positions (the keys step 1 replaced); the
   buckets split them into runs of (nearly) equal counts, in order. Each bucket's share is its
   mass over the mass on all calibrated keys.
3. The bias (`bucket_bias`): on every key of bucket j, s log(u_j / b_j) - log sum_i b_i (u_i / b_i)^s,
   b_j the neutral document's share of bucket j, u_j the bucket's share of the calibrated keys,
   s = `strength`. At s = 1 each head's neutral profile over the buckets becomes flat (each key
   gets the same share) in the log-linear model; at s = 0 the bias is 0. The second term keeps
   the neutral document's total attention on the calibrated keys what it was, as the paper's
   constant C keeps the total attention on the documents. Template tokens, special tokens
   (the attention sink), pads and generated tokens get 0.
The bias applies in layers floor(depth_from * L) .. L - 1, every head, from the steps that
vanilla's schedule runs as the method's own (the last prompt tokens, then every generated token);
the prefill and the context warm-up run as vanilla's, so the method shares vanilla's prefill.

Per layer or per head. One baseline, the mean over all the biased layers' heads: a plan's bias
is one tensor for all the layers it applies to (a per-head bias gives head h the same row in
every layer, and head h of two layers are unrelated heads), so a baseline per layer and head
would need a bias per layer, which a pass plan does not carry. The mean of the heads' shares
rather than of their logs: a head that gives a bucket almost nothing would otherwise set a huge
bias for all the others. A bucket's share counts as at least `MIN_RATIO` times its key share, so
no bucket's boost exceeds about strength * ln(1 / MIN_RATIO).

The same on every backend. The calibration is made one way whatever backend decodes: each
prompt's neutral document alone (no pads), through the SDPA twin (`backends.sdpa`, the same
weights): a chunked prefill of all but its last token, then one pass of that token that reads the
last query row of the biased layers' heads (`plan.Read`, q.K of those heads only, in float32),
caching nothing. A prompt thus gets the same bias decoded alone as in a padded batch, on the
bridge as on sdpa or static; identical neutral documents in one batch are calibrated once. The
user's hooks (`observe`) do not run in it.

Cost: per prompt, before decoding, one prefill of the prompt's length and one pass of one token
that reads the biased layers' last query rows; then one pass per token, as vanilla, with a bias.
Measured on CPU with smollm2-135m (2 threads): 1.53 s against a 1.56 s prefill at 517 tokens,
8.0 s against 7.9 s at 1957: the calibration is the price of a second prefill. Not measured at 31K
(no GPU here); what it holds there, for Qwen2.5-7B (28 layers, 28 query heads, 4 KV heads of 128)
at 31K tokens in bfloat16:
- a second KV cache of the prompt's length while it runs, freed when it ends (about 1.8 GB), and
  the prefill's working memory, chunked as vanilla's (`runtime.DEFAULT_CHUNK`);
- the read: per biased layer, the keys in float32 for each query head (about 0.45 GB, freed layer
  by layer) and the rows themselves (float32 [heads, n]: 3.5 MB per layer);
- never an n x n attention pattern; prompts of a batch are calibrated one after the other.
So at 31K the method costs about vanilla's prefill twice. `strength=0` skips the calibration:
vanilla decoding at vanilla's cost.

What differs from the original:
- Buckets of equal key counts instead of documents: the prompts here are not a list of K
  retrieved documents, so there are no document boundaries to calibrate between.
- One neutral document of the prompt's own length, read once, instead of a dummy document
  placed at each of the K positions among the real ones (the paper's calibration costs extra
  passes in proportion to K).
- The log-linear form of their model (their Appendix C), as a bias on the scores. The original
  uses the linear one and rescales each document's attention so that it is proportional to
  softmax(calibrated attention / t) (t = 5e-5 in their experiments): it reads the real prompt's
  attention and moves attention towards the documents it finds relevant. This removes the
  positional prior only, a fixed bias per position, and leaves relevance to the model's scores.
- `depth_from=0.5` is theirs (the last 16 of 32 layers, every head: earlier layers made the
  generation unstable); the baseline is the mean over those heads (see above).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dysco_interp.chat import encode_text
from dysco_interp.checks import check_int, check_number
from dysco_interp.decoding.baselines.dysco_variants import middle_layers
from dysco_interp.decoding.methods import Method, register_method
from dysco_interp.decoding.params import MethodParams
from dysco_interp.decoding.plan import Bias, PassPlan, Read

if TYPE_CHECKING:
    from dysco_interp.decoding.methods import Run
    from dysco_interp.decoding.params import RunSettings
    from dysco_interp.decoding.prompts import PromptBatch
    from dysco_interp.heads import HeadSet
    from dysco_interp.models import LoadedModel, ModelSpec

# the neutral document's text: the filler of passkey retrieval's haystack (Mohtashami and Jaggi, 2023)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
MIN_RATIO = 1e-4  # the least share a bucket counts as, as a fraction of its key share


@register_method
class PositionalCalibration(Method):
    name = "pos-calibration"
    description = "Found in the Middle: minus the log of a neutral document's attention share of each position bucket"

    @dataclass(frozen=True)
    class Params(MethodParams):
        strength: float = 1.0  # 1 flattens the neutral document's profile over the buckets; 0 is vanilla decoding
        buckets: int = 16  # buckets of the prompt's content keys, equal in count
        depth_from: float = 0.5  # the first biased layer, as a fraction of the depth (0.5: the last half)

        def check(self) -> None:
            check_number("strength", self.strength, at_least=0)
            check_int("buckets", self.buckets, minimum=1, maximum=4096)
            check_number("depth_from", self.depth_from, at_least=0, below=1)

    def __init__(self, config: RunSettings, heads: HeadSet | None, spec: ModelSpec):
        super().__init__(config, heads, spec)
        params = self.params
        assert isinstance(params, PositionalCalibration.Params)
        self.layers = middle_layers(spec.n_layers, params.depth_from, 1.0)
        self.calibrated = PassPlan(bias=Bias(self.layers))
        self.read = Read([(layer, head) for layer in self.layers for head in range(spec.n_heads)])
        self.values: torch.Tensor | None = None  # float32 [B, 1, 1, width]: each prompt key's bias
        self.baselines: list[torch.Tensor] = []  # float32 [buckets] per row: the neutral shares (tests, analyses)

    def start(self, model: LoadedModel, batch: PromptBatch) -> None:
        params = self.params
        assert isinstance(params, PositionalCalibration.Params)
        if params.strength == 0:
            return
        from dysco_interp.decoding.backends.sdpa import SdpaBackend

        calibrator = SdpaBackend(model)
        filler = torch.tensor(encode_text(model.tokenizer, FILLER)[0], dtype=torch.long)
        special = torch.tensor(sorted(set(model.tokenizer.all_special_ids)), dtype=torch.long)
        values = torch.zeros(batch.ids.shape, dtype=torch.float32)
        done: dict[tuple[int, ...], torch.Tensor] = {}
        for row, pad in enumerate(batch.pads):
            ids = batch.ids[row, pad:]
            content = ~batch.templates["skeleton"][row, pad:] & ~torch.isin(ids, special)
            if not content.any():
                continue  # nothing but template: nothing to calibrate
            neutral = neutral_ids(ids, content, filler)
            key = tuple(neutral.tolist())
            if key not in done:
                done[key] = baseline_shares(neutral_row(calibrator, self.read, neutral), content, params.buckets)
            shares = done[key]
            self.baselines.append(shares)
            bias = bucket_bias(shares, key_shares(content, params.buckets), params.strength)
            values[row, pad:] = key_bias(content, bias)
        self.values = values[:, None, None, :].to(model.device)

    def step(self, run: Run, n_keys: int) -> tuple[torch.Tensor, None]:
        if self.values is None:  # strength 0
            out = run(self.plain)
        else:
            # the prompt's keys as built, none of the generated ones (a negative pad crops a prompt step's)
            values = torch.nn.functional.pad(self.values, (0, n_keys - self.values.shape[-1]))
            out = run(self.calibrated.with_bias(values))
        assert out.logits is not None
        return out.logits, None


def neutral_ids(ids: torch.Tensor, content: torch.Tensor, filler: torch.Tensor) -> torch.Tensor:
    """Long `[n]`: `ids` with its `content` positions (bool `[n]`) given the filler's tokens, tiled
    in order; every other token as it is."""
    out = ids.clone()
    n = int(content.sum())
    out[content] = filler.repeat(-(-n // len(filler)))[:n]
    return out


@torch.inference_mode()
def neutral_row(calibrator, read: Read, neutral: torch.Tensor) -> torch.Tensor:
    """Float32 `[n]`: the mean attention row over `read`'s heads of the last position of the
    token ids `neutral` (one prompt, no pads), on the SDPA twin `calibrator`."""
    device = calibrator.model.device
    state = calibrator.prefill(neutral[None, :-1].to(device), None)
    plan = PassPlan(reads=(read,), stop_after=read.max_layer, write_cache=False)
    out = calibrator.run(state, neutral[-1:].to(device), plan)
    assert out.attention is not None
    return out.attention[0].float().cpu()


def buckets_of(content: torch.Tensor, buckets: int) -> torch.Tensor:
    """Long `[n]`: the bucket of each `content` key (bool `[n]`), the r-th of m in order in bucket
    floor(r * buckets / m); -1 at every other key."""
    out = torch.full(content.shape, -1, dtype=torch.long)
    m = int(content.sum())
    out[content] = torch.arange(m) * buckets // max(m, 1)
    return out


def key_shares(content: torch.Tensor, buckets: int) -> torch.Tensor:
    """Float32 `[buckets]`: each bucket's share of the content keys (0 for an empty bucket)."""
    which = buckets_of(content, buckets)
    counts = torch.bincount(which[content], minlength=buckets).float()
    return counts / counts.sum().clamp_min(1.0)


def baseline_shares(attention: torch.Tensor, content: torch.Tensor, buckets: int) -> torch.Tensor:
    """Float32 `[buckets]`: each bucket's share of an attention row's (float `[n]`) mass on the
    `content` keys (bool `[n]`)."""
    which = buckets_of(content, buckets)
    mass = torch.zeros(buckets, dtype=torch.float64).index_add_(0, which[content], attention[content].double())
    return (mass / mass.sum().clamp_min(1e-30)).float()


def bucket_bias(baseline: torch.Tensor, keys: torch.Tensor, strength: float) -> torch.Tensor:
    """Float32 `[buckets]`: the bias on each bucket's keys, s log(u / b) - log sum b (u / b)^s
    (b the `baseline` shares, u the `keys` shares, s the `strength`; 0 for an empty bucket). The
    neutral row's total mass on the buckets stays what it was; at s = 1 each key of it gets the
    same share."""
    b, u = baseline.double(), keys.double()
    occupied = u > 0
    ratio = torch.where(occupied, (b / u.clamp_min(1e-30)).clamp_min(MIN_RATIO), 1.0)
    b = torch.where(occupied, ratio * u, 0.0)  # the floored shares
    log_gain = -strength * ratio.log()
    norm = torch.logsumexp(torch.where(occupied, b.log() + log_gain, -math.inf), dim=0) \
        - torch.logsumexp(torch.where(occupied, b.log(), -math.inf), dim=0)
    return torch.where(occupied, log_gain - norm, 0.0).float()


def key_bias(content: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Float32 `[n]`: each content key's bucket bias, 0 at the other keys."""
    which = buckets_of(content, len(bias))
    return torch.where(content, bias[which.clamp_min(0)], 0.0)


__all__ = ["FILLER", "PositionalCalibration", "baseline_shares", "bucket_bias", "buckets_of", "key_bias",
           "key_shares", "neutral_ids"]
