"""The two clients cannot drift: every public method is one definition in rollouts_client.calls,
shown on RolloutClient and AsyncRolloutClient with the same parameters and docstring."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from rollouts_client import AsyncRolloutClient, RolloutClient, calls
from rollouts_client.steps import Defined

DEFINED = {name: value for name, value in vars(calls.ApiMethods).items() if isinstance(value, Defined)}
# The clients' own lifecycle, different by nature (close is a coroutine on the async one).
OWN = {"close"}


def public(cls: type) -> set[str]:
    return {name for name, value in inspect.getmembers(cls, callable) if not name.startswith("_")} - OWN


def without_return(method: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(method).replace(return_annotation=inspect.Signature.empty)


def test_both_clients_have_the_same_public_methods_and_each_is_defined_once() -> None:
    assert public(RolloutClient) == public(AsyncRolloutClient) == set(DEFINED)
    assert inspect.iscoroutinefunction(AsyncRolloutClient.close) and RolloutClient.close.__doc__


@pytest.mark.parametrize("name", sorted(DEFINED))
def test_a_method_shows_its_one_definition_on_both_clients(name: str) -> None:
    defined = DEFINED[name]
    sync, aio = getattr(RolloutClient, name), getattr(AsyncRolloutClient, name)
    assert defined.__doc__ and sync.__doc__ == aio.__doc__ == defined.define.__doc__, "one docstring, on both"
    assert without_return(sync) == without_return(aio)
    parameters = list(inspect.signature(defined.define).parameters)
    assert list(inspect.signature(sync).parameters) == ["self", *parameters[1:]]
    if defined.iterates:
        assert inspect.signature(sync).return_annotation == f"Iterator[{defined.returns}]"
        assert inspect.signature(aio).return_annotation == f"AsyncIterator[{defined.returns}]"
    else:
        assert inspect.signature(sync).return_annotation == inspect.signature(aio).return_annotation
        assert inspect.iscoroutinefunction(aio) and not inspect.iscoroutinefunction(sync)
    assert sync.__qualname__ == f"RolloutClient.{name}" and aio.__qualname__ == f"AsyncRolloutClient.{name}"


def test_a_subclass_keeps_its_overrides() -> None:
    class Mine(RolloutClient):
        def get_job(self, job_id: str) -> Any:
            return job_id

    assert Mine.get_job is not RolloutClient.get_job and Mine.list_jobs is RolloutClient.list_jobs


def test_a_call_must_say_what_it_returns() -> None:
    def untyped(client: Any) -> Any:
        yield from ()

    with pytest.raises(TypeError, match="untyped must be annotated '-> Call"):
        calls.call(untyped)
