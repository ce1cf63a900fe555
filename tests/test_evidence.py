"""The measured effect shipped with the package: exactly what the committed study outputs give,
and what the demo's report and page make of it."""

from pathlib import Path

from dysco_interp.experiments import demo as demo_job
from dysco_interp.experiments.evidence import DATA_NAME, derive_evidence, evidence_text, load_evidence

FIGURES = Path(__file__).resolve().parents[1] / "figures"


def test_the_shipped_file_is_what_the_committed_figures_give():
    shipped = Path(demo_job.__file__).parent / "data" / DATA_NAME
    # after the study's outputs change: python -m dysco_interp.experiments.evidence
    assert shipped.read_text() == evidence_text(derive_evidence(FIGURES))


def test_the_evidence_holds_the_test_table_and_the_small_models_run():
    evidence = load_evidence()
    assert evidence["test"]["split"] == "test" and evidence["curves"]["split"] == "dev"
    showcase = evidence["test"]["models"][demo_job.SHOWCASE_MODEL]
    assert showcase["config"] == {"beta": 1.5, "top_k": 8, "top_p": 0.975}  # the small-budget preset
    assert [r["length"] for r in showcase["rows"]] == [1024, 2048, 4096, 8192, 16384]
    for r in showcase["rows"]:
        assert r["n"] > 0 and r["delta"]["lo"] <= r["delta"]["mean"] <= r["delta"]["hi"]
    assert evidence["small"]["smollm2-135m"]["split"] == "dev"
    # the figure's lines: QRHeads at the chosen and the paper's beta, random heads at the paper's
    lines = {(r["heads"], r["beta"]) for r in evidence["curves"]["rows"]}
    assert lines == {("qrheads", 1.5), ("qrheads", 2.0), ("random", 2.0)}
    assert {r["task"] for r in evidence["curves"]["rows"]} == {"path_traversal"}


def test_the_verdict_and_the_report_lines_read_the_shipped_numbers():
    evidence = load_evidence()
    first = evidence["test"]["models"][demo_job.SHOWCASE_MODEL]["rows"][0]
    measured = demo_job.measured_effect(demo_job.SHOWCASE_MODEL)
    assert measured is not None and measured.shows and f"{first['delta']['mean']:+.3f}" in measured.text
    small = demo_job.measured_effect("smollm2-135m")
    step = evidence["small"]["smollm2-135m"]["delta"]["tf_step_accuracy"]
    assert small is not None and not small.shows and f"{step['mean']:+.3f}" in small.text
    assert demo_job.measured_effect("tiny-llama") is None
    # the default model is not in the test table: the report shows the showcase model's
    lines = demo_job.evidence_lines("smollm2-135m")
    assert lines[0].startswith(f"Measured on {demo_job.SHOWCASE_MODEL}, Path Traversal test split")
    assert len(lines) == 2 + len(evidence["test"]["models"][demo_job.SHOWCASE_MODEL]["rows"])
    assert demo_job.evidence_lines("qwen2.5-coder-0.5b")[0].startswith("Measured on qwen2.5-coder-0.5b")


def test_the_page_labels_each_row_with_model_split_n_and_ci():
    from dysco_interp.viz.demo_page import evidence_figure, evidence_rows, evidence_table, with_code

    rows = evidence_rows("smollm2-135m")
    assert rows[0]["model"] == "smollm2-135m" and rows[0]["split"] == "dev" and rows[0]["this"]
    assert {r["split"] for r in rows[1:]} == {"test"} and not any(r["this"] for r in rows[1:])
    table = evidence_table("smollm2-135m")
    for header in ("model", "split", "n", "95% CI"):
        assert header in table
    assert table.count("<tr class=this>") == 1
    assert evidence_table(demo_job.SHOWCASE_MODEL).count("<tr class=this>") == 5
    fig = evidence_figure()
    assert len(fig.layout.annotations) >= 4  # one title per (model, length) panel
    assert with_code("run `a && b` now") == "run <code>a &amp;&amp; b</code> now"
