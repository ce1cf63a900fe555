"""The task registry: a new task is its own files plus one registration, every registered spec is
complete, and the places that once listed tasks (tasks, evaluate, make-data, the result tables)
now read the registry.

The copy task below is the proof: defined in this file alone and registered with one line
(`register_task`, as the built-in tasks are), it is made by `make-data` (with a flag of its own)
and scored by `evaluate`, freely and teacher-forced, on the tiny model, with no other file touched.
"""

from __future__ import annotations

import ast
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from dysco_interp.argtypes import positive_int
from dysco_interp.chat import Span, content_spans, encode_chat
from dysco_interp.cli import main
from dysco_interp.cli.app import build_parser
from dysco_interp.errors import ConfigError
from dysco_interp.experiments.evaluate import task_metrics
from dysco_interp.models.tiny import tiny_tokenizer
from dysco_interp.stores.store import read_store
from dysco_interp.tasks import load_dataset, make_dataset
from dysco_interp.tasks.base import (
    DEFAULT_TOLERANCE,
    LengthSearch,
    SpanRecord,
    check_tolerance,
    fit_count,
    instance_rng,
    prompt_fields,
    provenance,
)
from dysco_interp.tasks.registry import TASKS, get_task, register_task
from dysco_interp.tasks.spec import DataFlag, Evaluation, TableMetric, TaskMetrics, TaskSpec

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dysco_interp"

# ---------------------------------------------------------------------------- a new task, in this file alone

COPY = "copy"
WORDS = "apple river stone cloud lamp garden violin copper meadow harbor lantern pebble".split()
LEAD = "Repeat these words exactly: "


@dataclass
class CopyInstance(SpanRecord):
    """Words to repeat; the span of the words in the rendered prompt."""

    id: str
    words: list[str]
    prompt: str
    prompt_text: str
    n_tokens: int
    n_generation_prompt: int
    words_char_span: Span
    words_token_span: Span
    vocabulary: int
    task: str = COPY
    seed: int | None = None
    index: int | None = None
    target_tokens: int | None = None
    tokenizer: str | None = None
    enable_thinking: bool | None = None

    SPAN_FIELDS = ("words_char_span", "words_token_span")


def generate_copy(tokenizer, target_tokens: int | None = None, *, seed: int = 0, index: int = 0,
                  vocabulary: int = len(WORDS), tolerance: float = DEFAULT_TOLERANCE,
                  enable_thinking: bool | None = None) -> CopyInstance:
    check_tolerance(tolerance)
    rng = instance_rng(COPY, seed, index)
    pool = [rng.choice(WORDS[:vocabulary]) for _ in range(2000)]

    def build(count: int) -> CopyInstance:
        words = pool[:count]
        prompt = LEAD + " ".join(words)
        enc = encode_chat(tokenizer, prompt, enable_thinking=enable_thinking)
        ((base, _),) = content_spans(enc, prompt, tokenizer, enable_thinking)
        chars = (base + len(LEAD), base + len(prompt))
        return CopyInstance(words=words, prompt=prompt, words_char_span=chars, words_token_span=enc.token_span(*chars),
                            vocabulary=vocabulary, **prompt_fields(enc, tokenizer, enable_thinking),
                            **provenance(COPY, seed, index, target_tokens, count, "w"))

    search = LengthSearch(target_tokens or 64, tolerance, overhead=build(1).n_tokens, tokens_per_unit=2.0,
                          min_count=1, max_count=len(pool), too_short=lambda got: f"too short: {got} tokens")
    return fit_count(build, lambda x: x.n_tokens, search)


def score_copy(text: str, instance: CopyInstance) -> dict[str, float]:
    said = text.split()
    hits = sum(a == b for a, b in zip(said, instance.words))
    return {"exact": float(said == instance.words), "word_accuracy": hits / len(instance.words)}


def copy_spec(**changes) -> TaskSpec:
    """The copy task's spec, built anew on every call (as a notebook cell run again would)."""
    fields = dict(
        name=COPY,
        title="Copy",
        generate=generate_copy,
        instance_type=CopyInstance,
        options=("vocabulary", "tolerance", "enable_thinking"),
        summary=lambda x: {"tokens": x.n_tokens, "words": len(x.words)},
        evaluation=Evaluation(prompt=lambda x: x.prompt, spans=lambda x: {"words": x.words_token_span},
                              score=score_copy, gold=lambda x: " ".join(x.words)),
        metrics=TaskMetrics(free=("exact", "word_accuracy"), forced=("tf_logprob", "tf_token_accuracy"),
                            primary="word_accuracy", primary_forced="tf_logprob",
                            tables=(TableMetric("word_accuracy", "word accuracy", "word accuracy", compared=True),)),
        flags=(DataFlag("--vocabulary", "vocabulary", "distinct words to draw from", type=positive_int),),
    )
    return TaskSpec(**{**fields, **changes})


COPY_SPEC = copy_spec()


@pytest.fixture
def copy_task():
    register_task(COPY_SPEC)  # the one registration a new task needs
    yield COPY_SPEC
    TASKS.pop(COPY, None)


def test_a_new_task_is_its_files_plus_one_registration(copy_task, tmp_path, capsys):
    data = tmp_path / "data"
    assert main(["make-data", "copy", "--model", "tiny-llama", "--lengths", "300", "--n", "2", "--vocabulary", "3",
                 "--out", str(data)]) == 0
    made = capsys.readouterr().out
    assert "tokens reached" in made and "words" in made
    instances = load_dataset(data / "copy_300.jsonl")
    assert [type(x) for x in instances] == [CopyInstance] * 2
    assert all(len(set(x.words)) <= 3 and abs(x.n_tokens - 300) <= 15 for x in instances)

    for forced in (False, True):
        out = tmp_path / f"res_{forced}.jsonl"
        argv = ["evaluate", "--task", "copy", "--model", "tiny-llama", "--data", str(data), "--methods", "vanilla",
                "--out", str(out), "--max-new-tokens", "4", *(["--teacher-forced"] if forced else [])]
        assert main(argv) == 0
        printed = capsys.readouterr().out
        metrics = copy_task.metrics.forced if forced else copy_task.metrics.free
        assert all(m in printed for m in metrics) and "2 new records" in printed
        records = read_store(out).records
        assert {r["task"] for r in records} == {"copy"} and len(records) == 2
        assert all(r.get(m) is not None for r in records for m in metrics)
    # the task's flag belongs to it alone
    assert main(["make-data", "mrcr", "--model", "tiny-llama", "--vocabulary", "3", "--out", str(tmp_path)]) == 2
    assert "--vocabulary applies to task 'copy', not 'mrcr'" in capsys.readouterr().err


def test_the_command_line_lists_registered_tasks(copy_task, capsys):
    assert main(["make-data", "--help"]) == 0
    text = capsys.readouterr().out
    assert "one of: path_traversal, needle_qa, mrcr, copy" in text and "--vocabulary" in text
    assert main(["evaluate", "--help"]) == 0
    assert "path_traversal (default), needle_qa, mrcr or copy" in " ".join(capsys.readouterr().out.split())


def test_a_registered_task_is_listed_and_its_name_is_its_own(copy_task):
    assert TASKS[COPY] is copy_task and get_task("Copy") is copy_task and list(TASKS)[-1] == COPY
    assert register_task(copy_task) is copy_task  # again: harmless
    rebuilt = copy_spec()  # the same code run again: new functions, the same task
    assert register_task(rebuilt) is rebuilt and TASKS[COPY] is rebuilt
    with pytest.raises(ConfigError, match="^task 'copy' is already registered, by another spec") as e:
        register_task(copy_spec(title="Copy again"))
    assert "\n" not in str(e.value) and TASKS[COPY] is rebuilt


def test_the_built_in_tasks_go_through_register_task():
    assert list(TASKS)[:3] == ["path_traversal", "needle_qa", "mrcr"]
    for spec in list(TASKS.values()):
        assert register_task(spec) is spec


@pytest.mark.parametrize("spec,why", [
    ("copy", "register_task takes a TaskSpec, got 'copy'"),
    (copy_spec(name="Copy"), "a task needs a name of lower-case letters, digits and '_'"),
    (copy_spec(name="copy words"), "a task needs a name of lower-case letters, digits and '_'"),
    (copy_spec(name=""), "a task needs a name of lower-case letters"),
    (copy_spec(name=None), "a task needs a name of lower-case letters"),
    (copy_spec(aliases="cp"), "task 'copy': aliases are a tuple of lower-case names"),
    (copy_spec(aliases=("Cp",)), "task 'copy': aliases are a tuple of lower-case names"),
    (copy_spec(name="pt"), "task 'pt': 'pt' already names task 'path_traversal'; choose another name"),
    (copy_spec(aliases=("cp", "qa")), "task 'copy': 'qa' already names task 'needle_qa'; choose another alias"),
], ids=["not-a-spec", "upper-case", "space", "empty", "none", "alias-string", "alias-upper", "an-alias", "alias-taken"])
def test_register_task_refuses_bad_input_in_one_line(spec, why):
    before = dict(TASKS)
    with pytest.raises(ConfigError) as e:
        register_task(spec)
    assert str(e.value).startswith(why) and "\n" not in str(e.value)
    assert TASKS == before


# ---------------------------------------------------------------------------- every registered spec is complete


@pytest.mark.parametrize("name", list(TASKS))
def test_every_registered_spec_is_complete(name):
    spec = TASKS[name]
    assert spec.name == name and spec.title and get_task(name) is spec
    assert all(get_task(alias) is spec for alias in spec.aliases)
    # the name the instances carry, and the options the generator takes
    assert spec.instance_type.__dataclass_fields__["task"].default == name
    params = inspect.signature(spec.generate).parameters
    assert {"seed", "index", *spec.options} <= set(params)
    m = spec.metrics
    assert m.free and m.forced and m.primary in m.free and m.primary_forced in m.forced
    assert set(m.table_fields) <= set(m.free) and set(m.compared) <= set(m.table_fields)
    assert all(flag.option in spec.options and flag.flag.startswith("--") for flag in spec.flags)
    # an instance goes through the evaluation: prompt, spans, gold answer, and a score of every free metric
    instance = make_dataset(name, tiny_tokenizer("llama"), 1950, n=1)[0]
    ev = spec.evaluation
    assert ev.prompt(instance) and ev.gold(instance) and ev.unscorable(instance) is None
    assert all(0 <= a <= b <= instance.n_tokens for a, b in (ev.spans(instance) or {}).values())
    assert set(m.free) <= set(ev.score(ev.gold(instance), instance))
    assert set(task_metrics(name)) == {*m.free, *m.forced}


def test_names_flags_and_aliases_do_not_collide():
    aliases = [a for spec in TASKS.values() for a in spec.aliases]
    assert len(set(aliases)) == len(aliases) and not set(aliases) & set(TASKS)
    dests = [flag.dest for spec in TASKS.values() for flag in spec.flags]
    assert len(set(dests)) == len(dests)
    make_data = next(a for a in build_parser()._actions if a.dest == "command").choices["make-data"]
    shared = {a.dest for a in make_data._actions} - set(dests)
    assert not shared & set(dests)


def test_each_task_package_names_itself_as_registered():
    """A task's name is defined once, in its package (`TASK`), and its spec is in its own `spec.py`."""
    import importlib

    for name, spec in TASKS.items():
        package = importlib.import_module(f"dysco_interp.tasks.{name}")
        assert package.TASK == name
        assert inspect.getmodule(spec.generate).__name__.startswith(f"dysco_interp.tasks.{name}.")
        assert (PACKAGE / "tasks" / name / "spec.py").is_file()


# ---------------------------------------------------------------------------- the old places read the registry

# where tasks used to be registered, and the command, tables and figure that listed them; not
# detect-heads, whose one task (needle QA, its --data default) is what detection runs on
READERS = (
    "tasks/__init__.py", "experiments/evaluate.py", "cli/make_data.py", "cli/evaluate.py",
    "analysis/result_tables.py", "studies/table_reports.py", "studies/budget_choice.py",
    "studies/budget_report.py", "viz/budget_figure.py",
)


def code_strings(tree: ast.AST) -> list[str]:
    """String constants of a module that are not docstrings."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


@pytest.mark.parametrize("path", READERS)
def test_the_old_places_name_no_task(path):
    tree = ast.parse((PACKAGE / path).read_text(encoding="utf-8"))
    names = set(TASKS) | {a for spec in TASKS.values() for a in spec.aliases}
    assert [s for s in code_strings(tree) if s.strip().lower() in names] == []
    # a task's internals (scorers, instance classes) are reached through its spec only
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    internals = [m for m in imported if m.split(".")[:2] == ["dysco_interp", "tasks"] and len(m.split(".")) > 3
                 and m.split(".")[2] in TASKS and m.split(".")[3] != "spec"]
    assert internals == []
    assert not any(m == "dysco_interp.tasks" and {a.name for a in node.names} & set(TASKS)
                   for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for m in [node.module])


def test_the_checker_sees_a_task_named_in_code():
    tree = ast.parse('"""path_traversal in a docstring is fine."""\nX = {"mrcr": 1}\n')
    assert code_strings(tree) == ["mrcr"]


def test_help_lists_the_registry_without_loading_torch():
    import subprocess
    import sys

    code = ("import sys, contextlib, io\nfrom dysco_interp.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out: main(['make-data', '--help'])\n"
            "print(json.dumps(['torch' in sys.modules, 'transformers' in sys.modules, out.getvalue()]))")
    done = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, check=True)
    torch, transformers, text = json.loads(done.stdout)
    assert not torch and not transformers and f"one of: {', '.join(TASKS)}" in text
