"""Path Traversal scorers: LongProc's published metrics and the step accuracy without their credit.

The metrics follow LongProc's published `eval_path_traversal`, including its partial-accuracy
credit for the first wrong line; `step_accuracy` is the corrected variant without that credit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dysco_interp.tasks.path_traversal.instance import PathTraversalInstance
from dysco_interp.tasks.path_traversal.longproc import ROUTE_CLOSE, ROUTE_OPEN


def extract_route(response: str) -> str | None:
    """Text between the first '<Route>' and the first '</Route>', stripped (LongProc's parser).

    None when either tag is missing. As in LongProc, a closing tag before the opening one
    yields an empty string.
    """
    start = response.find(ROUTE_OPEN)
    end = response.find(ROUTE_CLOSE)
    if start == -1 or end == -1:
        return None
    return response[start + len(ROUTE_OPEN) : end].strip()


def longproc_metrics(prediction: str, reference: str) -> dict[str, float]:
    """LongProc's published path-traversal metrics: accuracy, partial_accuracy, extraction_rate.

    partial_accuracy is (index of the first wrong line + 1) / gold lines: it credits the first
    wrong line. When no line differs over the shorter of the two lists it is
    min(pred lines, gold lines) / gold lines.
    """
    parsed = extract_route(prediction)
    if parsed is None:
        return {"accuracy": 0.0, "partial_accuracy": 0.0, "extraction_rate": 0.0}
    gold = reference.strip()
    if parsed == gold:
        return {"accuracy": 1.0, "partial_accuracy": 1.0, "extraction_rate": 1.0}
    gold_lines, pred_lines = gold.split("\n"), parsed.split("\n")
    n_compared = min(len(gold_lines), len(pred_lines))
    first_wrong = next((i for i in range(n_compared) if gold_lines[i] != pred_lines[i]), n_compared - 1)
    return {"accuracy": 0.0, "partial_accuracy": (first_wrong + 1) / len(gold_lines), "extraction_rate": 1.0}


@dataclass(frozen=True)
class RouteScore:
    accuracy: float  # exact route (LongProc)
    partial_accuracy: float  # LongProc, with its +1 credit
    step_accuracy: float  # gold steps right before the first error / gold steps
    extraction_rate: float  # 1.0 when both tags were found
    n_correct_steps: int
    first_error_step: int | None  # 0-based gold step of the first error; None if all gold steps right
    parsed: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def score_route(prediction: str, reference: str | PathTraversalInstance) -> RouteScore:
    """All route metrics for one model output against the gold answer (text or instance)."""
    gold_text = reference.answer_nl if isinstance(reference, PathTraversalInstance) else reference
    lp = longproc_metrics(prediction, gold_text)
    parsed = extract_route(prediction)
    gold_lines = gold_text.strip().split("\n")
    if parsed is None:
        n_ok = 0
    else:
        pred_lines = parsed.split("\n")
        n_ok = 0
        while n_ok < min(len(gold_lines), len(pred_lines)) and gold_lines[n_ok] == pred_lines[n_ok]:
            n_ok += 1
    return RouteScore(
        accuracy=lp["accuracy"],
        partial_accuracy=lp["partial_accuracy"],
        step_accuracy=n_ok / len(gold_lines),
        extraction_rate=lp["extraction_rate"],
        n_correct_steps=n_ok,
        first_error_step=None if n_ok == len(gold_lines) else n_ok,
        parsed=parsed,
    )
