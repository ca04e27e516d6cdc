"""The resume path the design source starts from, kept to show why it creates duplicate orders.

Before submitting an order it asks the supplier portal's search "does PO-2026-0041 exist?" and submits if the
answer is empty. The search is served by a read replica that lags writes by up to FAR_PORTAL_SEARCH_LAG seconds
(5 by default), so right after a crash that happened once the portal had accepted the order, the answer is
usually empty and the order is placed a second time. durableruns' place_order step instead records its key
before acting and, when in doubt, looks the order up by that key: a read the portal answers from its primary.

    python -m project.purchasing.naive place PO-2026-0046    submit the order, then die (SIGKILL) at once,
                                                              before anything is written down
    python -m project.purchasing.naive resume PO-2026-0046   search by reference; submit again if not found

Both use the far systems of FAR_DIR; the naive worker has no key of its own, so it submits under the reference.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from project.purchasing import pricing
from project.purchasing.far import SupplierPortal, config_from_env
from project.purchasing.far.ledger import StrPath


def portal(directory: StrPath | None = None) -> SupplierPortal:
    config = config_from_env()
    return SupplierPortal(config.portal, directory if directory is not None else config.directory)


def order_lines(reference: str) -> list[dict[str, Any]]:
    return pricing.parse({"reference": reference, "buyer": "Harbour Foods", "line_count": 10})["lines"]


def place(supplier: SupplierPortal, reference: str) -> dict[str, Any]:
    """The naive step: submit the order, under nothing but its reference."""
    return supplier.submit_order(key=reference, reference=reference, lines=order_lines(reference))


def resume(supplier: SupplierPortal, reference: str) -> tuple[dict[str, Any], bool]:
    """The naive resume: search for the reference; submit again if the search finds nothing.

    Returns the order and whether it submitted a new one. An empty search means "absent, or not replicated
    yet", and this function cannot tell which.
    """
    found = supplier.search(reference)
    if found:
        return found[0], False
    return place(supplier, reference), True


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("place", "resume"):
        print(__doc__, file=sys.stderr)
        return 2
    command, reference = argv
    supplier = portal()
    if command == "place":
        place(supplier, reference)
        os.kill(os.getpid(), signal.SIGKILL)  # the crash: the portal accepted; nothing was written down here
    order, submitted = resume(supplier, reference)
    if submitted:
        print(f"{reference}: the search found nothing, so it submitted again ({order['order_id']})")
    else:
        print(f"{reference}: the search found {order['order_id']} (the replica had caught up), so it did not submit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
