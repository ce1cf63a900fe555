"""The selection-budget study's summaries: paired gains over vanilla per budget, the figure, and
the test-split table (rows identified by config, missing runs shown as "not run")."""

from __future__ import annotations

import json
import lzma
import random

import pytest

from dysco_interp.analysis.method_key import method_key
from dysco_interp.analysis.result_tables import CIOptions
from dysco_interp.errors import ConfigError
from dysco_interp.studies import budget_report as B
from dysco_interp.viz.budget_figure import budget_figure, budget_panels
from dysco_interp.viz.render_html import opens_offline

CI = CIOptions(n_boot=500, seed=0)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
METRICS = {"tf_step_accuracy", "tf_city_logprob", "tf_logprob", "tf_token_accuracy", "tf_exact", "n_forced",
           "accuracy", "partial_accuracy", "step_accuracy", "extraction_rate", "score", "has_prefix", "mean_selected"}


def rec(method="vanilla", i=0, *, model="m", task="path_traversal", length=1024, tf=True, label=None, **fields):
    """One stored record of instance `i`; `fields` holds config overrides and metric values."""
    config = {"method": method, "beta": 2.0, "top_p": 0.975, "top_k": 4096, "top_k_fraction": None, "decay": 0.75,
              "warmup": 8, "schedule": "reference", "template_masking": "reference", "tau": 1.0, "head_seed": 0,
              "max_new_tokens": 256, "enable_thinking": None, "record_positions": False}
    config.update({k: v for k, v in fields.items() if k not in METRICS})
    settings = {"model": model, "task": task, "teacher_forced": True} if tf else {"model": model, "task": task}
    out = {"model": model, "task": task, "length": length, "method": label or f"free label {method}",
           "instance": f"{task}-{length}-{i}", "id": f"id{i}", "index": i, "n_tokens": length, "config": config,
           "settings": settings, "mean_selected": None}
    out.update({k: v for k, v in fields.items() if k in METRICS})
    return out


def tf_pt(method, steps, **kw):
    """Teacher-forced Path Traversal records with these step accuracies (city log-prob = step - 1)."""
    return [rec(method, i, tf_step_accuracy=s, tf_city_logprob=s - 1, tf_logprob=-s, tf_token_accuracy=s, **kw)
            for i, s in enumerate(steps)]


def free_pt(method, accs, **kw):
    return [rec(method, i, tf=False, accuracy=a, partial_accuracy=a, step_accuracy=a / 2, **kw)
            for i, a in enumerate(accs)]


# ---------------------------------------------------------------------------- dev curves


def test_paired_gain_and_interval_by_hand():
    vanilla = tf_pt("vanilla", [0.5, 0.5, 0.25, 0.75])
    # a constant gain of 0.25: every resample has that mean, so the interval is a point
    k64 = tf_pt("dysco", [0.75, 0.75, 0.5, 1.0], top_k=64)
    for r, sel in zip(k64, [60, 64, 64, 64]):
        r["mean_selected"] = sel
    # gains 0 and 1 on two instances: resampled means are 0, 0.5 or 1 with chance 1/4, 1/2, 1/4,
    # so the 2.5% and 97.5% percentiles are 0 and 1
    k8 = tf_pt("dysco", [0.5, 1.5], top_k=8)
    # an instance vanilla never ran is not paired
    k8.append(rec("dysco", 9, top_k=8, tf_step_accuracy=0.0, tf_logprob=0.0))
    records = vanilla + k64 + k8
    random.Random(0).shuffle(records)  # pairing is by instance, not by position
    rows = B.budget_curves(records, ci=CI)
    assert [(r["budget"], r["heads"]) for r in rows] == [(("K", 8), "qrheads"), (("K", 64), "qrheads")]
    r8, r64 = rows
    assert r64["metric"] == "tf_step_accuracy" and r64["gain"] == {
        "mean": 0.25, "lo": 0.25, "hi": 0.25, "n": 4, "better": 4, "worse": 0, "same": 0, "p": 0.125, "draws": None,
        "q": None, "margin": 0.03, "eq_p": 1.0, "eq_q": None}  # a gain of 0.25 is no equivalence within 0.03
    assert r64["gains"]["tf_logprob"]["mean"] == -0.25 and r64["gains"]["tf_exact"] is None
    assert r64["mean_selected"] == 63.0 and r64["beta"] == 2.0 and r64["top_p"] == 0.975
    assert r8["gain"] == {"mean": 0.5, "lo": 0.0, "hi": 1.0, "n": 2, "better": 1, "worse": 0, "same": 1,
                           "p": 1.0, "draws": None, "q": None, "margin": 0.03, "eq_p": 0.74016, "eq_q": None} \
        and r8["n"] == 2 and r8["n_records"] == 3
    assert r8["mean_selected"] is None
    assert r64["vanilla"]["tf_step_accuracy"]["mean"] == 0.5 and r64["n_vanilla"] == 4
    assert r64["means"]["tf_step_accuracy"]["mean"] == 0.75


def test_mrcr_uses_log_prob_fraction_budgets_and_ignores_free_records():
    vanilla = [rec("vanilla", i, task="mrcr", tf_logprob=-2.0, tf_token_accuracy=0.5) for i in range(3)]
    frac = [rec("dysco", i, task="mrcr", top_k_fraction=0.05, tf_logprob=-1.5, tf_token_accuracy=0.5)
            for i in range(3)]
    free = [rec("dysco", i, task="mrcr", tf=False, top_k=16, score=0.9) for i in range(3)]
    (row,) = B.budget_curves(vanilla + frac + free, ci=CI)
    assert row["metric"] == "tf_logprob" and row["gain"]["mean"] == 0.5 and row["budget"] == ("fraction", 0.05)
    assert row["top_k_fraction"] == 0.05 and row["top_k"] == 4096
    assert row["gains"]["tf_token_accuracy"]["mean"] == 0.0
    # another metric on request
    (row,) = B.budget_curves(vanilla + frac, metric="tf_token_accuracy", ci=CI)
    assert row["metric"] == "tf_token_accuracy" and row["gain"]["mean"] == 0.0


def test_random_heads_and_other_protocols_are_separate_lines():
    vanilla = tf_pt("vanilla", [0.5, 0.5])
    qr = tf_pt("dysco", [1.0, 1.0], top_k=64)
    rnd = tf_pt("dysco-random", [0.25, 0.25], top_k=64, head_seed=3)
    old_schedule = tf_pt("dysco", [0.0, 0.0], top_k=64, schedule="paper")
    old_masking = tf_pt("dysco", [0.75, 0.75], top_k=64, template_masking=True)
    # same label, same beta and K: only the config tells them apart
    for r in rnd + old_schedule + old_masking:
        r["method"] = "free label dysco"
    assert len({method_key(r[0]) for r in (qr, rnd, old_schedule, old_masking)}) == 4
    rows = B.budget_curves(vanilla + qr + rnd + old_schedule + old_masking, ci=CI)
    got = {(r["heads"], tuple(r["other"].items())): r["gain"]["mean"] for r in rows}
    assert got == {("qrheads", ()): 0.5, ("random", ()): -0.25, ("qrheads", (("schedule", "paper"),)): -0.5,
                   ("qrheads", (("template_masking", "skeleton"),)): 0.25}
    assert all(r["gain"]["n"] == 2 for r in rows)  # none pooled with another
    assert next(r for r in rows if r["heads"] == "random")["head_seed"] == 3


def test_a_run_stored_twice_counts_once():
    vanilla = tf_pt("vanilla", [0.5, 0.5])
    dysco = tf_pt("dysco", [1.0, 0.5], top_k=64)
    (row,) = B.budget_curves(vanilla + dysco + [dict(dysco[0])], ci=CI)
    assert row["gain"]["mean"] == 0.25 and row["n"] == 2


def test_budget_curves_markdown_and_json(tmp_path):
    rows = B.budget_curves(tf_pt("vanilla", [0.5, 0.5]) + tf_pt("dysco", [1.0, 1.0], top_k=64), ci=CI)
    md, js = B.write_budget_curves(rows, tmp_path / "curves", notes=["a note"], meta={"split": "dev"})
    text = md.read_text()
    assert "K=64" in text and "+0.500 [+0.500, +0.500]" in text and "- a note" in text
    assert js.name == "curves.json.xz"  # committed compressed, as the stores are
    doc = json.loads(lzma.decompress(js.read_bytes()))
    assert doc["split"] == "dev" and doc["rows"][0]["budget"] == ["K", 64]


# ---------------------------------------------------------------------------- figure


def figure_rows():
    recs = tf_pt("vanilla", [0.5, 0.5]) + tf_pt("vanilla", [0.5, 0.5], length=2048)
    recs += [rec("vanilla", i, task="mrcr", tf_logprob=-2.0) for i in range(2)]
    for k, s in ((8, 0.5), (64, 0.75), (4096, 0.625)):
        recs += tf_pt("dysco", [s, s], top_k=k) + tf_pt("dysco", [s + 0.25, s], top_k=k, beta=2.5)
        recs += tf_pt("dysco-random", [0.5, 0.25], top_k=k) + tf_pt("dysco", [s, s], top_k=k, length=2048)
        recs += [rec("dysco", i, task="mrcr", top_k=k, tf_logprob=-2.0 + k / 4096) for i in range(2)]
    recs += tf_pt("dysco", [0.75, 0.5], top_k_fraction=0.05) + tf_pt("dysco", [0.75, 0.75], top_k_fraction=0.1)
    recs += [rec("vanilla", i, model="m2", tf_step_accuracy=0.5) for i in range(2)]
    recs += [rec("dysco", i, model="m2", top_k=16, tf_step_accuracy=0.75) for i in range(2)]
    return B.budget_curves(recs, ci=CI)


def test_panels_per_model_and_cell_with_random_heads_apart():
    panels, ncols = budget_panels(figure_rows(), "K")
    # columns: Path Traversal 1024, 2048, then MRCR 1024; one row per model
    assert ncols == 3 and len(panels) == 6
    assert [p.title.split("\n")[0] for p in panels[:3]] == ["m: Path Traversal 1024", "m: Path Traversal 2048",
                                                            "m: MRCR 1024"]
    first = panels[0]
    names = [s.name for s in first.series]
    assert names == ["QRHeads β=2", "QRHeads β=2.5", "random heads β=2", "no change (vanilla)"]
    qr, _, rnd, zero = first.series
    assert list(qr.x) == [8, 64, 4096] and list(qr.y) == [0.0, 0.25, 0.125] and list(rnd.y) == [-0.125] * 3
    assert qr.color != rnd.color and zero.y == [0.0, 0.0] and list(zero.x) == [8, 4096]
    assert first.log_x and "vanilla tf_step_accuracy 0.500" in first.title
    assert panels[2].series[0].y[2] == pytest.approx(1.0)  # MRCR: tf_logprob gain at K=4096
    # m2 ran only Path Traversal 1024: its other cells are empty panels saying so
    assert [p.note for p in panels[3:] if not p.series] == ["not run", "not run"]
    fraction, ncols = budget_panels(figure_rows(), "fraction")
    assert ncols == 1 and list(fraction[0].series[0].x) == [0.05, 0.1]


def test_figure_writes_png_and_offline_html(tmp_path):
    out = budget_figure(figure_rows(), tmp_path / "fig" / "budget")
    assert set(out) == {"K", "fraction"}
    for budget, name in (("K", "budget"), ("fraction", "budget-fraction")):
        png, html = out[budget]
        assert png.name == f"{name}.png" and png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
        text = html.read_text()
        # plotly.js from the shared copy beside it, no external script
        assert html.name == f"{name}.html" and opens_offline(html) and "Plotly.newPlot" in text
    assert r"random heads \u03b2=2" in out["K"][1].read_text()  # plotly writes non-ASCII escaped
    with pytest.raises(ConfigError, match="no budget rows"):
        budget_figure([], tmp_path / "empty")


# ---------------------------------------------------------------------------- test table


def test_table_rows_by_config_and_not_run(tmp_path):
    chosen = {"top_p": 0.975, "top_k": 64, "beta": 2.5}
    tf = tf_pt("vanilla", [0.5, 0.5, 0.5]) + tf_pt("dysco", [0.75, 0.75, 0.75], **chosen)
    tf += tf_pt("dysco", [0.5, 0.75, 1.0])  # the paper preset
    tf += tf_pt("dysco-random", [0.25, 0.25, 0.25], head_seed=7, **chosen)
    tf += tf_pt("dysco", [0.0, 0.0, 0.0], top_k=64, beta=2.5, schedule="paper")  # old protocol: not "chosen"
    tf += tf_pt("dysco", [0.0, 0.0, 0.0], top_k=64, beta=2.5, top_k_fraction=0.1)  # another budget
    free = free_pt("vanilla", [0.0, 1.0, 0.0]) + free_pt("dysco", [1.0, 1.0, 0.0], **chosen)
    free += free_pt("uniattns", [0.0, 1.0, 1.0], tau=0.85) + free_pt("dysco-static", [0.0, 0.0, 0.0], **chosen)
    rows, notes = B.heldout_table(tf, free, chosen, taus={"m": 0.85}, ci=CI)
    assert [r["role"] for r in rows] == list(B.ROLES)
    by_role = {r["role"]: r for r in rows}
    van, uni, paper, best, rnd, static = (by_role[r] for r in B.ROLES)
    assert "delta" not in van and van["metrics"]["tf_step_accuracy"]["mean"] == 0.5
    assert van["metrics"]["accuracy"]["mean"] == pytest.approx(1 / 3, abs=1e-5)
    assert best["delta"]["tf_step_accuracy"] == {"mean": 0.25, "lo": 0.25, "hi": 0.25, "n": 3, "better": 3,
                                                 "worse": 0, "same": 0, "p": 0.25, "draws": None, "q": None,
                                                 "margin": 0.03, "eq_p": 1.0, "eq_q": None}
    assert best["delta"]["tf_city_logprob"]["mean"] == 0.25
    assert best["delta"]["accuracy"]["mean"] == pytest.approx(1 / 3, abs=1e-5)
    assert best["params"]["top_k"] == 64 and best["params"]["schedule"] == "reference" and best["not_run"] == []
    assert paper["delta"]["tf_step_accuracy"]["mean"] == 0.25 and paper["params"]["top_k"] == 4096
    assert paper["not_run"] == ["accuracy", "partial_accuracy", "step_accuracy"]
    assert uni["name"] == "UniAttnS (tau=0.85)" and uni["not_run"] == ["tf_step_accuracy", "tf_city_logprob"]
    assert uni["delta"]["accuracy"]["mean"] == pytest.approx(1 / 3, abs=1e-5)
    assert rnd["params"]["head_seed"] == 7 and rnd["delta"]["tf_step_accuracy"]["mean"] == -0.25
    assert static["delta"]["step_accuracy"]["mean"] == pytest.approx(-1 / 6, abs=1e-5)
    assert any("schedule=paper" in n and "K/n=0.1" in n for n in notes)
    assert B.format_cell(paper, "accuracy") == "not run"
    assert B.format_cell(best, "tf_step_accuracy") == "0.750 (Δ +0.250 [+0.250, +0.250] 3↑0↓ p=0.25)"
    assert B.format_cell(van, "tf_step_accuracy") == "0.500"

    md, js = B.write_heldout_table(rows, tmp_path / "test_table", notes=notes, meta={"chosen": chosen}, ci=CI)
    text = md.read_text()
    assert text.count("not run") == 10 and "## m" in text and "DySCO random heads" in text
    doc = json.loads(js.read_text())
    assert doc["chosen"] == chosen and len(doc["rows"]) == 6 and doc["notes"] == notes


def test_table_fraction_choice_missing_runs_and_the_old_protocol():
    chosen = {"top_p": 0.975, "top_k_fraction": 0.05, "beta": 2.0}
    # only old-protocol runs of the paper preset: not the paper preset of this table
    tf = tf_pt("vanilla", [0.5, 0.5], length=2048) + tf_pt("dysco", [1.0, 1.0], length=2048, template_masking=True)
    tf += tf_pt("dysco", [0.75, 0.75], length=2048, top_k_fraction=0.05)
    rows, notes = B.heldout_table(tf, [], chosen, ci=CI)
    by_role = {r["role"]: r for r in rows}
    assert {r["length"] for r in rows} == {2048}
    assert by_role["paper"]["not_run"] == [m for m, _, _ in B.TEST_COLUMNS]
    assert by_role["chosen"]["delta"]["tf_step_accuracy"]["mean"] == 0.25
    assert by_role["chosen"]["params"]["top_k_fraction"] == 0.05
    assert by_role["random"]["not_run"] == by_role["static"]["not_run"] == [m for m, _, _ in B.TEST_COLUMNS]
    assert by_role["uniattns"]["name"] == "UniAttnS (no tau chosen)"
    assert any("no free-generation vanilla" in n for n in notes)
    assert any("template masking=skeleton" in n for n in notes)
    # chosen per model; lengths filter
    rows, _ = B.heldout_table(tf, [], chosen, chosen_by_model={"m": {"beta": 2.0}}, ci=CI)
    assert {r["role"]: r for r in rows}["chosen"]["params"]["top_k_fraction"] == 0.0  # = the paper preset
    assert B.heldout_table(tf, [], chosen, lengths=[1024], ci=CI)[0] == []


def test_bad_inputs_are_one_clear_error():
    tf = tf_pt("vanilla", [0.5])
    with pytest.raises(ConfigError, match="not DecodingConfig fields: bogus"):
        B.heldout_table(tf, [], {"bogus": 1})
    with pytest.raises(ConfigError, match=r"method 'dysco': select_p must be in \(0, 1\], got 2\.0"):
        B.heldout_table(tf, [], {"top_p": 2.0})  # a committed choice names it as records do
    with pytest.raises(ConfigError, match="free-generation"):
        B.heldout_table(free_pt("vanilla", [1.0]), [], {"top_k": 64})
    with pytest.raises(ConfigError, match="teacher-forced"):
        B.heldout_table([], tf, {"top_k": 64})


# ---------------------------------------------------------------------------- every output from a budget folder

QWEN = "qwen2.5-coder-0.5b"
CHOSEN = {"beta": 2.0, "top_p": 0.975, "top_k": 64, "top_k_fraction": None}


def write_store(path, records):
    """A result store as `evaluate` writes it: a settings header, then one record per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"kind": "dysco-interp-store", "format": 2, "purpose": "evaluate", "settings": {"model": QWEN}}
    path.write_text("\n".join(json.dumps(x) for x in [header, *records]) + "\n")


def budget_dir(root, *, choice=True):
    """dev/ (a teacher-forced sweep and its free generation), test/ (both kinds) and the choice."""
    kw = {"model": QWEN}
    tf = tf_pt("vanilla", [0.5, 0.5, 0.5], **kw) + tf_pt("dysco", [0.75, 0.75, 0.75], top_k=64, **kw)
    tf += tf_pt("dysco", [0.5, 0.25, 0.5], top_k=8, **kw) + tf_pt("dysco", [0.5, 0.5, 0.25], top_k_fraction=0.05, **kw)
    tf += tf_pt("dysco", [0.25, 0.25, 0.25], **kw)  # the paper preset
    free = free_pt("vanilla", [0.0, 1.0, 0.0], **kw) + free_pt("dysco", [1.0, 1.0, 0.0], top_k=64, **kw)
    free += free_pt("dysco", [0.0, 0.0, 0.0], top_k=8, **kw) + free_pt("dysco", [0.0, 1.0, 0.0], **kw)
    write_store(root / "dev" / f"{QWEN}_path_traversal_1k_tf.jsonl", tf)
    write_store(root / "dev" / f"{QWEN}_path_traversal_1k_free.jsonl", free)
    test_tf = tf_pt("vanilla", [0.5, 0.5], **kw) + tf_pt("dysco", [1.0, 0.5], top_k=64, **kw)
    test_tf += tf_pt("uniattns", [0.5, 0.25], tau=0.95, **kw) + tf_pt("uniattns", [0.0, 0.0], tau=0.8, **kw)
    # the MRCR sweep UniAttnS's tau is chosen on: 0.8 scores best but is off the paper's grid
    write_store(root.parent / "mrcr" / f"{QWEN}_2k_tau.jsonl",
                [{"model": QWEN, "task": "mrcr", "length": 2048, "method": f"uniattns tau={t:g}", "index": i,
                  "id": f"mrcr-{i}", "config": {"method": "uniattns", "tau": t}, "score": score}
                 for t, score in ((0.8, 0.9), (0.95, 0.5), (0.9, 0.4)) for i in range(2)])
    test_free = free_pt("vanilla", [0.0, 1.0], **kw) + free_pt("dysco", [1.0, 1.0], top_k=64, **kw)
    write_store(root / "test" / f"{QWEN}_path_traversal_1k_tf.jsonl", test_tf)
    write_store(root / "test" / f"{QWEN}_path_traversal_1k_free.jsonl", test_free)
    if choice:
        ranking = [{"config": CHOSEN, "mean_rank": 1.0}, {"config": {**CHOSEN, "top_k": 8}, "mean_rank": 2.5}]
        (root / f"chosen_{QWEN}.json").write_text(json.dumps({"config": CHOSEN, "ranking": ranking, "model": QWEN}))
    return root


def test_write_reports_writes_every_table_and_figure(tmp_path):
    root = budget_dir(tmp_path / "budget")
    lines = B.write_reports(root, ci=CI)
    names = ["curves.md", "curves.json.xz", "effect.png", "effect.html", "effect-fraction.png", "effect-fraction.html",
             "dev_free.md", "dev_free.json", "test_table.md", "test_table.json"]
    assert lines == [f"wrote {root / n}" for n in names]  # no notes: every input is there
    for name in ("effect.png", "effect-fraction.png"):
        assert (root / name).read_bytes()[:8] == PNG_MAGIC

    curves = json.loads(lzma.decompress((root / "curves.json.xz").read_bytes()))
    gains = {tuple(r["budget"]): r["gain"]["mean"] for r in curves["rows"]}
    assert gains == {("K", 8): pytest.approx(-1 / 12, abs=1e-5), ("K", 64): 0.25, ("K", 4096): -0.25,
                     ("fraction", 0.05): pytest.approx(-1 / 12, abs=1e-5)}
    assert curves["stores"] == [f"dev/{QWEN}_path_traversal_1k_free.jsonl", f"dev/{QWEN}_path_traversal_1k_tf.jsonl"]
    assert curves["chosen"] == {QWEN: {"config": CHOSEN, "source": f"chosen_{QWEN}.json"}}

    free = json.loads((root / "dev_free.json").read_text())
    assert [(r["role"], r["params"]["top_k"] if r["params"] else None, r["tf_rank"]) for r in free["rows"]] == [
        ("vanilla", None, None), ("paper", 4096, None), ("chosen", 64, 1.0), ("shortlisted", 8, 2.5)]
    van, paper, best, short = free["rows"]
    assert "delta" not in van and van["metrics"]["accuracy"]["mean"] == pytest.approx(1 / 3, abs=1e-5)
    assert best["delta"]["accuracy"]["mean"] == pytest.approx(1 / 3, abs=1e-5)
    # no instance changed: equivalent within any margin (TOST p 0), though the table's q is left to it
    assert paper["delta"]["accuracy"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 3, "better": 0, "worse": 0,
                                          "same": 3, "p": 1.0, "draws": None, "q": None, "margin": 0.03,
                                          "eq_p": 0.0, "eq_q": None}
    assert short["delta"]["step_accuracy"]["mean"] == pytest.approx(-1 / 6, abs=1e-5)
    text = (root / "dev_free.md").read_text()
    assert "| 1024 | DySCO chosen | DySCO (K=64) | 3 | - | 1.00 |" in text

    test = json.loads((root / "test_table.json").read_text())
    by_role = {r["role"]: r for r in test["rows"]}
    assert [r["role"] for r in test["rows"]] == list(B.ROLES)
    assert test["taus"] == {QWEN: 0.95} and by_role["uniattns"]["name"] == "UniAttnS (tau=0.95)"
    assert by_role["uniattns"]["delta"]["tf_step_accuracy"]["mean"] == -0.125
    assert by_role["chosen"]["params"]["top_k"] == 64 and by_role["chosen"]["delta"]["accuracy"]["mean"] == 0.5
    assert any("tau=0.8" in n for n in test["notes"])  # stored, not the tau chosen on the grid


def test_write_reports_chooses_again_without_a_choice_file(tmp_path):
    root = budget_dir(tmp_path / "budget", choice=False)
    lines = B.write_reports(root, ci=CI)
    assert f"note: {QWEN}: no chosen_{QWEN}.json; the rule applied to the dev stores chooses {CHOSEN}" in lines
    test = json.loads((root / "test_table.json").read_text())
    assert {r["role"]: r for r in test["rows"]}["chosen"]["params"]["top_k"] == 64
    assert test["chosen"][QWEN]["source"] == "the dev stores (no chosen file)"


def test_write_reports_missing_inputs_are_notes(tmp_path):
    assert B.write_reports(tmp_path / "nothing") == [
        f"note: no stores (*.jsonl, *.jsonl.xz) in {tmp_path / 'nothing' / 'dev'}",
        f"note: no stores (*.jsonl, *.jsonl.xz) in {tmp_path / 'nothing' / 'test'}",
        "note: no DySCO teacher-forced dev records: curves and effect figure not written",
        "note: no free-generation dev records: dev_free table not written",
        "note: no test records with a chosen configuration: test table not written"]
    # test stores only, and a broken choice file: nothing to choose with, no table, no traceback
    root = budget_dir(tmp_path / "budget")
    for path in (root / "dev").iterdir():
        path.unlink()
    (root / f"chosen_{QWEN}.json").write_text("{")
    lines = B.write_reports(root, ci=CI)
    assert all(line.startswith("note: ") for line in lines)
    assert any(f"chosen_{QWEN}.json left out" in line for line in lines)
    assert any(f"no chosen_{QWEN}.json and no choice from the dev stores" in line for line in lines)
    assert f"note: test table leaves out {QWEN}: no chosen configuration" in lines
    assert not list(root.glob("*.md")) and not list(root.glob("*.png"))


def test_dev_free_table_refuses_teacher_forced_records():
    with pytest.raises(ConfigError, match="free-generation records"):
        B.dev_free_table(tf_pt("vanilla", [0.5]))
