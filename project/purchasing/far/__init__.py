"""Simulations of the six external ("far") systems a purchase run talks to.

Each keeps its own effect ledger in its own SQLite file, committed independently of the run's
database transaction, so crash tests can count effects per key and detect duplicates.
"""

from __future__ import annotations

from typing import NamedTuple

from .carrier import Carrier
from .config import (
    CarrierConfig,
    CreditConfig,
    EmailConfig,
    FarConfig,
    FaultConfig,
    PaymentConfig,
    PortalConfig,
    WarehouseConfig,
    config_from_env,
)
from .credit import CreditVendor
from .email import EmailSender
from .errors import FarRejected, FarSystemError, FarTimeout
from .ledger import FarSystem, StrPath
from .payments import PaymentProvider
from .portal import SupplierPortal
from .warehouse import Warehouse


class FarSystems(NamedTuple):
    """The six simulated systems, sharing one ledger directory."""

    portal: SupplierPortal
    credit: CreditVendor
    payments: PaymentProvider
    carrier: Carrier
    email: EmailSender
    warehouse: Warehouse


def systems(config: FarConfig | None = None, directory: StrPath | None = None) -> FarSystems:
    """Build all six systems from ``config`` (default: ``config_from_env()``).

    ``directory`` overrides the ledger directory of the configuration.
    """
    loaded = config_from_env() if config is None else config
    where = loaded.directory if directory is None else directory
    return FarSystems(
        portal=SupplierPortal(loaded.portal, where),
        credit=CreditVendor(loaded.credit, where),
        payments=PaymentProvider(loaded.payments, where),
        carrier=Carrier(loaded.carrier, where),
        email=EmailSender(loaded.email, where),
        warehouse=Warehouse(loaded.warehouse, where),
    )


def reset_all(config: FarConfig | None = None, directory: StrPath | None = None) -> None:
    """Empty the ledgers of all six systems (one transaction per system, not atomic overall)."""
    for system in systems(config, directory):
        system.reset()


__all__ = [
    "Carrier",
    "CarrierConfig",
    "CreditConfig",
    "CreditVendor",
    "EmailConfig",
    "EmailSender",
    "FarConfig",
    "FarRejected",
    "FarSystem",
    "FarSystemError",
    "FarSystems",
    "FarTimeout",
    "FaultConfig",
    "PaymentConfig",
    "PaymentProvider",
    "PortalConfig",
    "SupplierPortal",
    "Warehouse",
    "WarehouseConfig",
    "config_from_env",
    "reset_all",
    "systems",
]
