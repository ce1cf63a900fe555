"""What a newcomer's terminal shows: help that answers without loading torch, a description for
every command, tables that fit 100 columns, columns that name the method they show, no interval
for one instance, and no transformers progress bar at our loads."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from dysco_interp.analysis.report import fmt_ci, fmt_delta
from dysco_interp.cli.app import build_parser
from dysco_interp.experiments import demo as demo_job
from dysco_interp.experiments.summary import SUMMARY_MIN_N, TABLE_WIDTH, format_table, summarise, summary_notes
from dysco_interp.tasks.registry import TASKS

HEAVY = ("torch", "transformers", "transformer_lens")

# Runs the command line as `dysco-interp` does (`python -m dysco_interp.cli`), once per argv,
# and prints which heavy modules were imported by the end.
PROBE = """
import json, runpy, sys
for argv in json.loads(sys.argv[1]):
    sys.argv = ["dysco-interp", *argv]
    try:
        runpy.run_module("dysco_interp.cli", run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
print(json.dumps([m for m in %r if m in sys.modules]), file=sys.__stderr__)
""" % (HEAVY,)


def subcommands() -> dict:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return dict(action.choices)


def test_help_and_a_bad_flag_import_neither_torch_nor_transformers():
    argvs = [["--help"], ["--bogus"], *([name, "--help"] for name in subcommands()), ["evaluate", "--bogus"],
             ["generate", "--method", "nope", "--prompt", "x"]]
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
    assert "usage: dysco-interp" in done.stdout and "dysco-interp: error:" in done.stderr


def test_every_command_says_what_it_does():
    assert "DySCO" in build_parser().description and "retrieval heads" in build_parser().description
    for name, parser in subcommands().items():
        assert parser.description and len(parser.description) > 40, name


def test_the_parser_reads_its_choices_from_the_modules_that_implement_them():
    from dysco_interp.decoding import choices
    from dysco_interp.decoding.backends import REGISTRY as BACKENDS
    from dysco_interp.decoding.config import PRESETS
    from dysco_interp.decoding.methods import REGISTRY as METHODS
    from dysco_interp.models.packaged.registry import DEFAULT_MODEL

    # the built-in methods and backends: a researcher's own join the registries at run time
    assert choices.PRESET_NAMES == tuple(PRESETS) and choices.METHOD_NAMES == tuple(METHODS)[:len(choices.METHOD_NAMES)]
    assert set(choices.BACKENDS) <= set(BACKENDS) and choices.BACKENDS == tuple(BACKENDS)[:len(choices.BACKENDS)]
    args = build_parser().parse_args(["evaluate", "--data", "d", "--out", "o.jsonl"])
    assert args.model == DEFAULT_MODEL and args.methods == "vanilla,dysco"


def records(n_per_length: dict[int, int], metrics) -> list[dict]:
    out = []
    for length, n in n_per_length.items():
        for method in ("dysco", "dysco-random", "vanilla"):
            for i in range(n):
                value = (i * 7 % 5) / 5 + (0.1 if method != "vanilla" else 0.0)
                out.append({"length": length, "method": method, "instance": f"{length}-{i}", "index": i,
                            **{m: value for m in metrics}})
    return out


@pytest.mark.parametrize("forced", [False, True], ids=["free", "teacher-forced"])
@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_evaluate_table_fits_100_columns(task, forced):
    metrics = TASKS[task].metrics.forced if forced else TASKS[task].metrics.free
    table = format_table(summarise(records({1024: SUMMARY_MIN_N, 2048: SUMMARY_MIN_N}, metrics), metrics), metrics)
    assert "[" in table and max(len(line) for line in table.splitlines()) <= TABLE_WIDTH == 100
    assert all(m in table for m in metrics)


def test_a_table_wider_than_its_width_goes_on_below():
    metrics = [f"metric_{i}" for i in range(9)]
    table = format_table(summarise(records({1024: 3}, metrics), metrics), metrics)
    assert max(len(line) for line in table.splitlines()) <= 100
    assert table.count("length") >= 2 and all(m in table for m in metrics)


def test_under_ten_instances_print_n_too_small_instead_of_an_interval():
    metrics = ["accuracy"]
    summary = summarise(records({1024: SUMMARY_MIN_N - 1, 2048: SUMMARY_MIN_N}, metrics), metrics)
    assert SUMMARY_MIN_N == 10 and summary[(1024, "dysco")]["delta_accuracy"][1:3] == (None, None)
    better, worse, p = summary[(1024, "dysco")]["delta_accuracy"][3:]  # the exact test needs no minimum
    assert better + worse <= SUMMARY_MIN_N - 1 and 0 < p <= 1
    lines = format_table(summary, metrics).splitlines()
    rows = [line.split()[:2] for line in lines if line[:7].strip()]
    assert rows[2:5] == [["1024", "vanilla"], ["1024", "dysco"], ["1024", "dysco-random"]]  # the baseline first
    at_1024 = lines[lines.index(next(x for x in lines if x.split()[:2] == ["1024", "dysco"])):][:4]
    assert "- vanilla" in at_1024[1] and at_1024[2].split() == ["95%", "CI", "n", "too", "small"]
    assert at_1024[3].split()[0] == "better/worse" and f"{better}↑{worse}↓ p=" in at_1024[3]
    at_2048 = "\n".join(lines[lines.index(next(x for x in lines if x.split()[:2] == ["2048", "dysco"])):])
    assert "[" in at_2048 and "n too small" not in at_2048
    assert fmt_ci({"mean": 0.5, "lo": 0.5, "hi": 0.5, "n": 1}) == "0.500 (n too small)"
    assert fmt_delta({"mean": 0.1, "lo": 0.0, "hi": 0.2, "n": 5}) == "+0.100 [+0.000, +0.200]"


def test_the_summary_says_what_its_numbers_cannot_show():
    metrics = TASKS["path_traversal"].metrics
    rows = records({1024: 2}, metrics.free)
    for r in rows:  # no output held a <Route> block: every free score is 0
        r.update({m: 0.0 for m in metrics.free})
    notes = summary_notes(summarise(rows, metrics.free), metrics.free, metrics.extraction, teacher_forced=False)
    assert len(notes) == 2
    assert notes[0].startswith("n = 2: too few instances for an interval")
    assert "extraction_rate 0 for vanilla at 1024, dysco at 1024, dysco-random at 1024" in notes[1]
    assert "--teacher-forced" in notes[1]
    # teacher-forced, or with enough instances and answers found, nothing to say
    assert summary_notes(summarise(rows, metrics.free), metrics.free, metrics.extraction, teacher_forced=True) == \
        [notes[0]]
    found = records({1024: SUMMARY_MIN_N}, metrics.free)
    assert summary_notes(summarise(found, metrics.free), metrics.free, metrics.extraction, teacher_forced=False) == []


def fake_demo() -> demo_job.DemoResult:
    step = SimpleNamespace(step=0, edge="A → B", qr_mass=0.5, qr_rank=1, all_mass=0.01, all_rank=3,
                           outside_edges=0.2, selected=0.5, logprob={"vanilla": -2.0, "dysco": -1.0},
                           correct={"vanilla": False, "dysco": True})
    demo = demo_job.DemoResult.__new__(demo_job.DemoResult)
    demo.instance = SimpleNamespace(n_edges=6)
    demo.steps = [step]
    return demo


def test_the_demo_table_names_the_method_of_every_column_it_compares():
    header, columns, row = demo_job.step_table(fake_demo())
    assert "log p(city)" in header and "argmax right" in header
    assert columns.split()[-4:] == ["vanilla", "DySCO", "vanilla", "DySCO"]
    assert row.split()[-4:] == ["-2.00", "-1.00", "no", "yes"] and "no/yes" not in row
    # each value sits under the column that names its method
    assert row.index("-1.00") == columns.index("DySCO") and row.rindex("yes") == columns.rindex("DySCO")


def test_the_selection_says_a_range_in_words():
    assert demo_job.selection_text([8, 8], 1913) == "DySCO selected 8 of ~1913 keys at every step"
    assert demo_job.selection_text([5, 9, 7]) == "DySCO selected 5 to 9 keys per step (mean 7.0)"


def test_our_loads_hide_the_transformers_bar_and_restore_the_users_setting():
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    from dysco_interp.models.sources import transformers_bars

    before = hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled()
    try:
        hf_logging.enable_progress_bar()
        with transformers_bars(progress=True):
            assert not hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()  # downloads show
        with transformers_bars(progress=False):
            assert not hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
        assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()
        hf_logging.disable_progress_bar()  # a user who wants no bars keeps none
        with transformers_bars(progress=True):
            assert are_progress_bars_disabled()
        assert not hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
    finally:
        (hf_logging.enable_progress_bar if before[0] else hf_logging.disable_progress_bar)()
        (disable_progress_bars if before[1] else enable_progress_bars)()


@pytest.mark.real_model
def test_a_load_with_progress_prints_ours_and_not_loading_weights(capfd):
    from dysco_interp import load_model

    load_model("smollm2-135m", device="cpu", progress=True)
    out, err = capfd.readouterr()
    assert "Loading weights" not in err and "%|" not in err, err[-500:]
    assert "[dysco-interp] loaded smollm2-135m" in out
