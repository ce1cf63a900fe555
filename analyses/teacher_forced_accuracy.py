"""Teacher-forced step accuracy on Path Traversal per context length: the first glimpse of context rot.

A step is right when the gold route's next destination city (every token of its name)
is the argmax given the prompt and the gold answer so far.

    python analyses/teacher_forced_accuracy.py --model smollm2-135m --lengths 1k,2k,4k,8k --n 5 \
        --out figures/teacher_forced_smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--lengths", default="1k,2k,4k,8k")
    p.add_argument("--n", type=int, default=5)
    p.add_argument("--hops", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import torch
    from tqdm.auto import tqdm

    if args.threads:
        torch.set_num_threads(args.threads)
    from dysco_interp.analysis.teacher_forced import path_traversal_step_accuracy
    from dysco_interp.models import load_model
    from dysco_interp.tasks import make_dataset
    from dysco_interp.tasks.common import parse_lengths

    model = load_model(args.model, progress=False)
    rows = []
    for length in parse_lengths(args.lengths):
        data = make_dataset("path_traversal", model.tokenizer, length, n=args.n, seed=args.seed, hops=args.hops, progress=False)
        per_instance = []
        t0 = time.perf_counter()
        for inst in tqdm(data, desc=f"{length} tokens"):
            score = path_traversal_step_accuracy(model, inst)
            per_instance.append({"id": inst.id, "n_tokens": inst.n_tokens, "correct": list(score.correct)})
        steps = [c for r in per_instance for c in r["correct"]]
        by_step = [sum(r["correct"][k] for r in per_instance) / len(per_instance) for k in range(args.hops)]
        row = {"length": length, "n": len(data), "step_accuracy": sum(steps) / len(steps),
               "accuracy_by_step": by_step, "seconds": round(time.perf_counter() - t0, 1), "instances": per_instance}
        rows.append(row)
        print(f"{length:>6} tokens: step accuracy {row['step_accuracy']:.3f} ({sum(steps)}/{len(steps)}), "
              f"by step {[round(x, 2) for x in by_step]}", flush=True)
    out = {"analysis": "teacher-forced step accuracy (path traversal)", "model": args.model, "hops": args.hops,
           "seed": args.seed, "threads": torch.get_num_threads(),
           "command": "python analyses/teacher_forced_accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
