"""The step account's fix and break rates, controlled for how hard each step was: which models
and which strata (`analysis.step_controls` does the fitting and counting).

Why: where the QRHeads miss the gold edge, vanilla mostly gives the gold city a log p below -6
(290 of the 390 such steps it gets wrong), and DySCO fixes none of those, wherever the QRHeads
look. The raw contrast of fix rates by the gold edge's rank is therefore largely a contrast of
difficulty. Controls:
- logistic models of fix (over the steps vanilla got wrong) and break (over those it got right)
  on whether the QRHeads rank the gold edge first, vanilla's gold log p and vanilla's margin.
  The rank enters as an indicator of rank 1: the raw fix rates are flat beyond rank 1 (0.009,
  0.010, 0.011 for ranks 2-3, 4-10, 11+), and `rank_form` compares the fit with log2 rank in
  its place. Fix also gets a model with the model's size and the context length (37 events carry
  five predictors; break's 14 do not, so break keeps the three) and a model with "DySCO's
  selection holds a key of the gold edge" in place of the rank;
- stratified contrasts free of any model: the rate with and without the exposure within bins of
  vanilla's gold log p. Fix's bins (-6, -2) are the audit's; break's (-1.5, -0.5) cut the steps
  vanilla got right where it gave the gold city less than 0.22, 0.22-0.61 and more of its
  probability (every break falls below 0.4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from dysco_interp.analysis.step_controls import Predictor, step_model, stratified_contrast
from dysco_interp.analysis.step_signals import Signal
from dysco_interp.viz.panels import Panel, Series
from dysco_interp.viz.tables import table_markdown

N_BOOT = 2000
SEED = 0


def _selection_holds_gold(r: Mapping) -> float | None:
    share = r["step"].get("gold_selected_share")
    return None if share is None else float(share > 0)


QR_FIRST = Predictor("qr_first", "QRHeads rank the gold edge first", lambda r: float(r["step"]["qr_rank"] == 1))
LOG2_RANK = Predictor("log2_qr_rank", "log2 of the QRHeads' rank of the gold edge",
                      lambda r: math.log2(r["step"]["qr_rank"]))
GOLD_LOGP = Predictor("vanilla_logp", "vanilla's gold log p (per nat)", lambda r: r["step"]["logprob"]["vanilla"])
MARGIN = Predictor("vanilla_margin", "vanilla's margin (per nat)",
                   lambda r: r["step"].get("margin", {}).get("vanilla"))
BIGGER = Predictor("model_1.5b", "the 1.5B (against the 0.5B)", lambda r: float(r["model"].endswith("1.5b")))
LENGTH = Predictor("log2_length", "context length (per doubling)", lambda r: math.log2(r["length"]))
SELECTED = Predictor("gold_selected", "DySCO's selection holds a key of the gold edge", _selection_holds_gold)

MODELS: dict[str, tuple[str, tuple[Predictor, ...]]] = {
    "fix": ("fix", (QR_FIRST, GOLD_LOGP, MARGIN)),
    "fix, model and length": ("fix", (QR_FIRST, GOLD_LOGP, MARGIN, BIGGER, LENGTH)),
    "fix, the selection in place of the rank": ("fix", (SELECTED, GOLD_LOGP, MARGIN)),
    "break": ("break", (QR_FIRST, GOLD_LOGP, MARGIN)),
}
STRATA = {"fix": Signal("vanilla_logp", "vanilla's gold log p", (-6, -2), lambda s: s["logprob"]["vanilla"]),
          "break": Signal("vanilla_logp", "vanilla's gold log p", (-1.5, -0.5), lambda s: s["logprob"]["vanilla"])}
CONTRASTS = (("fix", QR_FIRST, "gold edge ranked 1st"), ("fix", SELECTED, "selection holds gold"),
             ("break", QR_FIRST, "gold edge ranked 1st"))  # event, exposure, its name in a panel's title
EVENT_RATE = {"fix": "P(fixed | vanilla wrong)", "break": "P(broken | vanilla right)"}


def rank_form(rows, fix: Mapping | None) -> dict | None:
    """The fix model's log-likelihood with the rank as an indicator of rank 1 (`fix`, fitted) and
    as log2 rank in its place: as many parameters, so the larger fits better."""
    alt = step_model(rows, "fix", (LOG2_RANK, GOLD_LOGP, MARGIN), n_boot=0)
    return None if fix is None or alt is None else {QR_FIRST.key: fix["loglik"], LOG2_RANK.key: alt["loglik"]}


def exposure(p: Predictor) -> Callable[[Mapping], bool]:
    return lambda r: bool(p.value(r))


def controlled(rows) -> dict:
    """The models, the rank's form and the stratified contrasts over classified rows."""
    models = {name: step_model(rows, event, preds, N_BOOT, SEED) for name, (event, preds) in MODELS.items()}
    contrasts = [{"exposure": exp.key, "exposure_label": exp.label, "exposure_short": short,
                  **stratified_contrast(rows, event, exposure(exp), STRATA[event], N_BOOT, SEED)}
                 for event, exp, short in CONTRASTS]
    return {"models": models, "rank_form": rank_form(rows, models["fix"]), "contrasts": contrasts}


def _rate(est: Mapping | None) -> str:
    if est is None:
        return "-"
    return f"{est['events']}/{est['eligible']}: {est['mean']:.3f} [{est['lo']:.3f}, {est['hi']:.3f}]"


def _ratio(v: float | None) -> str:
    return "∞" if v is None else f"{v:.2f}"


def _odds(v: float | None) -> str:
    return "∞" if v is None else f"{v:.3g}"


def render_controlled(result: Mapping) -> list[str]:
    """The Markdown section of the controlled account."""
    lines = ["## Fix and break, controlled for the step's difficulty", "",
             "The rates above mix each signal with how hard the step was: DySCO fixes no step where vanilla's gold "
             "log p is below -6, and most steps where the QRHeads miss the gold edge are such steps. A logistic "
             "model of each event over the steps that can show it (fix: vanilla wrong; break: vanilla right), on "
             "the predictors together. Odds ratios with 95% percentile intervals from resampling instances "
             f"({N_BOOT} resamples, seed {SEED}; an instance's steps under both models are resampled together); "
             "a ridge of 1e-4 on the slopes keeps every fit finite. `separated`: resamples in which some predictor "
             "splits events from non-events (a slope that runs off counts as the infinity it runs to, so an "
             "interval that reaches it ends at ∞); `failed`: resamples whose fit did not converge (left out).", ""]
    rows = []
    for name, m in result["models"].items():
        if m is None:
            rows.append([name, "-", "-", "-", "(no events to model)", "-", "-"])
            continue
        for k, o in m["odds_ratios"].items():
            rows.append([name, m["n"], m["events"], m["clusters"], m["labels"][k],
                         f"{_odds(o['or'])} [{_odds(o['lo'])}, {_odds(o['hi'])}]",
                         f"{m['boot_separated']} / {m['boot_failed']}"])
    lines += [table_markdown(["model", "steps", "events", "instances", "predictor", "odds ratio [95% CI]",
                              "resamples separated / failed"], rows), ""]
    form = result["rank_form"]
    if form:
        lines += [f"The rank's form in the fix model: log-likelihood {form[QR_FIRST.key]:.2f} with the indicator of "
                  f"rank 1, {form[LOG2_RANK.key]:.2f} with log2 rank in its place (as many parameters).", ""]
    for c in result["contrasts"]:
        lines += [f"**{EVENT_RATE[c['event']]} with and without: {c['exposure_label']} (within bins of "
                  f"{c['stratum_label']})**", ""]
        lines += [table_markdown([c["stratum_label"], "yes: events/steps, rate [95% CI]",
                                  "no: events/steps, rate [95% CI]", "ratio"],
                                 [[b["bin"], _rate(b["exposed"]), _rate(b["other"]),
                                   "-" if b["ratio"] is None else f"{b['ratio']:.2f}"] for b in c["bins"]]), ""]
        mh = c["mantel_haenszel"]
        lines += [f"Mantel-Haenszel rate ratio over the bins: {_ratio(mh['ratio'])} [{_ratio(mh['lo'])}, "
                  f"{_ratio(mh['hi'])}] ({mh['resamples_infinite']} of {mh['n_boot']} resamples have no event on "
                  "one side of the exposure: a ratio of 0 or ∞).", ""]
    return lines


def rate_series(name: str, estimates: Sequence[Mapping | None], x: Sequence[str]) -> Series:
    """Bars of rates with their intervals (`step_signals.cluster_ratio`'s estimates; None: no step)."""
    return Series(name, [None if e is None else e["mean"] for e in estimates],
                  lo=[None if e is None else e["lo"] for e in estimates],
                  hi=[None if e is None else e["hi"] for e in estimates], x=x)


def controlled_panels(result: Mapping) -> list[Panel]:
    """One panel per stratified contrast: the rate with and without the exposure in each bin."""
    panels = []
    for c in result["contrasts"]:
        def steps(e):
            return 0 if e is None else e["eligible"]

        x = [f"{b['bin']} (n {steps(b['exposed'])} / {steps(b['other'])})" for b in c["bins"]]
        series = []
        for side, name in (("exposed", "yes"), ("other", "no")):
            est = [b[side] for b in c["bins"]]
            series.append(rate_series(name, est, x))
        event = "fixed" if c["event"] == "fix" else "broken"
        panels.append(Panel(f"P({event}) by {c['stratum_label']}: {c['exposure_short']}?", "share of steps", series,
                            kind="bar", ylim=(0, 1)))
    return panels


__all__ = ["CONTRASTS", "MODELS", "STRATA", "controlled", "controlled_panels", "rank_form", "rate_series",
           "render_controlled"]
