"""The main job: vanilla vs DySCO on one seeded Path Traversal instance, with an attention replay.

`run_demo` generates the instance for the model's tokenizer, decodes it greedily with both
methods (one shared prefill), scores both routes against the gold one, and replays every
generated token's per-edge attention (`analysis/replay.py`); `format_report` prints it and
`replay_view.write_replay_html` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dysco_interp.analysis.replay import AttentionReplay, replay_path_traversal
from dysco_interp.checks import check_int, check_type
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.results import GenerationResult
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel
from dysco_interp.tasks.path_traversal import PathTraversalInstance, RouteScore, generate_instance, score_route

ANSWER_MARGIN = 8  # new tokens beyond the gold answer's length: room to close the route


@dataclass
class DemoResult:
    model: str
    instance: PathTraversalInstance
    heads: HeadSet
    results: dict[str, GenerationResult]  # "vanilla", "dysco"
    scores: dict[str, RouteScore]
    replays: dict[str, AttentionReplay]

    @property
    def title(self) -> str:
        inst = self.instance
        return (f"Attention replay: {self.model}, Path Traversal {inst.n_tokens} tokens, {inst.n_edges} edges, "
                f"{inst.n_hops} hops (seed {inst.seed})\ngold route: {' → '.join(gold_cities(inst))}")


def gold_cities(instance: PathTraversalInstance) -> list[str]:
    steps = [instance.edges[i] for i in instance.gold_edge_indices]
    return [steps[0].src] + [e.dst for e in steps]


def run_demo(
    model: LoadedModel,
    heads: HeadSet,
    *,
    length: int = 1024,
    seed: int = 0,
    hops: int = 4,
    dysco: DecodingConfig | None = None,
    max_new_tokens: int | None = None,
    progress: bool = True,
) -> DemoResult:
    """Vanilla and DySCO (paper parameters unless `dysco` says otherwise) on one instance.

    `max_new_tokens` defaults to the gold answer's length plus a small margin.
    """
    from dysco_interp.decoding.loop import compare_methods
    from dysco_interp.progress import tqdm

    if max_new_tokens is not None:
        check_int("max_new_tokens", max_new_tokens, minimum=1)  # 0 used to mean "the default"
    dysco = DecodingConfig() if dysco is None else dysco
    check_type("dysco", dysco, DecodingConfig)
    check_type("heads", heads, HeadSet)
    if not dysco.uses_heads:
        raise ConfigError(f"the demo compares vanilla with a DySCO method, got {dysco.method!r}")
    with tqdm(total=4, desc="demo", unit="stage", disable=not progress) as bar:
        bar.set_postfix_str("making the instance")
        instance = generate_instance(model.tokenizer, length, seed=seed, hops=hops)
        budget = instance.completion_n_tokens + ANSWER_MARGIN if max_new_tokens is None else max_new_tokens
        configs = {
            "vanilla": DecodingConfig(method="vanilla", max_new_tokens=budget),
            "dysco": dysco.replace(max_new_tokens=budget, record_positions=True),
        }
        bar.update()
        bar.set_postfix_str(f"decoding {budget} tokens, vanilla and DySCO")
        results = compare_methods(model, instance.prompt, configs, heads)
        bar.update()
        replays = {}
        for name, result in results.items():
            bar.set_postfix_str(f"replaying {name}")
            replays[name] = replay_path_traversal(model, instance, result, heads)
            bar.update()
    scores = {name: score_route(r.text, instance) for name, r in results.items()}
    return DemoResult(model.spec.name, instance, heads, results, scores, replays)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.strip("\n").split("\n")) if text.strip() else "    (empty)"


def _score_line(score: RouteScore, n_hops: int) -> str:
    exact = "exact route" if score.accuracy == 1.0 else "not exact"
    tags = "" if score.extraction_rate else ", no <Route> ... </Route> found"
    return (f"{exact}, {score.n_correct_steps}/{n_hops} steps right before the first error "
            f"(LongProc partial accuracy {score.partial_accuracy:.2f}){tags}")


def format_report(demo: DemoResult, html_path: str | Path | None = None) -> str:
    """What the demo prints: the instance, the gold route, both routes with their scores."""
    inst = demo.instance
    more = ", ..." if len(demo.heads) > 6 else ""
    lines = [
        f"Path Traversal {inst.id}: {inst.n_tokens} prompt tokens, {inst.n_edges} edges, {inst.n_hops} hops",
        f"question: {inst.question_nl}",
        f"DySCO heads: {len(demo.heads)} QRHeads ({', '.join(demo.heads.labels()[:6])}{more})",
        "",
        "gold route:",
        _indent(inst.answer_nl),
    ]
    for name, result in demo.results.items():
        t = result.timings
        stop = "end of sequence" if result.finished else "token budget"
        lines += ["", f"{name}: {_score_line(demo.scores[name], inst.n_hops)}",
                  f"  {t.n_new} tokens ({stop}), {t.decode_tok_per_s:.1f} tok/s"]
        steps = result.trace.decode_steps() if result.trace is not None else []
        selected = [s.n_selected for s in steps if s.n_selected is not None]
        if selected:
            lines[-1] += (f"; DySCO selected {min(selected)}-{max(selected)} of ~{inst.n_tokens} keys per step "
                          f"(mean {sum(selected) / len(selected):.0f})")
        lines.append(_indent(result.text))
    same = demo.results["vanilla"].tokens == demo.results["dysco"].tokens
    if same:
        lines += ["", "vanilla and DySCO wrote the same tokens on this instance."]
    if html_path is not None:
        lines += ["", f"attention replay (opens offline in a browser): {html_path}"]
    return "\n".join(lines)


__all__ = ["ANSWER_MARGIN", "DemoResult", "format_report", "gold_cities", "run_demo"]
