"""Run attributes: the names and values a run is found by (an order number, a buyer), pure rules, no Django.

A workflow declares `attributes={name: input_key | function of the input}`, asked once at start and recorded
with the run; a step adds or replaces some with `ctx.set_attributes(**values)`, recorded with its result. A
value is a string of at most VALUE_LIMIT characters or an integer (not a bool); a name is a Python identifier
of at most NAME_LIMIT characters. The record keeps each value as text, with its kind, so a search matches an
exact text and an integer matches its decimal text (durableruns.store.attributes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from durableruns.errors import DeclarationError, InvalidInput

NAME_LIMIT = 50
VALUE_LIMIT = 200
TEXT, INTEGER = "s", "i"  # the kind recorded beside each value's text

Source = str | Callable[[dict[str, Any]], Any]


def valid_name(name: object) -> bool:
    """Whether `name` may name an attribute: an identifier of at most NAME_LIMIT characters."""
    return isinstance(name, str) and name.isidentifier() and len(name) <= NAME_LIMIT


def declare(workflow: str, attributes: Mapping[str, Source] | None) -> dict[str, Source]:
    """Check a workflow's declared attributes at import; return them as a plain dict (empty without any).
    A bad name, or a source neither an input key (str) nor a function of the input, is DeclarationError."""
    if attributes is None:
        return {}
    if not isinstance(attributes, Mapping):
        raise DeclarationError(
            f"workflow {workflow!r}: attributes must be a dict of name -> input key or function, "
            f"not {type(attributes).__name__}",
            workflow=workflow,
        )
    for name, source in attributes.items():
        if not valid_name(name):
            raise DeclarationError(
                f"workflow {workflow!r}: attribute name {name!r} must be an identifier of at most "
                f"{NAME_LIMIT} characters",
                workflow=workflow,
            )
        if not (isinstance(source, str) or callable(source)):
            raise DeclarationError(
                f"workflow {workflow!r}: attribute {name!r} must be an input key (a string) or a "
                f"function of the input, not {source!r}",
                workflow=workflow,
            )
    return dict(attributes)


def checked(values: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """`values` as they will be recorded; a bad name or value is InvalidInput naming the attribute."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if not valid_name(name):
            raise InvalidInput(
                f"{where}: attribute name {name!r} must be an identifier of at most {NAME_LIMIT} characters",
                attribute=str(name)[:NAME_LIMIT],
            )
        out[name] = checked_value(name, value, where=where)
    return out


def checked_value(name: str, value: Any, *, where: str) -> str | int:
    """The value of attribute `name` if it may be recorded, else InvalidInput naming it."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidInput(
            f"{where}: attribute {name!r} must be a string or an integer, not {type(value).__name__}", attribute=name
        )
    if isinstance(value, str):
        if len(value) > VALUE_LIMIT:
            raise InvalidInput(
                f"{where}: attribute {name!r} is {len(value)} characters long, at most {VALUE_LIMIT} are recorded",
                attribute=name,
            )
        if not _storable(value):
            raise InvalidInput(
                f"{where}: attribute {name!r} holds a NUL character or a lone surrogate, which cannot be stored",
                attribute=name,
            )
    elif value.bit_length() > 700 or len(str(value)) > VALUE_LIMIT:  # str() of a huge int would raise
        raise InvalidInput(
            f"{where}: attribute {name!r} is an integer of more than {VALUE_LIMIT} digits", attribute=name
        )
    return str(value) if isinstance(value, str) else int(value)


def asked(workflow: str, declared: Mapping[str, Source], input: dict[str, Any]) -> dict[str, Any]:
    """Ask each declared attribute of the run's input, once, at start; InvalidInput names the one that fails
    (a missing key, a function that raises, a value of the wrong type or too long)."""
    values: dict[str, Any] = {}
    where = f"workflow {workflow}"
    for name, source in declared.items():
        if isinstance(source, str):
            if source not in input:
                raise InvalidInput(
                    f"{where}: attribute {name!r} reads the input's {source!r}, which it lacks", attribute=name
                )
            value = input[source]
        else:
            try:
                value = source(input)
            except Exception as exc:  # users' code, asked of an input it may not fit: the start is refused
                raise InvalidInput(
                    f"{where}: attribute {name!r} cannot be read from this input ({type(exc).__name__}: {exc})",
                    attribute=name,
                ) from exc
        values[name] = checked_value(name, value, where=where)
    return values


def as_record(value: str | int) -> tuple[str, str]:
    """(text, kind) as the record keeps a value: an integer as its decimal text."""
    return (str(value), INTEGER) if isinstance(value, int) else (value, TEXT)


def from_record(text: str, kind: str) -> str | int:
    """A recorded value back as it was given."""
    return int(text) if kind == INTEGER else text


def parse_filter(text: str) -> tuple[str, str]:
    """One `?attr=name:value` of the API: (name, value text); a missing colon or a bad name is InvalidInput."""
    name, colon, value = text.partition(":")
    if not colon:
        raise InvalidInput(f"attr must be name:value, not {text[:80]!r}")
    if not valid_name(name):
        raise InvalidInput(
            f"attr {text[:80]!r}: {name[:60]!r} is not an attribute name (an identifier of at most "
            f"{NAME_LIMIT} characters)"
        )
    if len(value) > VALUE_LIMIT or not _storable(value):
        raise InvalidInput(f"attr {text[:80]!r}: the value must be at most {VALUE_LIMIT} storable characters")
    return name, value


def _storable(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
