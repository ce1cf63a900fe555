"""The equivalence margins: per metric, the largest change to it that still counts as "no change".

A "does not hurt" or "changes nothing" sentence needs an equivalence test (`analysis.equivalence`),
and that test needs a margin fixed before the data are looked at through it. These were set once,
before any committed table was put through the test, from each metric's scale and from the
smallest effects this project reports as findings (git shows the order):

- mean per-token log-probability of a gold answer (`tf_logprob`): 0.03 nats, about a 3% change in
  the answer's per-token probability. The smallest log p changes the tables call findings are
  three or more times this (small-budget on Path Traversal at 31K, the 127K MRCR losses).
- the gold city's log-probability on Path Traversal (`tf_city_logprob`, summed over the city's
  tokens, a few tokens per city): 0.1 nats.
- shares of instances, steps or tokens (accuracies, partial accuracy, extraction rate, exact
  match, contained answers, MRCR's similarity score): 0.03 for Path Traversal's routes and steps,
  whose findings are +0.05 to +0.08; 0.02 for token accuracy and MRCR's score, which move in
  smaller units; 0.05 for exact match, contained answers and extraction, where one of 20-50
  instances is already 0.02-0.05.

A metric without a margin here gets no equivalence test: its tables say nothing about "no change".
"""

from __future__ import annotations

EQUIVALENCE_MARGINS: dict[str, float] = {
    "tf_logprob": 0.03,
    "tf_city_logprob": 0.1,
    "tf_token_accuracy": 0.02,
    "tf_step_accuracy": 0.03,
    "tf_exact": 0.05,
    "accuracy": 0.03,
    "partial_accuracy": 0.03,
    "step_accuracy": 0.03,
    "extraction_rate": 0.05,
    "exact_match": 0.05,
    "contains": 0.05,
    "score": 0.02,
}
# the level of every equivalence claim: "equivalent" when the TOST's BH q over its table is below it
EQUIVALENCE_LEVEL = 0.05


def margin_of(metric: str) -> float | None:
    """The metric's equivalence margin, or None where no equivalence is ever claimed."""
    return EQUIVALENCE_MARGINS.get(metric)
