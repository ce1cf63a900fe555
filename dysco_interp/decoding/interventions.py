"""Moved to `dysco_interp.decoding.backends.bridge_hooks` (the bridge backend's TransformerLens
hooks live with it); this path re-exports its names until the next release."""

from dysco_interp.decoding.backends.bridge_hooks import *  # noqa: F403
from dysco_interp.decoding.backends.bridge_hooks import __all__  # noqa: F401
from dysco_interp.deprecation import warn_moved

warn_moved(__name__, "dysco_interp.decoding.backends.bridge_hooks")
