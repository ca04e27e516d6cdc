"""Configuration of the simulated far systems: lags, latency and fault rates.

Values come from built-in defaults, overridden by Django's ``settings.FAR_SYSTEMS`` (when
Django is configured), overridden in turn by ``FAR_*`` environment variables, so crash tests
can tune worker processes through the environment alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

# project/purchasing/far/config.py -> the repository root is three levels above this package.
BASE_DIR: Path = Path(__file__).resolve().parents[3]
DEFAULT_FAR_DIR: Path = BASE_DIR / "var" / "far"


@dataclass(frozen=True, kw_only=True)
class FaultConfig:
    """Fault injection shared by every system: per-call latency, rejections, lost replies."""

    latency: float = 0.0
    reject_rate: float = 0.0
    lost_reply_rate: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.latency < 0:
            raise ValueError(f"latency must be >= 0, got {self.latency}")
        for name in ("reject_rate", "lost_reply_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {rate}")


@dataclass(frozen=True, kw_only=True)
class PortalConfig(FaultConfig):
    """Supplier portal: ``search`` is served by a replica lagging up to ``search_lag_max`` s."""

    search_lag_max: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.search_lag_max < 0:
            raise ValueError(f"search_lag_max must be >= 0, got {self.search_lag_max}")


@dataclass(frozen=True, kw_only=True)
class CreditConfig(FaultConfig):
    """Credit vendor: a recorded check becomes visible to ``lookup`` after ``lookup_lag`` s."""

    lookup_lag: float = 60.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lookup_lag < 0:
            raise ValueError(f"lookup_lag must be >= 0, got {self.lookup_lag}")


@dataclass(frozen=True, kw_only=True)
class PaymentConfig(FaultConfig):
    """Payment provider: only fault injection; its lookup is strongly consistent."""


@dataclass(frozen=True, kw_only=True)
class CarrierConfig(FaultConfig):
    """Carrier: only fault injection; its lookup is strongly consistent."""


@dataclass(frozen=True, kw_only=True)
class EmailConfig(FaultConfig):
    """Email sender: only fault injection; it has no lookup at all."""


@dataclass(frozen=True, kw_only=True)
class WarehouseConfig(FaultConfig):
    """Warehouse: only fault injection; its lookups by key are strongly consistent."""


_F = TypeVar("_F", bound=FaultConfig)


@dataclass(frozen=True, kw_only=True)
class FarConfig:
    """Everything needed to build the six systems: their ledger directory and configs."""

    directory: Path
    portal: PortalConfig
    credit: CreditConfig
    payments: PaymentConfig
    carrier: CarrierConfig
    email: EmailConfig
    warehouse: WarehouseConfig = WarehouseConfig()


# Lowercase keys accepted in settings.FAR_SYSTEMS; the env var is "FAR_" + the key upper-cased.
SETTING_NAMES: frozenset[str] = frozenset(
    {"dir", "portal_search_lag", "credit_lookup_lag", "latency", "reject_rate", "lost_reply_rate", "seed"}
)


class _Sources:
    """Resolves one setting by precedence: environment, then FAR_SYSTEMS, then the default."""

    def __init__(self, environ: Mapping[str, str], overrides: Mapping[str, object]) -> None:
        unknown = set(overrides) - SETTING_NAMES
        if unknown:
            raise ValueError(f"unknown settings.FAR_SYSTEMS keys: {sorted(unknown)}")
        self._environ = environ
        self._overrides = overrides

    def _raw(self, name: str) -> tuple[object, str] | None:
        env_name = f"FAR_{name.upper()}"
        if env_name in self._environ:
            return self._environ[env_name], f"environment variable {env_name}"
        if name in self._overrides:
            return self._overrides[name], f"settings.FAR_SYSTEMS[{name!r}]"
        return None

    def number(self, name: str, default: float) -> float:
        found = self._raw(name)
        if found is None:
            return default
        raw, source = found
        try:
            return float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"invalid {source}: {raw!r}") from exc

    def seed(self) -> int | None:
        found = self._raw("seed")
        if found is None or found[0] in (None, ""):
            return None
        raw, source = found
        try:
            return int(raw)  # type: ignore[call-overload]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"invalid {source}: {raw!r}") from exc

    def directory(self) -> Path:
        found = self._raw("dir")
        if found is None or found[0] in (None, ""):
            return DEFAULT_FAR_DIR
        return Path(str(found[0]))


def django_far_settings() -> Mapping[str, object]:
    """Return ``settings.FAR_SYSTEMS`` if Django is importable and configured, else ``{}``."""
    try:
        from django.conf import settings
    except ImportError:
        return {}
    # Touching an unconfigured LazySettings raises ImproperlyConfigured; the far systems must
    # also work in plain processes (unit tests, scripts) where Django is never set up.
    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return {}
    value = getattr(settings, "FAR_SYSTEMS", None)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"settings.FAR_SYSTEMS must be a mapping, got {type(value).__name__}")
    return value


def config_from_env(
    environ: Mapping[str, str] | None = None,
    settings: Mapping[str, object] | None = None,
) -> FarConfig:
    """Build the configuration: defaults < ``settings`` (Django's FAR_SYSTEMS) < ``environ``.

    ``environ`` defaults to ``os.environ`` and ``settings`` to Django's ``FAR_SYSTEMS``; tests
    pass explicit mappings to stay independent of the process state.
    """
    sources = _Sources(
        os.environ if environ is None else environ,
        django_far_settings() if settings is None else settings,
    )
    latency = sources.number("latency", 0.0)
    reject_rate = sources.number("reject_rate", 0.0)
    lost_reply_rate = sources.number("lost_reply_rate", 0.0)
    seed = sources.seed()

    def build(cls: type[_F], **specific: float) -> _F:
        return cls(
            latency=latency,
            reject_rate=reject_rate,
            lost_reply_rate=lost_reply_rate,
            seed=seed,
            **specific,
        )

    return FarConfig(
        directory=sources.directory(),
        portal=build(PortalConfig, search_lag_max=sources.number("portal_search_lag", 5.0)),
        credit=build(CreditConfig, lookup_lag=sources.number("credit_lookup_lag", 60.0)),
        payments=build(PaymentConfig),
        carrier=build(CarrierConfig),
        email=build(EmailConfig),
        warehouse=build(WarehouseConfig),
    )
