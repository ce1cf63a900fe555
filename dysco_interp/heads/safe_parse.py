"""Safe reading of head files: JSON and YAML to plain values, nothing unpickled or evaluated.

JSON goes through `json` and YAML through a safe loader; both refuse duplicate keys, and
values nested deeper than any head format needs are refused before they can overflow the
stack. Every problem comes out as one HeadFileError line that names the source.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from dysco_interp.checks import brief
from dysco_interp.errors import DataError
from dysco_interp.heads.errors import HeadFileError, HeadModelMismatchError, HeadSetError
from dysco_interp.jsonl import NotRegularFileError, open_regular, read_whole

T = TypeVar("T")

# Every head format nests at most five levels (our `extra` holds the score matrix); a file
# that nests far deeper is not a head file, and deep values would overflow the stack later.
MAX_DEPTH = 32


def naming_source(source: str, fn: Callable[[], T]) -> T:
    """Run a parser; a HeadSetError comes out naming the source (a mismatch keeps its class)."""
    try:
        return fn()
    except HeadFileError:
        raise  # already names its source
    except HeadModelMismatchError as e:
        raise HeadModelMismatchError(f"{source}: {e}") from None
    except HeadSetError as e:
        raise HeadFileError(f"{source}: {e}") from None


def check_depth(obj: Any) -> Any:
    """HeadSetError when containers nest deeper than MAX_DEPTH; iterative, so any depth is safe."""
    stack, seen = [(obj, 1)], set()
    while stack:
        x, depth = stack.pop()
        if not isinstance(x, (list, tuple, Mapping)) or id(x) in seen:
            continue
        if depth > MAX_DEPTH:
            raise HeadSetError(f"values nest more than {MAX_DEPTH} levels deep; not a head file")
        seen.add(id(x))
        children = list(x.keys()) + list(x.values()) if isinstance(x, Mapping) else x
        stack.extend((c, depth + 1) for c in children)
    return obj


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise HeadSetError(f"duplicate key {brief(k)}")
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise HeadSetError(f"{name} is not a valid number in a head file")


def parse_json_text(text: str, source: str) -> Any:
    def parse() -> Any:
        try:
            obj = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)
        except json.JSONDecodeError as e:
            raise HeadSetError(f"not valid JSON: {e}") from None
        except RecursionError:
            raise HeadSetError(f"values nest more than {MAX_DEPTH} levels deep; not a head file") from None
        return check_depth(obj)

    return naming_source(source, parse)


def read_text(path: Path) -> str:
    """A head file's text; HeadFileError for a missing file, anything but a regular file (a FIFO
    would block the reader), a file too large to be a head file, or one that is not UTF-8."""
    try:
        with open_regular(path) as f:
            return read_whole(f, f"head file {path}").decode("utf-8")
    except FileNotFoundError:
        raise HeadFileError(f"head file not found: {path}") from None
    except DataError as e:
        raise HeadFileError(str(e)) from None
    except NotRegularFileError as e:
        raise HeadFileError(f"head file {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise HeadFileError(f"cannot read head file {path}: {e}") from None


def read_json(path: Path) -> Any:
    return parse_json_text(read_text(path), str(path))


def parse_yaml_text(text: str, source: str) -> Any:
    try:
        import yaml
    except ImportError as e:  # pragma: no cover - PyYAML comes with transformers
        raise HeadFileError(f"{source}: reading YAML needs PyYAML (pip install pyyaml)") from e

    class _StrictSafeLoader(yaml.SafeLoader):
        """SafeLoader (no python/* tags: nothing is constructed or run) that refuses duplicate
        and unhashable keys (a list as a key would otherwise be a TypeError, not a file error)."""

        def construct_mapping(self, node, deep=False):
            keys = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in keys
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"unhashable key {brief(key)}", key_node.start_mark
                    ) from None
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {brief(key)}", key_node.start_mark
                    )
                keys.add(key)
            return super().construct_mapping(node, deep=deep)

    try:
        obj = yaml.load(text, Loader=_StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise HeadFileError(f"{source}: values nest more than {MAX_DEPTH} levels deep; not a head file") from None
    except yaml.YAMLError as e:
        tagged = "python/" in str(e)
        why = " (python-specific tags such as !!python/tuple are refused; write [layer, head])" if tagged else ""
        raise HeadFileError(f"{source}: not valid safe YAML{why}: {_yaml_problem(e)}") from None
    return naming_source(source, lambda: check_depth(obj))


def _yaml_problem(error) -> str:
    """PyYAML's message on one line: the problem and where it is (its str() spans several lines)."""
    problem = getattr(error, "problem", None) or getattr(error, "context", None)
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if problem is None:
        return " ".join(str(error).split())
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"
