"""From the shared flags to what a decoding command runs: its config, its heads, its model.

Everything that can be refused is refused before the model loads (`check_head_file`), so a
typo costs nothing; loading happens last (`load_model_from_flags`).
"""

from __future__ import annotations

import contextlib
import sys

from dysco_interp.errors import ConfigError


def decoding_config(args, method: str):
    """The DecodingConfig of `method` from --preset, its overrides, --tau and the sampling flags."""
    from dysco_interp.decoding.config import preset
    from dysco_interp.decoding.methods import REGISTRY
    from dysco_interp.decoding.sampling import SamplingConfig

    if "tau" in REGISTRY[method].fields and args.tau is None:
        # the old default, tau 1, leaves every attention score as it is: uniattns would be vanilla
        raise ConfigError(
            f"{method} needs --tau, its attention temperature: tau 1 leaves attention unchanged, which is "
            "vanilla decoding; the paper picks tau per model on MRCR (see the README)"
        )
    changes = {
        "method": method,
        "max_new_tokens": args.max_new_tokens,
        "head_seed": args.head_seed,
        "sampling": SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed),
    }
    changes.update(dysco_overrides(args))
    if args.tau is not None:
        changes["tau"] = args.tau
    return preset(args.preset, **changes)


def dysco_overrides(args) -> dict:
    """The preset fields that --beta, --p, --k and the selection flags override, where given."""
    given = (("beta", args.beta), ("top_p", args.nucleus_p), ("top_k", args.nucleus_k),
             ("top_k_fraction", args.top_k_fraction), ("schedule", args.schedule),
             ("template_masking", args.template_masking))
    return {field: value for field, value in given if value is not None}


def check_backend_flags(args) -> None:
    """--decode-attention only with the backend it belongs to."""
    if args.decode_attention is not None and args.backend != "static":
        raise ConfigError(f"--decode-attention sets the static backend's decoding attention; add --backend static "
                          f"(the {args.backend} backend has none)")


def check_head_file(arg: str, model: str, allow_other_model: bool = False) -> None:
    """Parse a head file before the model loads (a typo or a malformed file costs nothing);
    the check against the model's geometry comes after the load, in `resolve_heads`."""
    from dysco_interp.heads import SHIPPED, resolve_heads
    from dysco_interp.models import packaged as packaged_models

    # an alias is the name shipped files go by; other models' names are known after the load
    if arg != SHIPPED or model in packaged_models.REGISTRY or model.startswith("tiny-"):
        resolve_heads(model, arg, allow_other_model)


def load_model_from_flags(args):
    """The model of --model on --device or --devices, at --dtype (--yarn where the command has
    it), after --threads."""
    import torch

    from dysco_interp.models import load_model

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # load_model reports on stdout; that is status, not output (`generate --json` prints only JSON)
    with contextlib.redirect_stdout(sys.stderr):
        return load_model(args.model, device=args.device, dtype=args.dtype, yarn_factor=args.yarn,
                          devices=getattr(args, "devices", None))
