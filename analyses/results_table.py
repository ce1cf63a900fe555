"""Tables of stored evaluation records (any task): mean metrics per model, length and method.

    python analyses/results_table.py figures/path_traversal/*.jsonl --out figures/path_traversal/table
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--out", required=True, help="path stem: writes STEM.md and STEM.json")
    args = p.parse_args(argv)

    from dysco_interp.evaluate import ADAPTERS
    from dysco_interp.runner import ResultStore

    groups: dict[tuple, list[dict]] = defaultdict(list)
    for f in args.files:
        for r in ResultStore(f).records():
            label = r["method"] if r["method"] != "uniattns" else f"uniattns (tau {r['config']['tau']})"
            groups[(r["model"], r["task"], r["length"], label)].append(r)
    rows = []
    for (model, task, length, method), recs in sorted(groups.items()):
        metrics = ADAPTERS[task].metrics
        rows.append({"model": model, "task": task, "length": length, "method": method, "n": len(recs),
                     **{m: round(sum(float(r[m]) for r in recs) / len(recs), 4) for m in metrics}})
    metric_names = [k for k in rows[0] if k not in ("model", "task", "length", "method", "n")] if rows else []
    lines = ["| model | task | length | method | n | " + " | ".join(metric_names) + " |",
             "|---" * (5 + len(metric_names)) + "|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['task']} | {r['length']} | {r['method']} | {r['n']} | "
                     + " | ".join(f"{r.get(m, float('nan')):.3f}" for m in metric_names) + " |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    Path(args.out + ".json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
