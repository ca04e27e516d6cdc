"""Exceptions raised by the simulated far systems.

The split mirrors what a caller can know after a failed call: a rejection means nothing
happened and a retry is safe, a timeout means the effect may have happened and the caller
must reconcile (look up by key) before retrying.
"""

from __future__ import annotations


class FarSystemError(Exception):
    """Base class for every failure reported by a simulated far system."""


class FarRejected(FarSystemError):
    """The far system definitely refused the call; no effect was recorded."""


class FarTimeout(FarSystemError):
    """The reply was lost; the effect may or may not have been recorded."""
