"""The Hugging Face hub, for users who have one: whether a hub id can be fetched (answered
within seconds, where transformers retries an unreachable hub for a minute), the
from_pretrained kwargs for it, and the snapshot it was loaded from."""

from __future__ import annotations

import threading
from pathlib import Path

from dysco_interp.errors import ModelNotFoundError
from dysco_interp.models.packaged.registry import known_aliases


def hub_probe(endpoint: str, repo_id: str, timeout: float = 3.0) -> str:
    """"present", "absent" or "unreachable": one HEAD request, without retries, for the
    repo's config.json (what from_pretrained fetches first), within `timeout` seconds.

    transformers retries an unreachable hub for a minute before failing; this answers first.
    HTTP 401/404 is "absent" (a private or gated repo without a token looks the same); any
    other HTTP answer, a redirect included, lets the real download decide.
    """
    from urllib.error import HTTPError
    from urllib.request import HTTPRedirectHandler, Request, build_opener

    from huggingface_hub.utils import build_hf_headers

    class NoRedirect(HTTPRedirectHandler):
        # A redirect (to a CDN, or a renamed repo) already says the file exists.
        def redirect_request(self, *args, **kwargs):
            return None

    url = f"{endpoint.rstrip('/')}/{repo_id}/resolve/main/config.json"
    answer = []

    def attempt() -> None:
        try:
            request = Request(url, method="HEAD", headers=build_hf_headers())
            build_opener(NoRedirect).open(request, timeout=timeout).close()
            answer.append("present")
        except HTTPError as e:
            answer.append("absent" if e.code in (401, 404) else "present")
        except (OSError, ValueError):  # no route, refused, no such host, timed out, bad URL
            answer.append("unreachable")

    # In a thread: name resolution has no timeout of its own.
    probe = threading.Thread(target=attempt, daemon=True)
    probe.start()
    probe.join(timeout)
    return answer[0] if answer else "unreachable"


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", "\\")) or name.count("/") > 1 or name.endswith(("/", ".gguf"))


def hub_kwargs(name: str) -> dict:
    """from_pretrained kwargs for a hub id, or a ModelNotFoundError within seconds when the
    id cannot be fetched: offline, or no hub reachable, and not in the local Hugging Face cache."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if _looks_like_path(name):
        raise ModelNotFoundError(
            f"no model folder at {Path(name).expanduser()} (and {name!r} is no registry alias: {known_aliases()})"
        )
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ModelNotFoundError(
            f"unknown model {name!r}: not a registry alias ({known_aliases()}), not a local folder, "
            "and not a Hugging Face id"
        ) from None
    offline = constants.is_offline_mode()
    answer = "unreachable" if offline else hub_probe(constants.ENDPOINT, name)
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        # Cached: read it from there rather than ask a hub that does not answer.
        return {} if answer == "present" else {"local_files_only": True}
    if answer != "present":
        why = {
            "absent": f"the model hub {constants.ENDPOINT} has no such model (a private or gated one needs a token)",
            "unreachable": f"the model hub {constants.ENDPOINT} is not reachable",
        }[answer]
        raise ModelNotFoundError(
            f"unknown model {name!r}: not a registry alias ({known_aliases()}), not a local folder, "
            f"not in the Hugging Face cache, and {'HF_HUB_OFFLINE is set' if offline else why}"
        )
    return {}


def hub_snapshot(name: str) -> str | None:
    """The commit of the cached snapshot of a hub id, or None when it is not cached."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    return Path(cached).parent.name if isinstance(cached, str) else None
