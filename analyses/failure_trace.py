"""Where DySCO's relevance went while a route went wrong: a per-step trace of one failure.

For one stored DySCO record (evaluate --keep-trace), lists each decode step's token, the
number of keys selected, their relevance mass, and the three most relevant edge lines,
marking the gold route's edges.

    python analyses/failure_trace.py --results figures/traced_runs/qwen2.5-coder-0.5b_2k_vanilla_dysco.jsonl \
        --data DATA.jsonl --model qwen2.5-coder-0.5b --index 0 --out figures/traced_runs/failure_trace_0.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import user_methods
from dysco_interp.errors import ConfigError
from dysco_interp.studies.study_arguments import print_reports


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", required=True)
    p.add_argument("--data", required=True, help="the path traversal JSONL the results were made from")
    user_methods.add_methods_from_flag(p)
    p.add_argument("--model", required=True, help="for its tokenizer")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--out", type=cli_args.output_file, required=True)
    args = p.parse_args(argv)
    return print_reports("failure_trace", lambda: trace(args))


def trace(args) -> list[str]:
    """Write the trace of one failure to --out; the lines to print. Refusals are ConfigErrors."""
    from dysco_interp.analysis.records import read_records
    from dysco_interp.models import load_tokenizer
    from dysco_interp.stores.archives import stored
    from dysco_interp.tasks import load_dataset

    inst = next((x for x in load_dataset(args.data) if x.index == args.index), None)
    if inst is None or not hasattr(inst, "gold_edge_indices"):
        raise ConfigError(f"{args.data} holds no Path Traversal instance of index {args.index}")
    recs = {r["method"]: r for r in read_records(stored(args.results)) if r["index"] == args.index}
    dysco = recs.get("dysco")
    if dysco is None or not isinstance(dysco.get("trace"), dict):
        raise ConfigError(f"{args.results} holds no DySCO record of index {args.index} with a trace "
                          "(evaluate --keep-trace writes them)")
    tok = load_tokenizer(args.model)
    gold = {f"edge{i}": k for k, i in enumerate(inst.gold_edge_indices)}
    rows = []
    for s in [s for s in dysco["trace"]["steps"] if s["phase"] == "decode"][: args.steps]:
        tops = [(name, mass, gold.get(name)) for name, mass in (s["top_spans"] or [])]
        rows.append({"token": tok.decode([s["token"]]), "n_selected": s["n_selected"], "mass": s["nucleus_mass"],
                     "top_edges": [{"edge": inst.edge_lines[int(n[4:])], "mass": m, "gold_step": g}
                                   for n, m, g in tops]})
    out = {"instance": inst.id, "question": inst.question_nl, "gold": inst.answer_nl,
           "vanilla": recs.get("vanilla", {}).get("output"), "dysco": dysco["output"], "steps": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    lines = [f"question: {inst.question_nl}\ngold:\n{inst.answer_nl}\nvanilla:\n{out['vanilla']}\n"
             f"dysco:\n{dysco['output']}\n"]
    for i, r in enumerate(rows):
        top = "; ".join(f"{'*' if e['gold_step'] is not None else ''}{e['edge'][:60]} ({e['mass']:.3f})"
                        for e in r["top_edges"])
        lines.append(f"{i:>3} {r['token']!r:>14} sel={r['n_selected']:<5} mass={r['mass']:.2f}  {top}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
