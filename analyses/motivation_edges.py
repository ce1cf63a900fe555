"""QRHeads vs random heads on Path Traversal under teacher forcing, per context length.

For each gold step: does the gold edge rank in the top 5% of edges by the heads' summed
attention, and how much attention mass does it get? QRHeads are the shipped head file;
random heads are the mean of 5 seeded draws of the same size.

    python analyses/motivation_edges.py --model qwen2.5-coder-0.5b --lengths 1k,2k --n 5 \
        --out figures/motivation_edges_qwen2.5-coder-0.5b.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--lengths", default="1k,2k,4k,8k")
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draws", type=int, default=5)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import torch
    from tqdm.auto import tqdm

    from dysco_interp.analysis.edge_attention import teacher_forced_edge_attention
    from dysco_interp.heads import random_like, shipped_heads
    from dysco_interp.models import load_model
    from dysco_interp.tasks import make_dataset
    from dysco_interp.tasks.common import parse_lengths

    model = load_model(args.model, progress=False)
    qr = shipped_heads(args.model, spec=model.spec)
    randoms = [random_like(qr, model.spec, seed=args.seed + i) for i in range(args.draws)]
    rows = []
    for length in parse_lengths(args.lengths):
        data = make_dataset("path_traversal", model.tokenizer, length, n=args.n, seed=args.seed, progress=False)
        top = {"qrheads": [], "random": []}
        mass = {"qrheads": [], "random": []}
        for inst in tqdm(data, desc=f"{length} tokens"):
            att = teacher_forced_edge_attention(model, inst)
            top["qrheads"] += att.gold_in_top(qr).float().tolist()
            mass["qrheads"] += att.gold_mass(qr).tolist()
            top["random"] += torch.stack([att.gold_in_top(r).float() for r in randoms]).mean(0).tolist()
            mass["random"] += torch.stack([att.gold_mass(r) for r in randoms]).mean(0).tolist()
        row = {"length": length, "n": len(data), "steps": len(top["qrheads"])}
        for name in ("qrheads", "random"):
            t, m = torch.tensor(top[name]), torch.tensor(mass[name])
            row[name] = {"gold_in_top5pct": round(float(t.mean()), 4), "gold_mass": round(float(m.mean()), 5),
                         "gold_mass_sem": round(float(m.std() / len(m) ** 0.5), 5)}
        rows.append(row)
        print(f"{length:>6}: top-5% QRHeads {row['qrheads']['gold_in_top5pct']:.2f} vs random "
              f"{row['random']['gold_in_top5pct']:.2f}; gold mass {row['qrheads']['gold_mass']:.4f} vs "
              f"{row['random']['gold_mass']:.4f}", flush=True)
    out = {"analysis": "gold-edge attention under teacher forcing", "model": args.model, "heads": qr.labels(),
           "random_draws": args.draws, "command": "python analyses/motivation_edges.py " + " ".join(
               argv if argv is not None else sys.argv[1:]), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
