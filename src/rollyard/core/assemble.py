"""Models built from values that are valid already, for the gateway's per-request records."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

_set = object.__setattr__


def assemble(cls: type[M], values: dict[str, Any], fields_set: set[str] | None = None) -> M:
    """``cls`` holding ``values`` as given (every field, nothing else), not validated;
    ``fields_set``: the fields counted as set by the caller (default: all of them).

    What ``model_construct`` makes, without its per-field Python loop (aliases, defaults): the
    gateway builds a turn and its events on the event loop for every model call, from data
    already validated where it came in. Validators do not run; a caller that needs a model's
    invariants checks them itself. Naming every field, no more, is still enforced, so a field
    added to the model later cannot be silently left out here."""
    if values.keys() != cls.__pydantic_fields__.keys():
        raise TypeError(f"{cls.__name__} needs exactly the fields {list(cls.__pydantic_fields__)}")
    if cls.__pydantic_post_init__ or cls.__private_attributes__:
        raise TypeError(f"{cls.__name__} has a post-init hook or private attributes: construct it")
    m = cls.__new__(cls)
    _set(m, "__dict__", values)
    _set(m, "__pydantic_fields_set__", set(values) if fields_set is None else fields_set)
    _set(m, "__pydantic_extra__", None)
    _set(m, "__pydantic_private__", None)
    return m
