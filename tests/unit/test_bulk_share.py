"""DURABLERUNS_BULK_SHARE: how long a --loop worker's bulk thread rests between batches, and the setting's check."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from durableruns import checks, conf


@pytest.mark.parametrize(
    ("busy", "share", "rest"),
    [(0.4, 0.5, 0.4), (0.4, 1.0, 0.0), (0.3, 0.25, 0.9), (0.0, 0.5, 0.0), (-1.0, 0.5, 0.0)],
)
def test_the_rest_after_a_batch_keeps_the_thread_to_its_share(busy, share, rest):
    assert conf.rest_after(busy, share) == pytest.approx(rest)
    if busy > 0:
        assert busy / (busy + conf.rest_after(busy, share)) == pytest.approx(share)


def test_the_default_share_is_a_half(settings):
    assert conf.bulk_share() == 0.5
    settings.DURABLERUNS_BULK_SHARE = 1
    assert conf.bulk_share() == 1.0


@pytest.mark.parametrize("value", [0, -0.5, 1.5, "half", True, None])
def test_a_share_that_is_not_one_is_refused_and_named_by_its_check(settings, value):
    settings.DURABLERUNS_BULK_SHARE = value
    with pytest.raises(ImproperlyConfigured, match="DURABLERUNS_BULK_SHARE"):
        conf.bulk_share()
    errors = checks.check_bulk_share()
    assert [e.id for e in errors] == ["durableruns.E033"]
