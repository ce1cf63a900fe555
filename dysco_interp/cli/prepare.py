"""From the shared flags to what a decoding command runs: its config, its heads, its model.

Everything that can be refused is refused before the model loads (`check_head_file`), so a
typo costs nothing; loading happens last (`load_model_from_flags`).
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

from dysco_interp.decoding.choices import backends_with
from dysco_interp.errors import ConfigError

if TYPE_CHECKING:
    from dysco_interp.decoding.backends import BackendSpec


def decoding_config(args, method: str):
    """The DecodingConfig of `method` from --preset, its overrides, --tau, its --method-options and
    the sampling flags."""
    from dysco_interp.decoding.config import preset, with_flat
    from dysco_interp.decoding.methods import REGISTRY
    from dysco_interp.decoding.sampling import SamplingConfig

    if "tau" in REGISTRY[method].fields and args.tau is None:
        # the old default, tau 1, leaves every attention score as it is: uniattns would be vanilla
        raise ConfigError(
            f"{method} needs --tau, its attention temperature: tau 1 leaves attention unchanged, which is "
            "vanilla decoding; the paper picks tau per model on MRCR (figures/README.md gives the values "
            "chosen for the Qwen models)"
        )
    config = preset(args.preset, method=method, max_new_tokens=args.max_new_tokens,
                    sampling=SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed))
    # one flag for every method of --methods: a method without the parameter keeps it unowned
    flat = {"head_seed": args.head_seed, **dysco_overrides(args)}
    if args.tau is not None:
        flat["tau"] = args.tau
    config = with_flat(config, flat)
    # --params, checked against the method's Params when the command line was read
    return config.with_params(**args.method_options.get(method, {}))


def dysco_overrides(args) -> dict:
    """The preset fields that --beta, --select-p, --select-k and the selection flags override, where given."""
    given = (("beta", args.beta), ("top_p", args.select_p), ("top_k", args.select_k),
             ("top_k_fraction", args.top_k_fraction), ("schedule", args.schedule),
             ("template_masking", args.template_masking))
    return {field: value for field, value in given if value is not None}


def preset_words(args) -> str:
    """'preset NAME' and what its flags override, e.g. 'preset small-budget (beta 3)': how every
    summary names DySCO's parameters."""
    changed = ", ".join(f"{field} {value}" for field, value in dysco_overrides(args).items())
    return f"preset {args.preset}" + (f" ({changed})" if changed else "")


def backend_from_flags(args) -> BackendSpec:
    """--backend and --decode-attention as one `BackendSpec` (--decode-attention only with the
    backend it belongs to, refused before torch is imported)."""
    owners = backends_with("decode_attention")
    if args.decode_attention is not None and args.backend not in owners:
        raise ConfigError(f"--decode-attention sets the {' or '.join(owners)} backend's decoding attention; add "
                          f"--backend {owners[0]} (the {args.backend} backend has none)")
    from dysco_interp.decoding.backends import BackendSpec

    return BackendSpec(args.backend, decode_attention=args.decode_attention)


def check_head_file(arg: str, model: str, allow_other_model: bool = False) -> str | None:
    """Parse a head file before the model loads (a typo or a malformed file costs nothing), and
    check it against the model's geometry where its config tells that without the weights
    (tiny models, converted registry models, local folders); else that check comes after the
    load, in `heads_from_flags`. Where the heads are known now and fit the model by its name too:
    the line naming them and their origin (`describe_heads`), which `load_model_from_flags` prints
    first; else None, and `heads_from_flags` prints it once the weights decide (a refused file
    stays one line of error)."""
    from dysco_interp.heads import SHIPPED, HeadModelMismatchError, describe_heads, resolve_heads_origin
    from dysco_interp.models import model_spec
    from dysco_interp.models import packaged as packaged_models

    # an alias is the name shipped files go by; other models' names are known after the load
    if arg != SHIPPED or model in packaged_models.REGISTRY or model.startswith("tiny-"):
        spec = model_spec(model)
        # without the weights a file made under another name may still fit (`HeadSet.validate_for`
        # recognises an alias's weights): only its geometry and indices are checked here
        heads, origin = resolve_heads_origin(spec or model, arg, allow_other_model or spec is not None,
                                             label=heads_label(arg))
        if spec is None:
            return None
        if not allow_other_model:
            try:
                resolve_heads_origin(spec, arg, False, label=heads_label(arg))
            except HeadModelMismatchError:
                return None
        return describe_heads(heads, origin)
    return None


def heads_from_flags(model, args, announced: bool):
    """The HeadSet of --heads for the loaded model, checked against its weights; the line naming
    it is printed here unless it was printed before the load (`announced`)."""
    from dysco_interp.heads import describe_heads, resolve_heads_origin

    heads, origin = resolve_heads_origin(model, args.heads, args.allow_other_model, label=heads_label(args.heads))
    if not announced:
        print(describe_heads(heads, origin), file=sys.stderr)
    return heads


def heads_label(arg: str) -> str:
    """How errors name the heads of --heads ARG (a file names itself)."""
    return f"--heads {arg}"


def context_window(model: str, yarn: float | None) -> tuple[int, str] | None:
    """The tokens (prompt and new ones) the model can hold, and how to say so, read from its
    config without loading it (times the --yarn factor); None when that needs the weights."""
    from dysco_interp.models import context_length
    from dysco_interp.models.yarn import scaled_context

    context = context_length(model)
    if context is None:
        return None
    limit = scaled_context(context, yarn)
    words = f"{model}'s {context}-token context" + (f" x {yarn:g} (YaRN) = {limit} tokens" if yarn else "")
    return limit, words


def check_prompt_fits(args, prompt: str) -> None:
    """ContextLengthError before the model loads when the prompt's tokens (the chat template
    applied, as --no-chat does not) plus --max-new-tokens exceed the model's context; checked
    where the context is known without the weights, with the tokenizer alone."""
    from dysco_interp.chat import count_chat_tokens
    from dysco_interp.errors import ContextLengthError
    from dysco_interp.models import load_tokenizer

    window = context_window(args.model, args.yarn)
    if window is None:
        return
    limit, words = window
    with contextlib.redirect_stdout(sys.stderr):
        tokenizer = load_tokenizer(args.model, progress=False)
    if args.chat and getattr(tokenizer, "chat_template", None) is None:
        return  # refused in its own words when the prompt is prepared
    # without the template: the text's own tokens, a lower bound of what the model is fed (BOS aside)
    n = (count_chat_tokens(tokenizer, prompt) if args.chat
         else len(tokenizer(prompt, add_special_tokens=False)["input_ids"]))
    if n + args.max_new_tokens > limit:
        more = "a larger --yarn" if args.yarn else "--yarn FACTOR"
        raise ContextLengthError(
            f"the prompt is {n} tokens{' with the chat template' if args.chat else ''}; with --max-new-tokens "
            f"{args.max_new_tokens} it needs {n + args.max_new_tokens}, more than {words}: shorten it, pass a "
            f"smaller --max-new-tokens, or {more}")


def load_model_from_flags(args, first_line: str | None = None):
    """The model of --model on --device or --devices, at --dtype (--yarn where the command has
    it), with the CPU threads of --threads, OMP_NUM_THREADS or the free cores (`threads`);
    `first_line` (the heads of `check_head_file`) goes to stderr before the load's status."""
    from dysco_interp.models import load_model
    from dysco_interp.threads import apply_threads

    apply_threads(args.threads)
    if first_line is not None:
        print(first_line, file=sys.stderr)
    # load_model reports on stdout; that is status, not output (`generate --json` prints only JSON)
    with contextlib.redirect_stdout(sys.stderr):
        return load_model(args.model, device=args.device, dtype=args.dtype, yarn_factor=args.yarn,
                          devices=getattr(args, "devices", None))
