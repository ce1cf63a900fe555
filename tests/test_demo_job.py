"""The main job's pieces without the real model: the per-step mechanism table (pure) and the whole
demo, report and page on a tiny random model."""

import math
import re

import pytest
import torch

from dysco_interp.analysis.replay import AttentionReplay
from dysco_interp.analysis.step_mechanism import step_mechanisms, step_totals
from dysco_interp.decoding.results import ForcedScores, GenerationResult
from dysco_interp.errors import ConfigError
from dysco_interp.experiments import demo as demo_job
from dysco_interp.heads import HeadSet
from dysco_interp.tasks.path_traversal import TeacherForcedInputs
from dysco_interp.viz.render_html import opens_offline


class Tok:
    def decode(self, ids):
        return " " + "-".join(str(i) for i in ids)


def forced_run(argmax, logprob, margin=()):
    n = len(argmax)
    return GenerationResult(text="", tokens=list(range(100, 100 + n)), prompt_ids=list(range(10)), finished=True,
                            forced=ForcedScores(list(argmax), list(logprob), list(margin)))


def gold_route_replay(n=6):
    # rows: answer tokens 0..5, predicted at positions 9..14; edges "A → B", "B → C", "C → D"
    qr = torch.tensor([[0.1, 0.1, 0.1], [0.1, 0.1, 0.1], [0.5, 0.2, 0.1], [0.3, 0.3, 0.3], [0.0, 0.0, 0.0],
                       [0.05, 0.1, 0.6]])
    selected = torch.zeros(n, 3)
    selected[2, 0] = 0.75
    selected[5] = float("nan")
    return AttentionReplay(
        method="dysco", names=["A → B", "B → C", "C → D"], spans=[(0, 3), (3, 6), (6, 9)],
        tokens=list(range(100, 100 + n)), pieces=["x"] * n, query_positions=list(range(9, 9 + n)), qr_heads=qr,
        all_heads=qr / 4, heads=[(0, 0)], selected=selected, gold=[None, None, 0, 0, None, 2])


# prompt of 10 tokens, answer of 6: step 0's city is answer tokens 2-3 (positions 12, 13),
# step 1's is answer token 5 (position 15)
INPUTS = TeacherForcedInputs(tuple(range(10)) + (100, 101, 102, 103, 104, 105), 10, ((12, 14), (15, 16)))


def test_each_step_is_read_where_its_city_is_predicted():
    forced = {"vanilla": forced_run([0, 0, 102, 7, 0, 105], [-1, -1, -0.5, -2.0, -1, -3.0]),
              "dysco": forced_run([0, 0, 102, 103, 0, 9], [-1, -1, -0.25, -0.5, -1, -1.0])}
    steps = step_mechanisms(gold_route_replay(), INPUTS, forced, Tok())
    assert [s.step for s in steps] == [0, 1]
    first, second = steps
    assert first.edge == "A → B" and first.city == " 102-103"
    assert first.qr_mass == pytest.approx(0.5) and first.qr_rank == 1
    assert first.all_mass == pytest.approx(0.125) and first.all_rank == 1
    assert first.outside_edges == pytest.approx(0.2) and first.selected == pytest.approx(0.75)
    assert first.logprob == {"vanilla": pytest.approx(-2.5), "dysco": pytest.approx(-0.75)}  # summed over the name
    assert first.correct == {"vanilla": False, "dysco": True}  # every token of the name must be the argmax
    assert second.edge == "C → D" and second.qr_rank == 1 and second.selected is None  # no selection at that step
    assert second.correct == {"vanilla": True, "dysco": False}
    assert first.to_dict()["logprob"]["dysco"] == pytest.approx(-0.75) and first.to_dict()["qr_rank"] == 1
    # step 0 is read at answer token 2: QRHead edge masses (0.5, 0.2, 0.1)
    p = torch.tensor([0.5, 0.2, 0.1]) / 0.8
    assert first.qr_top_share == pytest.approx(0.625)
    assert first.qr_entropy == pytest.approx(float(-(p * p.log()).sum() / math.log(3)))
    assert first.margin == {}  # results without margins
    with_margins = {name: forced_run(r.forced.argmax, r.forced.logprob, margin=[0.0, 0.0, 1.5, 0.2, 0.0, 0.7])
                    for name, r in forced.items()}
    assert [s.margin["dysco"] for s in step_mechanisms(gold_route_replay(), INPUTS, with_margins, Tok())] == [1.5, 0.7]
    assert step_totals(steps) == {"vanilla": {"step_accuracy": 0.5, "city_logprob": pytest.approx(-2.75)},
                                  "dysco": {"step_accuracy": 0.5, "city_logprob": pytest.approx(-0.875)}}


def test_ties_count_against_the_gold_edge_and_a_cut_answer_stops_the_steps():
    forced = {"vanilla": forced_run([0, 0, 102, 103], [-1, -1, -1, -1])}  # cut after 4 answer tokens
    rep = gold_route_replay()
    rep.qr_heads[2] = torch.tensor([0.3, 0.3, 0.3])
    steps = step_mechanisms(rep, INPUTS, forced, Tok())
    assert len(steps) == 1 and steps[0].qr_rank == 3
    assert steps[0].qr_top_share == pytest.approx(1 / 3) and steps[0].qr_entropy == pytest.approx(1.0)  # flat
    rep.qr_heads[2] = 0.0
    assert step_mechanisms(rep, INPUTS, forced, Tok())[0].qr_entropy is None  # no mass on any edge


def test_inputs_that_do_not_belong_together_are_refused():
    forced = {"vanilla": forced_run([0] * 6, [0.0] * 6)}
    shifted = TeacherForcedInputs(INPUTS.input_ids, 11, INPUTS.step_token_spans)
    with pytest.raises(ConfigError, match="not of this instance"):
        step_mechanisms(gold_route_replay(), shifted, forced, Tok())
    free = {"vanilla": GenerationResult("", [1], list(range(10)), True)}
    with pytest.raises(ConfigError, match="not a teacher-forced"):
        step_mechanisms(gold_route_replay(), INPUTS, free, Tok())


def test_the_demo_runs_end_to_end_on_a_tiny_model(tiny_llama, tmp_path):
    from dysco_interp.viz.demo_page import write_demo_page

    model = tiny_llama
    s = model.spec
    heads = HeadSet([(1, 0), (2, 1), (3, 2)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads,
                    n_kv_heads=s.n_kv_heads)
    demo = demo_job.run_demo(model, heads, length=1900, seed=3, hops=2, max_new_tokens=6, progress=False)
    assert demo.config.params.select_k == 8 and demo.config.params.beta == 1.5  # the small-budget preset by default
    assert len(demo.steps) == 2 and set(demo.forced) == {"vanilla", "dysco"}
    # teacher forcing fed the whole gold answer, whatever the free budget
    gold_ids = demo.forced["dysco"].tokens
    assert len(gold_ids) == demo.instance.completion_n_tokens and len(demo.results["dysco"].tokens) <= 6
    report = demo_job.format_report(demo, tmp_path / "p.html")
    assert re.search(r"^  1 +\S+ → \S+", report, re.MULTILINE) and "step accuracy: vanilla" in report
    assert "No study covers tiny-llama" in report  # an unmeasured model gets no claim
    page = write_demo_page(demo, tmp_path / "p.html").read_text()
    assert page.count("Plotly.newPlot") == 4 and opens_offline(tmp_path / "p.html")
    assert "No study covers tiny-llama" in page and "<tr class=this>" not in page  # measured models only
    assert "Teacher-forced on the gold route" in page and "gold route, teacher-forced" in page
    with pytest.raises(ConfigError, match="vanilla with a DySCO method"):
        demo_job.run_demo(model, heads, length=1900, dysco=demo_job.preset("paper", method="vanilla"))


def test_the_verdict_points_a_model_that_cannot_show_it_to_one_that_can(tiny_llama):
    demo = demo_job.DemoResult.__new__(demo_job.DemoResult)
    demo.model = "smollm2-135m"
    line = demo_job.verdict(demo)
    assert "too small to show" in line and "dysco-interp demo --model qwen2.5-coder-1.5b" in line and "\n" not in line
    assert "{" not in line  # the measured numbers are filled in
    demo.model = "qwen2.5-coder-1.5b"
    assert demo_job.verdict(demo).startswith("Measured on qwen2.5-coder-1.5b: ")


def test_the_command_line_defaults_to_the_demo_preset():
    from dysco_interp.cli.app import build_parser

    assert build_parser().parse_args(["demo"]).preset == demo_job.DEFAULT_PRESET
    assert build_parser().parse_args(["generate", "--prompt", "x"]).preset == demo_job.DEFAULT_PRESET
