"""Path Traversal in LongProc's format, scaled to a target prompt length, with exact spans.

The task (Ye et al. 2025, LongProc; used by the DySCO paper): a list of one-way edges
"X is a lively city. You can travel from X to Y by T." and a question "route from A to B".
Every city has at most one outgoing edge, so the route is unique; the model must chain
edge look-ups and write one line per step inside <Route> ... </Route>.

- `longproc`: LongProc's text format (edge sentences, user prompt, gold answer).
- `graph`: the route graph, sampled as LongProc's are, and its shape statistics.
- `instance`: `PathTraversalInstance`, a rendered prompt with every span.
- `generate`: instances of a target prompt length, fixed by the seed.
- `score`: LongProc's published metrics and the uncredited step accuracy.
- `teacher_forcing`: per-step accuracy from one forward pass over the gold answer.
"""

from dysco_interp.tasks.path_traversal.generate import (
    DEFAULT_HOPS,
    LONGPROC_HOPS,
    NAME_POOL,
    generate_graph,
    generate_instance,
    resolve_hops,
)
from dysco_interp.tasks.path_traversal.graph import TOPOLOGIES, RouteGraph, follow_route, graph_statistics, sample_graph
from dysco_interp.tasks.path_traversal.instance import TASK, PathTraversalInstance, build_instance, from_longproc
from dysco_interp.tasks.path_traversal.longproc import (
    CONTEXT_OFFSET,
    EDGE_TEMPLATE,
    PROBLEM_DESCRIPTION,
    QUESTION_TEMPLATE,
    ROUTE_CLOSE,
    ROUTE_OPEN,
    STEP_TEMPLATE,
    TRANSIT_METHODS,
    USER_PROMPT,
    Edge,
    answer_segments,
    format_answer,
    format_context,
    format_prompt,
    gold_completion,
)
from dysco_interp.tasks.path_traversal.score import RouteScore, extract_route, longproc_metrics, score_route
from dysco_interp.tasks.path_traversal.teacher_forcing import (
    TeacherForcedInputs,
    TeacherForcedScore,
    forced_step_scores,
    teacher_forced_inputs,
    teacher_forced_step_accuracy,
)

__all__ = [
    "CONTEXT_OFFSET",
    "DEFAULT_HOPS",
    "EDGE_TEMPLATE",
    "LONGPROC_HOPS",
    "NAME_POOL",
    "PROBLEM_DESCRIPTION",
    "QUESTION_TEMPLATE",
    "ROUTE_CLOSE",
    "ROUTE_OPEN",
    "STEP_TEMPLATE",
    "TASK",
    "TOPOLOGIES",
    "TRANSIT_METHODS",
    "USER_PROMPT",
    "Edge",
    "PathTraversalInstance",
    "RouteGraph",
    "RouteScore",
    "TeacherForcedInputs",
    "TeacherForcedScore",
    "answer_segments",
    "build_instance",
    "extract_route",
    "follow_route",
    "format_answer",
    "format_context",
    "format_prompt",
    "from_longproc",
    "generate_graph",
    "generate_instance",
    "gold_completion",
    "graph_statistics",
    "longproc_metrics",
    "resolve_hops",
    "sample_graph",
    "score_route",
    "teacher_forced_inputs",
    "forced_step_scores",
    "teacher_forced_step_accuracy",
]
