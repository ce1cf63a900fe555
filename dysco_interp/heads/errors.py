"""The errors of head sets and head files; all are ValueErrors and DyscoErrors."""

from __future__ import annotations

from dysco_interp.errors import DyscoError


class HeadSetError(DyscoError, ValueError):
    """A head set is invalid: bad index, duplicate head, scores of the wrong length."""


class HeadFileError(HeadSetError):
    """A head file (or an object given in its place) cannot be read as a head set."""


class HeadModelMismatchError(HeadSetError):
    """A head set was made for a different model (name or geometry) than the loaded one."""
