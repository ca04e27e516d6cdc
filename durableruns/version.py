"""durableruns' version, in a module of its own below everything that names it: the package's face re-exports
it, tracing names its tracer by it, the API's schema shows it, and packaging reads it (pyproject.toml)."""

from __future__ import annotations

__version__ = "0.2.0"
