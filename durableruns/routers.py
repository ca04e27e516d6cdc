"""The database router for DURABLERUNS_DATABASE: durableruns' models read, write and migrate on that alias only.

A site that keeps its runs in a database of their own adds it to its routers:

    DURABLERUNS_DATABASE = "runs"
    DATABASE_ROUTERS = ["durableruns.routers.DurableRunsRouter"]

The engine itself names the alias on every raw statement, transaction and LISTEN (durableruns.conf.database());
the router is what sends Django's own queries there: the ORM's, the admin's and the API's. It has no opinion on
any other app's models, so the site's other routers (or Django's default) decide those.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, models, router

from durableruns import conf

APP_LABEL = "durableruns"


def _ours(model: type[models.Model] | models.Model) -> bool:
    return bool(model._meta.app_label == APP_LABEL)


class DurableRunsRouter:
    """Route durableruns' models to DURABLERUNS_DATABASE; migrate the app there and nowhere else."""

    def db_for_read(self, model: type[models.Model], **hints: Any) -> str | None:
        if _ours(model):
            return conf.database()
        instance = hints.get("instance")
        if instance is not None and _ours(instance) and conf.database() != DEFAULT_DB_ALIAS:
            # Another app's record reached from one of ours (an intervention's user): where the site's routers
            # keep that model, not the runs' database that Django would otherwise take from the instance.
            return router.db_for_read(model)
        return None

    def db_for_write(self, model: type[models.Model], **hints: Any) -> str | None:
        return conf.database() if _ours(model) else None

    def allow_relation(self, obj1: models.Model, obj2: models.Model, **hints: Any) -> bool | None:
        """Relations within the alias only: between durableruns' own records, or with another app's record that
        lives in the same database (the user who decided, where runs share the site's database); never one
        that would cross two databases."""
        if not (_ours(obj1) or _ours(obj2)):
            return None
        return all(_ours(obj) or obj._state.db == conf.database() for obj in (obj1, obj2))

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool | None:
        """durableruns' tables on its alias only; no opinion on other apps'."""
        if app_label != APP_LABEL:
            return None
        return db == conf.database()
