"""The main job: what DySCO does on one seeded Path Traversal instance, and what it changes.

`run_demo` generates the instance (seed `seed` of `generate_instance` at `length` tokens for the
model's tokenizer) and runs vanilla decoding and DySCO (the `small-budget` preset unless told
otherwise) twice:
- teacher-forced on the gold route, so that every route step is scored with the right route so far:
  per step, where the QRHeads and all heads look (the gold edge's attention mass and rank), what
  DySCO selected, and each method's log-probability of the step's city and whether its argmax names
  it (`analysis/step_mechanism.py`);
- freely, greedy, scored as LongProc scores a route.
Every run is replayed token by token (`analysis/replay.py`); `format_report` prints it and
`viz/demo_page.write_demo_page` draws it as one offline HTML page.

One instance is an example, not evidence: `measured_effect` says, per model, what the measured
studies found over many instances (the numbers shipped with the package, `experiments.evidence`),
and the report ends with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dysco_interp.analysis.multiplicity import FDR
from dysco_interp.analysis.replay import AttentionReplay, replay_path_traversal
from dysco_interp.analysis.report import fmt_delta, fmt_p
from dysco_interp.analysis.step_mechanism import StepMechanism, step_mechanisms, step_totals
from dysco_interp.checks import check_int, check_type
from dysco_interp.decoding.choices import DEFAULT_PRESET
from dysco_interp.decoding.config import DecodingConfig, preset
from dysco_interp.decoding.results import GenerationResult
from dysco_interp.errors import ConfigError
from dysco_interp.experiments.evidence import load_evidence
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel
from dysco_interp.tasks.lengths import length_label
from dysco_interp.tasks.path_traversal import (
    PathTraversalInstance,
    RouteScore,
    generate_instance,
    score_route,
    teacher_forced_inputs,
)

ANSWER_MARGIN = 8  # new tokens beyond the gold answer's length: room to close the route
SHOWCASE_MODEL = "qwen2.5-coder-1.5b"
METHOD_LABELS = {"vanilla": "vanilla", "dysco": "DySCO"}  # the demo's two runs, as its report names them


@dataclass(frozen=True)
class MeasuredEffect:
    shows: bool  # whether DySCO measurably raises this model's step accuracy (paired 95% CI above 0 somewhere)
    text: str  # what was measured, with where to read more


def _signed(est: Mapping, digits: int = 3) -> str:
    return f"{est['mean']:+.{digits}f} [{est['lo']:+.{digits}f}, {est['hi']:+.{digits}f}]"


def _tested(est: Mapping) -> str:
    """'+0.060 (7 better, 1 worse; p 0.070, q 0.14)': a paired difference with its exact test."""
    q = f", q {fmt_p(est['q'])}" if est.get("q") is not None else ""
    return (f"{est['mean']:+.3f} ({est['better']} better, {est['worse']} worse; p {fmt_p(est['p'])}{q})"
            if est.get("p") is not None else f"{est['mean']:+.3f}")


def measured_effect(model: str) -> MeasuredEffect | None:
    """What the studies measured for `model` over many instances, in words, from the numbers shipped
    with the package (`experiments.evidence`); None for a model no study covers."""
    evidence = load_evidence()
    test = evidence["test"]["models"].get(model)
    if test is not None:
        rows = test["rows"]
        lengths = [length_label(r["length"]).upper() for r in rows]
        above = [length for length, r in zip(lengths, rows) if r["delta"]["mean"] > 0
                 and r["delta"].get("q", 1.0) < FDR]
        n = sorted({r["n"] for r in rows})
        verdict = (f"the gain survives the exact sign-flip test with Benjamini-Hochberg correction over the test "
                   f"table (q < {FDR}) at {', '.join(above)}" if above else
                   f"no difference survives the exact sign-flip test with Benjamini-Hochberg correction over the "
                   f"test table (q < {FDR})")
        deltas = "; ".join(f"{length} {_tested(r['delta'])}" for length, r in zip(lengths, rows))
        return MeasuredEffect(bool(above), (
            f"on the {evidence['test']['split']} split (Path Traversal, {'/'.join(map(str, n))} instances per "
            f"length), small-budget DySCO ({config_words(test['config'])}) changes teacher-forced step accuracy by "
            f"{deltas}: {verdict} ({evidence['test']['source']})"))
    small = evidence["small"].get(model)
    if small is not None:
        step, city = small["delta"]["tf_step_accuracy"], small["delta"]["tf_city_logprob"]
        shown = step.get("p", 1.0) < FDR and step["mean"] > 0
        noise = "" if shown else ", within noise (exact sign-flip p at least 0.05)"
        return MeasuredEffect(shown, (
            f"over {small['n']} Path Traversal instances at {length_label(small['length']).upper()} "
            f"({small['split']} split), small-budget DySCO ({config_words(small['config'])}) changes the gold "
            f"city's teacher-forced log-probability by {_signed(city, 2)} nats and its step accuracy by "
            f"{_tested(step)}{noise} ({small['source']})"))
    return None


@dataclass
class DemoResult:
    model: str
    instance: PathTraversalInstance
    heads: HeadSet
    config: DecodingConfig  # the DySCO run's
    results: dict[str, GenerationResult]  # free generation: "vanilla", "dysco"
    scores: dict[str, RouteScore]
    replays: dict[str, AttentionReplay]  # of the free runs
    forced: dict[str, GenerationResult]  # teacher-forced on the gold route
    forced_replay: AttentionReplay  # the gold route, with DySCO's teacher-forced selection
    steps: list[StepMechanism]

    @property
    def title(self) -> str:
        inst = self.instance
        which = f"seed {inst.seed}" + ("" if inst.index == 0 else f", index {inst.index}")
        return (f"{self.model}: DySCO on Path Traversal, {inst.n_tokens} tokens, {inst.n_edges} edges, "
                f"{inst.n_hops} hops ({which})\ngold route: {' → '.join(gold_cities(inst))}")

    @property
    def totals(self) -> dict[str, dict[str, float]]:
        return step_totals(self.steps)

    @property
    def measured(self) -> MeasuredEffect | None:
        return measured_effect(self.model)


def gold_cities(instance: PathTraversalInstance) -> list[str]:
    steps = [instance.edges[i] for i in instance.gold_edge_indices]
    return [steps[0].src] + [e.dst for e in steps]


def run_demo(
    model: LoadedModel,
    heads: HeadSet,
    *,
    length: int = 1024,
    seed: int = 0,
    index: int = 0,
    hops: int = 4,
    dysco: DecodingConfig | None = None,
    max_new_tokens: int | None = None,
    backend: str = "sdpa",
    progress: bool = True,
) -> DemoResult:
    """Vanilla and DySCO (`small-budget` unless `dysco` says otherwise) on one instance, teacher-forced
    and free. The instance is `make-data`'s of that seed and index (index 0 unless told).

    `max_new_tokens` (free generation) defaults to the gold answer's length plus a small margin;
    teacher forcing always feeds the whole gold answer. `backend`: where the decoding runs (the
    tests pin that every backend writes the same tokens; sdpa is the fastest on a CPU).
    """
    from dysco_interp.decoding.loop import compare_methods, generate_batch
    from dysco_interp.progress import tqdm

    if max_new_tokens is not None:
        check_int("max_new_tokens", max_new_tokens, minimum=1)  # 0 used to mean "the default"
    dysco = preset(DEFAULT_PRESET) if dysco is None else dysco
    check_type("dysco", dysco, DecodingConfig)
    check_type("heads", heads, HeadSet)
    if not dysco.uses_heads:
        raise ConfigError(f"the demo compares vanilla with a DySCO method, got {dysco.method!r}")
    with tqdm(total=6, desc="demo", unit="stage", disable=not progress) as bar:
        bar.set_postfix_str("making the instance")
        instance = generate_instance(model.tokenizer, length, seed=seed, index=index, hops=hops)
        inputs = teacher_forced_inputs(instance, model.tokenizer)
        n_gold = len(inputs.input_ids) - inputs.prompt_len

        def configs(budget: int) -> dict[str, DecodingConfig]:
            return {"vanilla": DecodingConfig(method="vanilla", max_new_tokens=budget),
                    "dysco": dysco.replace(max_new_tokens=budget, record_positions=True)}

        bar.update()
        bar.set_postfix_str(f"teacher forcing the {n_gold}-token gold route")
        forced = {name: runs[0] for name, runs in generate_batch(
            model, [instance.prompt], configs(n_gold), heads, forced=[instance.completion], backend=backend).items()}
        bar.update()
        budget = n_gold + ANSWER_MARGIN if max_new_tokens is None else max_new_tokens
        bar.set_postfix_str(f"decoding {budget} tokens freely")
        results = compare_methods(model, instance.prompt, configs(budget), heads, backend=backend)
        bar.update()
        bar.set_postfix_str("replaying the gold route")
        forced_replay = replay_path_traversal(model, instance, forced["dysco"], heads)
        bar.update()
        replays = {}
        for name, result in results.items():
            bar.set_postfix_str(f"replaying {name}")
            replays[name] = replay_path_traversal(model, instance, result, heads)
            bar.update()
    scores = {name: score_route(r.text, instance) for name, r in results.items()}
    steps = step_mechanisms(forced_replay, inputs, forced, model.tokenizer, instance, forced["dysco"])
    return DemoResult(model.spec.name, instance, heads, dysco, results, scores, replays, forced, forced_replay,
                      steps)


def config_label(config: DecodingConfig) -> str:
    value = config.parameter
    return config_words({"top_p": value("select_p"), "top_k": value("select_k"), "beta": value("beta")})


def config_words(params: Mapping) -> str:
    """DySCO's selection and strength as the demo names them: "p 0.975, K 8, β 1.5"."""
    return f"p {params['top_p']}, K {params['top_k']}, β {params['beta']}"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.strip("\n").split("\n")) if text.strip() else "    (empty)"


def route_score_text(score: RouteScore, n_hops: int) -> str:
    """A free route's LongProc scores in words."""
    exact = "exact route" if score.accuracy == 1.0 else "not exact"
    tags = "" if score.extraction_rate else ", no <Route> ... </Route> found"
    return (f"{exact}, {score.n_correct_steps}/{n_hops} steps right before the first error "
            f"(LongProc partial accuracy {score.partial_accuracy:.2f}){tags}")


def step_cells(demo: DemoResult) -> list[dict[str, str]]:
    """Each route step's cells as text, for the printed table and the page's: the gold edge, its
    attention and rank under the QRHeads and all heads, the QRHeads' attention outside every edge,
    DySCO's share of the gold edge, each method's log p(city), and whether each argmax names it."""
    n_edges = demo.instance.n_edges
    return [{
        "step": str(s.step + 1), "edge": s.edge,
        "qr": f"{s.qr_mass:.2f} (rank {s.qr_rank}/{n_edges})",
        "all": f"{s.all_mass:.3f} (rank {s.all_rank}/{n_edges})",
        "outside": f"{s.outside_edges:.0%}",
        "selected": "-" if s.selected is None else f"{s.selected:.0%}",
        "vanilla": f"{s.logprob['vanilla']:+.2f}", "dysco": f"{s.logprob['dysco']:+.2f}",
        "right": "/".join(("yes" if s.correct[m] else "no") for m in ("vanilla", "dysco")),
        "vanilla_right": "yes" if s.correct["vanilla"] else "no", "dysco_right": "yes" if s.correct["dysco"] else "no",
    } for s in demo.steps]


def step_table(demo: DemoResult) -> list[str]:
    """The teacher-forced route, one line per step under two header lines: every column that
    compares the methods names each one, vanilla's column first."""
    groups = (("", 1), ("", 1), ("QRHeads", 1), ("all heads", 1), ("DySCO", 1), ("log p(city)", 2),
              ("argmax right", 2))  # (the label over some columns, how many)
    rows = [("step", "gold edge", "on it", "on it", "selected", "vanilla", "DySCO", "vanilla", "DySCO")]
    for c in step_cells(demo):
        selected = c["selected"] if c["selected"] == "-" else f"{c['selected']} of it"
        rows.append((c["step"], c["edge"], c["qr"], c["all"], selected, c["vanilla"], c["dysco"],
                     c["vanilla_right"], c["dysco_right"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    over, first = [], 0
    for label, span in groups:
        room = sum(widths[first:first + span]) + 2 * (span - 1)
        widths[first + span - 1] += max(0, len(label) - room)  # a label wider than its columns widens them
        over.append(label.ljust(room))
        first += span
    lines = ["  " + "  ".join(over).rstrip()]
    return lines + ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def selection_text(selected: Sequence[int], n_keys: int | None = None) -> str:
    """How many keys DySCO selected per decoding step, in words ("8 keys at every step", "5 to 9
    keys per step (mean 7.0)"); `n_keys`, the prompt's length, adds "of ~N"."""
    of = f" of ~{n_keys}" if n_keys is not None else ""
    lo, hi = min(selected), max(selected)
    if lo == hi:
        return f"DySCO selected {lo}{of} keys at every step"
    return f"DySCO selected {lo} to {hi}{of} keys per step (mean {sum(selected) / len(selected):.1f})"


def verdict(demo: DemoResult) -> str:
    """One line: what was measured for this model over many instances, or that nothing was."""
    measured = demo.measured
    if measured is None:
        return (f"No study covers {demo.model}: one instance is an example, not evidence; "
                "`dysco-interp evaluate --teacher-forced` over a make-data set measures the effect.")
    if measured.shows:
        return f"Measured on {demo.model}: {measured.text}."
    return (f"{demo.model} is too small to show DySCO's effect on one instance: {measured.text}. It shows on "
            f"{SHOWCASE_MODEL}: `dysco-interp install-model {SHOWCASE_MODEL} && dysco-interp demo --model "
            f"{SHOWCASE_MODEL}`.")


def evidence_lines(model: str) -> list[str]:
    """The measured test-split table of `model`, or of SHOWCASE_MODEL when no test split covers `model`
    (the page shows every measured model)."""
    evidence = load_evidence()
    shown = model if model in evidence["test"]["models"] else SHOWCASE_MODEL
    measured = evidence["test"]["models"][shown]
    rows = [("tokens", "n", "vanilla", "DySCO", "DySCO - vanilla [95% CI]")] + [
        (length_label(r["length"]).upper(), str(r["n"]), f"{r['vanilla']['mean']:.3f}", f"{r['dysco']['mean']:.3f}",
         fmt_delta(r["delta"])) for r in measured["rows"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [f"Measured on {shown}, Path Traversal {evidence['test']['split']} split, teacher-forced step accuracy "
            f"(DySCO {config_words(measured['config'])}; {evidence['test']['source']}):",
            *("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)]


def format_report(demo: DemoResult, html_path: str | Path | None = None) -> str:
    """What the demo prints: the instance, the step table, both free routes, the verdict."""
    inst = demo.instance
    more = ", ..." if len(demo.heads) > 6 else ""
    totals = demo.totals
    lines = [
        f"Path Traversal {inst.id}: {inst.n_tokens} prompt tokens, {inst.n_edges} edges, {inst.n_hops} hops",
        f"question: {inst.question_nl}",
        f"DySCO settings: method {demo.config.method}, {config_label(demo.config)}; heads: {len(demo.heads)} QRHeads "
        f"({', '.join(demo.heads.labels()[:6])}{more})",
        "",
        "gold route:",
        _indent(inst.answer_nl),
        "",
        "Teacher-forced on the gold route (the position that predicts each step's city; attention is the mean",
        "over heads of that row, summed over the gold edge's line; rank 1 = the most attended edge):",
        *step_table(demo),
    ]
    if totals:
        v, d = totals["vanilla"], totals["dysco"]
        lines.append(f"  step accuracy: vanilla {v['step_accuracy']:.2f}, DySCO {d['step_accuracy']:.2f}; "
                     f"mean log p(city): vanilla {v['city_logprob']:+.2f}, DySCO {d['city_logprob']:+.2f} "
                     f"(DySCO - vanilla {d['city_logprob'] - v['city_logprob']:+.2f} nats)")
    for name, result in demo.results.items():
        t = result.timings
        stop = "end of sequence" if result.finished else "token budget"
        score = route_score_text(demo.scores[name], inst.n_hops)
        lines += ["", f"{METHOD_LABELS[name]}, free greedy generation: {score}",
                  f"  {t.n_new} tokens ({stop}), {t.decode_tok_per_s:.1f} tok/s"]
        steps = result.trace.decode_steps() if result.trace is not None else []
        selected = [s.n_selected for s in steps if s.n_selected is not None]
        if selected:
            lines[-1] += f"; {selection_text(selected, inst.n_tokens)}"
        lines.append(_indent(result.text))
    if demo.results["vanilla"].tokens == demo.results["dysco"].tokens:
        lines += ["", "Free generation: vanilla and DySCO wrote the same tokens on this instance."]
    lines += ["", verdict(demo), "", *evidence_lines(demo.model)]
    if html_path is not None:
        lines += ["", f"the page (opens offline in a browser): {html_path}"]
    return "\n".join(lines)


__all__ = ["ANSWER_MARGIN", "DEFAULT_PRESET", "DemoResult", "MeasuredEffect", "config_words", "evidence_lines",
           "format_report", "gold_cities", "measured_effect", "route_score_text", "run_demo", "selection_text",
           "step_cells", "step_table", "verdict"]
