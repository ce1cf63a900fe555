"""Moved to `dysco_interp.distributed` (data-parallel runs serve the jobs and the libraries below
them alike); this path re-exports its names until the next release."""

from dysco_interp.deprecation import warn_moved
from dysco_interp.distributed import *  # noqa: F403
from dysco_interp.distributed import __all__  # noqa: F401

warn_moved(__name__, "dysco_interp.distributed")
