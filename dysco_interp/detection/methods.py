"""Detection methods by name, their fixed parameters, and the error for data they cannot score."""

from __future__ import annotations

from dysco_interp.errors import ConfigError

QRSCORE = "qrscore"
QRSCORE_NDCG = "qrscore-ndcg"
COPY_PASTE = "copy-paste"
METHODS = (QRSCORE, QRSCORE_NDCG, COPY_PASTE)
_METHOD_ALIASES = {"copy": COPY_PASTE, "copy_paste": COPY_PASTE, "qrscore_ndcg": QRSCORE_NDCG, "ndcg": QRSCORE_NDCG}
DEFAULT_TOP_K = 16
NDCG_K = 10
FILTER_SIGMAS = 2.0
DEFAULT_MAX_NEW_TOKENS = 12


class DetectionInputError(ConfigError):
    """Detection data that cannot be scored: no examples, spans outside the prompt, ..."""


def resolve_method(method: str) -> str:
    key = str(method).strip().lower()
    key = _METHOD_ALIASES.get(key, key)
    if key not in METHODS:
        raise ConfigError(f"unknown detection method {method!r}; choose one of {', '.join(METHODS)} (or 'copy')")
    return key
