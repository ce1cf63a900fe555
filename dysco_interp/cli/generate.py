"""`dysco-interp generate`: generate from one prompt with one decoding method."""

from __future__ import annotations

import argparse
import json

from dysco_interp.cli import flags
from dysco_interp.cli.prepare import (
    backend_from_flags,
    check_head_file,
    check_prompt_fits,
    decoding_config,
    heads_from_flags,
    load_model_from_flags,
    preset_words,
)
from dysco_interp.decoding.choices import METHOD_NAMES
from dysco_interp.errors import ConfigError, DataError


def add_generate_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "generate", help="generate from a prompt with one decoding method",
        description="Generate from one prompt with one decoding method (vanilla by default; --method dysco "
                    "for DySCO) and print the text, the keys DySCO selected per step and the timings.")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", default=None, help="the prompt text (one user turn)")
    given.add_argument("--prompt-file", default=None, help="a UTF-8 text file holding the prompt")
    p.add_argument("--no-chat", dest="chat", action="store_false",
                   help="feed the prompt as it is, tokenized as TransformerLens' to_tokens does (BOS as it adds "
                        "it); by default the prompt is one user turn in the model's chat template")
    flags.add_model_flag(p)
    flags.add_device_flags(p)
    flags.add_split_flag(p)
    flags.add_generation_flags(p)
    flags.add_method_flags(p, multi=False)
    p.set_defaults(func=run_generate)
    return p


def read_prompt_file(path: str) -> str:
    """The text of --prompt-file; a missing, folder, unreadable, non-UTF-8 or empty file is a DataError."""
    from dysco_interp.jsonl import open_input, read_whole

    with open_input(path, "--prompt-file {path}: no such file", "--prompt-file {path} is a folder; name a text file",
                    "--prompt-file {path}: cannot read it ({why})",
                    "--prompt-file {path} is {kind}, not a regular file; name a text file") as f:
        data = read_whole(f, f"--prompt-file {path}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(
            f"--prompt-file {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None
    if not text.strip():
        raise DataError(f"--prompt-file {path} is empty")
    return text


def run_generate(args) -> int:
    if args.prompt is not None:
        prompt = args.prompt
        if not prompt.strip():
            raise ConfigError("--prompt is empty")
    else:
        prompt = read_prompt_file(args.prompt_file)
    return generate_and_print(args, prompt)


def generate_and_print(args, prompt: str) -> int:
    import torch

    from dysco_interp.decoding.loop import generate
    from dysco_interp.experiments.demo import selection_text

    backend = backend_from_flags(args)
    config = decoding_config(args, args.method)
    heads_line = check_head_file(args.heads, args.model, args.allow_other_model) if config.uses_heads else None
    check_prompt_fits(args, prompt)
    model = load_model_from_flags(args, heads_line)
    heads = heads_from_flags(model, args, heads_line is not None) if config.uses_heads else None
    result = generate(model, prompt, config, heads=heads, backend=backend, chat=args.chat)
    if args.json:
        print(json.dumps({"model": args.model, "method": args.method,
                          "preset": args.preset if config.uses_heads else None, "options": dict(config.options),
                          "text": result.text, "tokens": result.tokens, "prompt_text": result.prompt_text,
                          "threads": torch.get_num_threads(), **result.timings.as_dict()}))
        return 0
    t = result.timings
    print(f"\nprompt> {prompt if len(prompt) < 400 else prompt[:200] + ' ... ' + prompt[-150:]}")
    tag = f"{args.method}, {preset_words(args)}" if config.uses_heads else args.method
    if config.options:
        tag += f", options {json.dumps(dict(config.options))}"
    print(f"{args.model} [{tag}]> {result.text}\n")
    assert result.trace is not None  # dysco_generate always records one
    selected = [s.n_selected for s in result.trace.decode_steps() if s.n_selected is not None]
    if selected:
        words = selection_text(selected)
        if args.method not in METHOD_NAMES:  # a method of one's own selects keys in its own name
            words = args.method + words.removeprefix("DySCO")
        print(words + (f", {preset_words(args)}" if config.uses_heads else ""))
    print(
        f"prompt {t.n_prompt} tokens, prefill {t.prefill_s:.2f}s; generated {t.n_new} tokens "
        f"({'end of sequence' if result.finished else 'token budget'}), decode {t.decode_tok_per_s:.1f} tok/s "
        f"on {', '.join(map(str, model.layout.devices))} ({model.dtype}, {torch.get_num_threads()} threads)"
    )
    return 0
