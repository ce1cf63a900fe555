"""The names decoding options take, in a module that imports nothing heavy.

The command line's parser offers them as choices, and `--help` must answer without loading
torch; the modules that implement each choice import their names from here and check that
they cover the same ones.
"""

from __future__ import annotations

from typing import Literal, get_args

MethodName = Literal["vanilla", "uniattns", "dysco", "dysco-static", "dysco-random", "dysco-reuse", "dysco-gated"]
METHOD_NAMES: tuple[MethodName, ...] = get_args(MethodName)
# the field's methods and DySCO's open variants (`decoding.baselines`), which register beside the built-in ones
BaselineName = Literal["dysco-lagged", "dysco-hard", "dysco-middle", "dysco-sparse", "instaboost", "logn",
                       "pasta", "pos-calibration", "qr-pasta"]
BASELINE_NAMES: tuple[BaselineName, ...] = get_args(BaselineName)
# every method a command line can name without a file of one's own
KNOWN_METHODS: tuple[str, ...] = (*METHOD_NAMES, *BASELINE_NAMES)

# the keys of `decoding.config.PRESETS`, which checks it holds exactly these
PRESET_NAMES = ("paper", "paper-strong", "paper-long", "quick-check", "small-budget")
# every command's --preset unless given: the rule our dev split chose from 2K to 128K tokens (figures/README.md,
# "Selection budget" and "The paper's regime"); the paper's presets were at or below vanilla there
DEFAULT_PRESET = "small-budget"

Schedule = Literal["reference", "paper"]
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)

TemplateMasking = Literal["reference", "skeleton", "off"]
MASKING_MODES: tuple[TemplateMasking, ...] = get_args(TemplateMasking)

BackendName = Literal["bridge", "sdpa", "static", "flex"]
BACKENDS: tuple[BackendName, ...] = get_args(BackendName)
# each built-in backend's own options (its `Options` fields), for command lines that check their
# flags before torch is imported; a test holds this table to the classes
BACKEND_OPTIONS: dict[str, tuple[str, ...]] = {"bridge": (), "sdpa": (),
                                               "static": ("decode_attention", "compile_kernels", "matvec"),
                                               "flex": ("compile_kernels",)}


def backends_with(option: str) -> list[str]:
    """The built-in backends that have `option`."""
    return [name for name, options in BACKEND_OPTIONS.items() if option in options]

# the static backend's decoding attention (`backends.decode_attention`)
DECODE_ATTENTION = ("sdpa", "float32")
DEFAULT_DECODE_ATTENTION = "sdpa"
