"""How far the static backend's fast decoding paths are from its float32 reference on a real model.

Per prompt length: a long real-text prompt (this package's own source and a question), then each
path's logits and QRHead relevance against the float32 reference with the same DySCO bias, and
with --tokens N, where each path's N greedy tokens (vanilla and DySCO) first leave the
TransformerLens bridge's (dysco_interp/analysis/decode_exactness.py says what is compared and why).

    python analyses/decode_exactness.py --model qwen2.5-coder-1.5b --device cuda --dtype bfloat16 \
        --lengths 8192,30720 --tokens 64 --out figures/exactness/qwen2.5-coder-1.5b_bf16.json
"""

from __future__ import annotations

import sys

from dysco_interp.analysis.bench import provenance
from dysco_interp.analysis.decode_exactness import compare_paths, source_prompt, token_agreement
from dysco_interp.analysis.report import command_line, write_json
from dysco_interp.cli import args as cli_args
from dysco_interp.heads import resolve_heads
from dysco_interp.models import dtype_name, load_model


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--heads", default="shipped", help="head file or 'shipped'")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--lengths", type=cli_args.positive_ints, default="8192",
                   help="prompt lengths in tokens, comma-separated")
    p.add_argument("--tokens", type=int, default=0,
                   help="also greedy-decode this many tokens on every path and the bridge (0: not)")
    p.add_argument("--out", type=cli_args.output_file, default="figures/exactness/decode_exactness.json")
    args = p.parse_args(argv)
    if args.tokens < 0:
        p.error("--tokens is 0 or more")
    model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False)
    heads = resolve_heads(model, args.heads)
    rows, tokens = {}, {}
    for n in args.lengths:
        ids = source_prompt(model, n)
        rows[str(n)] = compare_paths(model, heads, ids)
        print(n, rows[str(n)], flush=True)
        if args.tokens:
            tokens[str(n)] = token_agreement(model, heads, ids, args.tokens)
            print(n, tokens[str(n)], flush=True)
    write_json(args.out, {
        "model": args.model, "dtype": dtype_name(model.dtype), "heads": args.heads, **provenance(model.device),
        "command": command_line("analyses/decode_exactness.py", argv if argv is not None else sys.argv[1:]),
        "lengths": rows, **({"tokens": tokens} if args.tokens else {}),
    })
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
