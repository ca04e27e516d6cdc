"""Translate durableruns' errors into API responses in one place.

Views never catch the core's errors: they propagate here, become an `APIException` with a status and a code,
and DRF's default handler renders them. The body is `{"detail": ..., "code": ...}` plus the facts the error
carries (run_id, decided_by, decided_at, ...), so a client can act without parsing the message.

Errors that mean a bug or a broken deploy (FencedOut, EffectInTransaction, DeclarationError) are not translated:
they are server errors and should look like it.
"""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from durableruns import errors


class DurableRunsAPIError(APIException):
    """An error of the durableruns tree, as the API answers it."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid"
    default_detail = "The request was refused."

    def __init__(self, error: errors.DurableRunsError) -> None:
        super().__init__(detail=str(error), code=self.default_code)
        self.facts: dict[str, Any] = dict(error.facts)


class UnknownWorkflowError(DurableRunsAPIError):
    default_code = "unknown_workflow"


class InvalidInputError(DurableRunsAPIError):
    default_code = "invalid_input"


class DuplicateRunError(DurableRunsAPIError):
    status_code = status.HTTP_409_CONFLICT
    default_code = "duplicate_run"


class RunNotFoundError(DurableRunsAPIError):
    status_code = status.HTTP_404_NOT_FOUND
    default_code = "run_not_found"


class BulkNotFoundError(DurableRunsAPIError):
    status_code = status.HTTP_404_NOT_FOUND
    default_code = "bulk_not_found"


class ResultNotJSONError(DurableRunsAPIError):
    default_code = "result_not_json"


class EscalationNotFoundError(DurableRunsAPIError):
    status_code = status.HTTP_404_NOT_FOUND
    default_code = "escalation_not_found"


class ApprovalNotFoundError(EscalationNotFoundError):
    default_code = "approval_not_found"


class AlreadyDecidedError(DurableRunsAPIError):
    status_code = status.HTTP_409_CONFLICT
    default_code = "already_decided"


class InvalidDecisionError(DurableRunsAPIError):
    default_code = "invalid_decision"


class RunNotActionableError(DurableRunsAPIError):
    status_code = status.HTTP_409_CONFLICT
    default_code = "run_not_actionable"


class PlanMismatchError(DurableRunsAPIError):
    status_code = status.HTTP_409_CONFLICT
    default_code = "plan_mismatch"


class InboxItemNotFoundError(DurableRunsAPIError):
    status_code = status.HTTP_404_NOT_FOUND
    default_code = "inbox_item_not_found"


class UnsupportedError(DurableRunsAPIError):
    default_code = "unsupported"


class ItemTakenError(DurableRunsAPIError):
    status_code = status.HTTP_409_CONFLICT
    default_code = "taken"


class NotAssignedError(DurableRunsAPIError):
    status_code = status.HTTP_403_FORBIDDEN
    default_code = "not_assigned"


TRANSLATIONS: dict[type[errors.DurableRunsError], type[DurableRunsAPIError]] = {
    errors.UnknownWorkflow: UnknownWorkflowError,
    errors.InvalidInput: InvalidInputError,
    errors.BulkNotFound: BulkNotFoundError,
    errors.DuplicateRun: DuplicateRunError,
    errors.RunNotFound: RunNotFoundError,
    errors.ResultNotJSON: ResultNotJSONError,
    errors.EscalationNotFound: EscalationNotFoundError,
    errors.ApprovalNotFound: ApprovalNotFoundError,
    errors.AlreadyDecided: AlreadyDecidedError,
    errors.InvalidDecision: InvalidDecisionError,
    errors.RunNotActionable: RunNotActionableError,
    errors.PlanMismatch: PlanMismatchError,
    errors.InboxItemNotFound: InboxItemNotFoundError,
    errors.ItemTaken: ItemTakenError,
    errors.NotAssigned: NotAssignedError,
    errors.Unsupported: UnsupportedError,
}


def translate(exc: errors.DurableRunsError) -> DurableRunsAPIError | None:
    """Return the API error for `exc` (nearest class in its MRO), or None if it is not the client's fault."""
    for cls in type(exc).__mro__:
        api_error = TRANSLATIONS.get(cls)
        if api_error is not None:
            return api_error(exc)
    return None


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: translate durableruns' errors, then let DRF render every APIException."""
    if isinstance(exc, errors.DurableRunsError):
        translated = translate(exc)
        if translated is None:
            return None  # DRF re-raises: a 500, as a bug should be
        exc = translated
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, DurableRunsAPIError):
        response.data = {**exc.facts, "detail": str(exc.detail), "code": exc.default_code}
    return response
