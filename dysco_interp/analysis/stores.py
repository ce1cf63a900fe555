"""Moved: the evaluation records and their pooling to `dysco_interp.analysis.records`, `expand` to
`dysco_interp.stores.archives`; this path re-exports their names until the next release."""

from dysco_interp.analysis.records import *  # noqa: F403
from dysco_interp.analysis.records import __all__ as _records
from dysco_interp.deprecation import warn_moved
from dysco_interp.stores.archives import expand

__all__ = [*_records, "expand"]

warn_moved(__name__, "dysco_interp.analysis.records (expand to dysco_interp.stores.archives)")
