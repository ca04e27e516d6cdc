"""Unit tests of the simulated far systems: lags, deduplication (or its absence), faults.

No Django: every system gets the pytest ``tmp_path`` as its ledger directory.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from project.purchasing.far import (
    Carrier,
    CarrierConfig,
    CreditConfig,
    CreditVendor,
    EmailConfig,
    EmailSender,
    FarRejected,
    FarSystem,
    FarSystemError,
    FarTimeout,
    PaymentConfig,
    PaymentProvider,
    PortalConfig,
    SupplierPortal,
    Warehouse,
    WarehouseConfig,
    config_from_env,
    reset_all,
    systems,
)
from project.purchasing.far.config import DEFAULT_FAR_DIR

LINES = [{"sku": "BOLT-M8", "quantity": 100, "unit_price": 12}]
PARCELS = [{"weight_kg": 2.5}]


def wait_until_elapsed(start: float, seconds: float) -> None:
    remaining = start + seconds - time.time()
    if remaining > 0:
        time.sleep(remaining)


# -- supplier portal ---------------------------------------------------------------------


def test_portal_search_misses_fresh_order_but_get_by_key_sees_it(tmp_path: Path) -> None:
    # A huge maximum lag makes "visible within milliseconds" practically impossible; the seed
    # makes the drawn lag reproducible.
    portal = SupplierPortal(PortalConfig(search_lag_max=1000.0, seed=3), tmp_path)
    order = portal.submit_order(key="run-1:order", reference="REQ-1", lines=LINES)

    assert order["key"] == "run-1:order"
    assert order["reference"] == "REQ-1"
    assert order["lines"] == LINES
    assert portal.search("REQ-1") == []
    assert portal.get_by_key("run-1:order") == order
    assert portal.get_by_key("other") is None
    assert portal.effects()[0]["lag"] > 0


def test_portal_search_sees_order_at_once_without_lag(tmp_path: Path) -> None:
    portal = SupplierPortal(PortalConfig(search_lag_max=0.0), tmp_path)
    order = portal.submit_order(key="k", reference="REQ-2", lines=LINES)

    assert portal.search("REQ-2") == [order]
    assert portal.search("REQ-unknown") == []


def test_portal_search_sees_order_after_its_lag(tmp_path: Path) -> None:
    portal = SupplierPortal(PortalConfig(search_lag_max=0.2, seed=11), tmp_path)
    started = time.time()
    order = portal.submit_order(key="k", reference="REQ-3", lines=LINES)
    lag = portal.effects()[0]["lag"]
    assert 0.0 <= lag <= 0.2

    wait_until_elapsed(started, 0.25)
    assert portal.search("REQ-3") == [order]


def test_portal_creates_a_new_order_on_every_submit(tmp_path: Path) -> None:
    portal = SupplierPortal(PortalConfig(search_lag_max=0.0), tmp_path)
    first = portal.submit_order(key="k", reference="REQ-4", lines=LINES)
    second = portal.submit_order(key="k", reference="REQ-4", lines=LINES)
    portal.submit_order(key="single", reference="REQ-5", lines=LINES)

    assert first["order_id"] != second["order_id"]
    assert portal.count() == 3
    assert portal.duplicates() == {"k": 2}
    assert portal.counts_by_key() == {"k": 2, "single": 1}
    assert [e["id"] for e in portal.effects(key="k")] == [1, 2]
    assert portal.get_by_key("k") == first
    assert portal.search("REQ-4") == [first, second]


# -- credit vendor -----------------------------------------------------------------------


def test_credit_lookup_lags(tmp_path: Path) -> None:
    credit = CreditVendor(CreditConfig(lookup_lag=0.2), tmp_path)
    started = time.time()
    result = credit.check(request_id="req-1", buyer="ACME", amount=5_000)

    assert result["approved"] is True
    assert credit.lookup("req-1") is None
    assert credit.count() == 1

    wait_until_elapsed(started, 0.25)
    assert credit.lookup("req-1") == result


def test_credit_decision_is_deterministic_per_buyer(tmp_path: Path) -> None:
    credit = CreditVendor(CreditConfig(lookup_lag=0.0), tmp_path)

    assert credit.check(request_id="a", buyer="ACME", amount=1_000_000)["approved"] is True
    assert credit.check(request_id="b", buyer="ACME", amount=1_000_001)["approved"] is False
    denied = credit.check(request_id="c", buyer="Overdrawn Ltd", amount=1)
    assert denied["approved"] is False
    assert denied["limit"] == 0
    assert credit.lookup("c") == denied


def test_credit_records_every_check(tmp_path: Path) -> None:
    credit = CreditVendor(CreditConfig(lookup_lag=0.0), tmp_path)
    first = credit.check(request_id="req", buyer="ACME", amount=10)
    credit.check(request_id="req", buyer="ACME", amount=10)

    assert credit.duplicates() == {"req": 2}
    assert credit.lookup("req") == first


# -- payment provider --------------------------------------------------------------------


def test_payment_repeat_with_same_key_returns_first_charge(tmp_path: Path) -> None:
    payments = PaymentProvider(PaymentConfig(), tmp_path)
    first = payments.charge(amount=4_200, currency="EUR", idempotency_key="run-1:charge")
    again = payments.charge(amount=4_200, currency="EUR", idempotency_key="run-1:charge")
    other = payments.charge(amount=4_200, currency="EUR", idempotency_key="run-2:charge")

    assert again == first
    assert other["charge_id"] != first["charge_id"]
    assert payments.count() == 2
    assert payments.counts_by_key() == {"run-1:charge": 1, "run-2:charge": 1}
    assert payments.duplicates() == {}
    assert payments.lookup("run-1:charge") == first
    assert payments.lookup("missing") is None


def _charge_repeatedly(
    payments: PaymentProvider,
    barrier: Any,
    results: Any,
    times: int,
) -> None:
    barrier.wait()
    ids = [
        payments.charge(amount=100, currency="EUR", idempotency_key="shared")["charge_id"]
        for _ in range(times)
    ]
    results.put(ids)


def test_payment_idempotency_holds_across_processes(tmp_path: Path) -> None:
    # fork: the children inherit the instance built here, which is also how a pre-forking
    # server would use it; the barrier makes the four start their races together.
    ctx = multiprocessing.get_context("fork")
    payments = PaymentProvider(PaymentConfig(), tmp_path)
    workers, times = 4, 20
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    processes = [
        ctx.Process(target=_charge_repeatedly, args=(payments, barrier, results, times))
        for _ in range(workers)
    ]
    for process in processes:
        process.start()
    charge_ids = [results.get(timeout=20) for _ in processes]
    for process in processes:
        process.join(timeout=20)
        assert process.exitcode == 0

    assert payments.count() == 1
    assert payments.duplicates() == {}
    assert {charge_id for ids in charge_ids for charge_id in ids} == {"ch_1"}
    assert sum(len(ids) for ids in charge_ids) == workers * times


# -- carrier -----------------------------------------------------------------------------


def test_carrier_books_a_new_shipment_on_every_call(tmp_path: Path) -> None:
    carrier = Carrier(CarrierConfig(), tmp_path)
    first = carrier.book(key="run-1:ship", address="1 Dock Road", parcels=PARCELS)
    second = carrier.book(key="run-1:ship", address="1 Dock Road", parcels=PARCELS)

    assert first["shipment_id"] != second["shipment_id"]
    assert carrier.duplicates() == {"run-1:ship": 2}
    assert carrier.lookup("run-1:ship") == first
    assert carrier.lookup("missing") is None


# -- email -------------------------------------------------------------------------------


def test_email_counts_every_send_and_has_no_lookup(tmp_path: Path) -> None:
    email = EmailSender(EmailConfig(), tmp_path)
    email.send(to="buyer@example.com", subject="Order placed", body="PO-1")
    email.send(to="buyer@example.com", subject="Order placed", body="PO-1")

    assert email.count() == 2
    assert [e["key"] for e in email.effects()] == [None, None]
    assert email.effects()[0]["payload"]["subject"] == "Order placed"
    assert email.counts_by_key() == {}
    assert email.duplicates() == {}
    assert not hasattr(email, "lookup")


# -- fault injection ---------------------------------------------------------------------

MutatingCall = Callable[[Path, dict[str, Any]], Callable[[], object]]

CALLS: dict[str, MutatingCall] = {
    "portal": lambda d, f: lambda: SupplierPortal(PortalConfig(**f), d).submit_order(
        key="k", reference="R", lines=LINES
    ),
    "credit": lambda d, f: lambda: CreditVendor(CreditConfig(**f), d).check(
        request_id="k", buyer="ACME", amount=1
    ),
    "payments": lambda d, f: lambda: PaymentProvider(PaymentConfig(**f), d).charge(
        amount=1, currency="EUR", idempotency_key="k"
    ),
    "carrier": lambda d, f: lambda: Carrier(CarrierConfig(**f), d).book(
        key="k", address="A", parcels=PARCELS
    ),
    "email": lambda d, f: lambda: EmailSender(EmailConfig(**f), d).send(
        to="a@example.com", subject="S", body="B"
    ),
}


def _ledger(name: str, directory: Path) -> FarSystem[Any]:
    return getattr(systems(directory=directory), name)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_rejected_call_records_nothing(name: str, tmp_path: Path) -> None:
    call = CALLS[name](tmp_path, {"reject_rate": 1.0, "lost_reply_rate": 1.0})
    with pytest.raises(FarRejected):
        call()
    assert _ledger(name, tmp_path).count() == 0


@pytest.mark.parametrize("name", sorted(CALLS))
def test_lost_reply_still_records_the_effect(name: str, tmp_path: Path) -> None:
    call = CALLS[name](tmp_path, {"lost_reply_rate": 1.0})
    with pytest.raises(FarTimeout):
        call()
    assert _ledger(name, tmp_path).count() == 1


def test_retry_after_lost_reply_gets_the_same_charge(tmp_path: Path) -> None:
    lossy = PaymentProvider(PaymentConfig(lost_reply_rate=1.0), tmp_path)
    with pytest.raises(FarTimeout):
        lossy.charge(amount=900, currency="EUR", idempotency_key="k")

    reliable = PaymentProvider(PaymentConfig(), tmp_path)
    assert reliable.charge(amount=900, currency="EUR", idempotency_key="k")["charge_id"] == "ch_1"
    assert reliable.count() == 1


def test_fault_errors_share_a_base_class() -> None:
    assert issubclass(FarRejected, FarSystemError)
    assert issubclass(FarTimeout, FarSystemError)
    assert not issubclass(FarRejected, FarTimeout)


def _outcomes(carrier: Carrier, calls: int) -> list[bool]:
    outcomes = []
    for i in range(calls):
        try:
            carrier.book(key=f"k{i}", address="A", parcels=PARCELS)
            outcomes.append(True)
        except FarRejected:
            outcomes.append(False)
    return outcomes


def test_seed_makes_faults_reproducible_in_each_fresh_process(tmp_path: Path) -> None:
    config = CarrierConfig(reject_rate=0.5, seed=42)
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    processes = [ctx.Process(target=_report_outcomes, args=(Carrier(config, tmp_path / name), results))
                 for name in ("a", "b")]
    for process in processes:
        process.start()
    first, second = (results.get(timeout=20) for _ in processes)
    for process in processes:
        process.join(timeout=20)

    assert first == second
    assert 0 < sum(first) < 40
    assert Carrier(config, tmp_path / "a").count() == sum(first)


def _report_outcomes(carrier: Carrier, results: Any) -> None:
    results.put(_outcomes(carrier, 40))


def test_unseeded_faults_differ_between_forked_processes(tmp_path: Path) -> None:
    # Without reseeding after fork both children would replay the parent's random stream.
    ctx = multiprocessing.get_context("fork")
    carrier = Carrier(CarrierConfig(reject_rate=0.5), tmp_path)
    results = ctx.Queue()
    processes = [ctx.Process(target=_report_outcomes, args=(carrier, results)) for _ in range(2)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=20) for _ in processes]
    for process in processes:
        process.join(timeout=20)
        assert process.exitcode == 0

    assert outcomes[0] != outcomes[1]


# -- reset, systems(), configuration -----------------------------------------------------


def test_reset_empties_one_ledger(tmp_path: Path) -> None:
    carrier = Carrier(CarrierConfig(), tmp_path)
    carrier.book(key="k", address="A", parcels=PARCELS)
    carrier.reset()

    assert carrier.count() == 0
    assert carrier.lookup("k") is None
    # Ids are not reused after a reset, so stale ids cannot alias new shipments.
    assert carrier.book(key="k", address="A", parcels=PARCELS)["shipment_id"] == "sh_2"


def test_systems_use_far_dir_and_reset_all_empties_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAR_DIR", str(tmp_path / "ledgers"))
    monkeypatch.setenv("FAR_PORTAL_SEARCH_LAG", "0")
    # Pin the fault knobs too, so FAR_SYSTEMS in project settings cannot leak into the test.
    for name in ("FAR_LATENCY", "FAR_REJECT_RATE", "FAR_LOST_REPLY_RATE"):
        monkeypatch.setenv(name, "0")
    far = systems()
    far.portal.submit_order(key="k", reference="R", lines=LINES)
    far.credit.check(request_id="k", buyer="ACME", amount=1)
    far.payments.charge(amount=1, currency="EUR", idempotency_key="k")
    far.carrier.book(key="k", address="A", parcels=PARCELS)
    far.email.send(to="a@example.com", subject="S", body="B")
    far.warehouse.reserve(2, key="k")

    assert far.portal.config.search_lag_max == 0.0
    assert sorted(p.name for p in (tmp_path / "ledgers").glob("*.sqlite3")) == [
        "carrier.sqlite3",
        "credit.sqlite3",
        "email.sqlite3",
        "payments.sqlite3",
        "portal.sqlite3",
        "warehouse.sqlite3",
    ]
    assert [system.count() for system in far] == [1, 1, 1, 1, 1, 1]

    reset_all()
    assert [system.count() for system in systems()] == [0, 0, 0, 0, 0, 0]


def test_the_warehouse_honours_both_keys_and_counts_what_is_held(tmp_path: Path) -> None:
    warehouse = Warehouse(WarehouseConfig(), tmp_path)
    first = warehouse.reserve(3, key="run:reserve_stock")
    assert warehouse.reserve(5, key="run:reserve_stock") == first  # a repeat reserves nothing more
    other = warehouse.reserve(1, key="other:reserve_stock")
    assert warehouse.find_reservation("run:reserve_stock") == first
    assert [r["reservation_id"] for r in warehouse.held()] == [first["reservation_id"], other["reservation_id"]]
    released = warehouse.release(first["reservation_id"], key="run:reserve_stock:release")
    assert warehouse.release(first["reservation_id"], key="run:reserve_stock:release") == released
    assert warehouse.find_release("run:reserve_stock:release") == released
    assert warehouse.find_release("run:reserve_stock") is None and warehouse.find_reservation("nope") is None
    assert [r["reservation_id"] for r in warehouse.held()] == [other["reservation_id"]]
    assert warehouse.duplicates() == {} and len(warehouse.releases()) == 1
    with pytest.raises(ValueError, match="no reservation"):
        warehouse.release("rs_999", key="x:release")


def test_config_defaults() -> None:
    config = config_from_env(environ={}, settings={})

    assert config.directory == DEFAULT_FAR_DIR
    assert config.portal.search_lag_max == 5.0
    assert config.credit.lookup_lag == 60.0
    for section in (config.portal, config.credit, config.payments, config.carrier, config.email):
        assert (section.latency, section.reject_rate, section.lost_reply_rate) == (0.0, 0.0, 0.0)
        assert section.seed is None


def test_config_env_overrides_settings_which_override_defaults() -> None:
    config = config_from_env(
        environ={"FAR_REJECT_RATE": "0.5", "FAR_SEED": "7", "FAR_DIR": "/tmp/far-env"},
        settings={"portal_search_lag": 0.2, "reject_rate": 0.1, "latency": 0.01},
    )

    assert config.portal.search_lag_max == 0.2
    assert config.credit.lookup_lag == 60.0
    assert config.payments.reject_rate == 0.5
    assert config.email.latency == 0.01
    assert config.carrier.seed == 7
    assert config.directory == Path("/tmp/far-env")


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="FAR_LATENCY"):
        config_from_env(environ={"FAR_LATENCY": "fast"}, settings={})
    with pytest.raises(ValueError, match="reject_rate"):
        config_from_env(environ={"FAR_REJECT_RATE": "1.5"}, settings={})
    with pytest.raises(ValueError, match="unknown"):
        config_from_env(environ={}, settings={"portal_lag": 1})


def test_a_seeded_system_draws_a_sequence_not_the_same_number_each_time(tmp_path: Path) -> None:
    """Building the systems for every call (as the workflows do) must not restart the seeded sequence."""
    config = PaymentConfig(lost_reply_rate=0.5, seed=1)
    lost = 0
    for n in range(40):
        try:
            PaymentProvider(config, tmp_path).charge(amount=100, currency="EUR", idempotency_key=f"k{n}")
        except FarTimeout:
            lost += 1
    assert 5 < lost < 35
