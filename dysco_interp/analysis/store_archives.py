"""Moved to `dysco_interp.stores.archives`; this path re-exports its names until the next release."""

from dysco_interp.deprecation import warn_moved
from dysco_interp.stores.archives import *  # noqa: F403
from dysco_interp.stores.archives import __all__  # noqa: F401

warn_moved(__name__, "dysco_interp.stores.archives")
