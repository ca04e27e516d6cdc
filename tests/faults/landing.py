"""A far call that lands late: `python -m tests.faults.landing KEY LATEST [GATE]` books a parcel at the carrier
under KEY once the file GATE exists, or LATEST seconds after it started at the latest, whichever comes first.

Started detached (a session of its own) by a step, it is the far system committing a call its caller made: the
caller's SIGKILL does not stop it, as a dead worker does not recall a request already on the wire. Nothing of
durableruns or Django is imported: the far system is another program.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from project.purchasing.far import systems


def main(key: str, latest: float, gate: str = "") -> None:
    deadline = time.monotonic() + latest
    while time.monotonic() < deadline and not (gate and Path(gate).exists()):
        time.sleep(0.02)
    systems().carrier.book(key=key, address="1 Late Lane", parcels=[{"kg": 1}])


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), *sys.argv[3:4])
