"""The two clients cannot drift: RolloutClient and AsyncRolloutClient write out the same public methods,
with the same parameters, defaults and docstrings, each over the call of its name in rollouts_client.calls;
and every exception the client distribution defines has one root."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import rollouts_client
from rollouts_client import AsyncRolloutClient, RolloutClient, RolloutsClientError, calls

# The clients' own lifecycle, different by nature (close is a coroutine on the async one).
OWN = {"close"}
ITERATING = {"iter_jobs", "watch_jobs", "iter_groups", "iter_events"}


def public(cls: type) -> set[str]:
    return {name for name, value in inspect.getmembers(cls, callable) if not name.startswith("_")} - OWN


def without_return(method: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(method).replace(return_annotation=inspect.Signature.empty)


METHODS = sorted(public(RolloutClient))


def test_both_clients_have_the_same_public_methods_each_over_its_call() -> None:
    assert public(RolloutClient) == public(AsyncRolloutClient)
    assert all(inspect.isgeneratorfunction(getattr(calls, name)) for name in METHODS), "one definition each"
    assert inspect.iscoroutinefunction(AsyncRolloutClient.close) and RolloutClient.close.__doc__


@pytest.mark.parametrize("name", METHODS)
def test_a_method_has_the_same_signature_and_docstring_on_both_clients(name: str) -> None:
    sync, aio = getattr(RolloutClient, name), getattr(AsyncRolloutClient, name)
    assert sync.__doc__ and inspect.getdoc(sync) == inspect.getdoc(aio), "one docstring, on both"
    assert without_return(sync) == without_return(aio)
    called = list(inspect.signature(getattr(calls, name)).parameters)
    assert list(inspect.signature(sync).parameters) == ["self", *called[1:]], "the call's parameters"
    returns = inspect.signature(sync).return_annotation
    if name in ITERATING:
        assert returns.startswith("Iterator[")
        assert inspect.signature(aio).return_annotation == f"Async{returns}"
        assert not inspect.iscoroutinefunction(aio)
    else:
        assert inspect.signature(aio).return_annotation == returns
        assert inspect.iscoroutinefunction(aio) and not inspect.iscoroutinefunction(sync)
    assert sync.__qualname__ == f"RolloutClient.{name}" and aio.__qualname__ == f"AsyncRolloutClient.{name}"


def test_a_subclass_keeps_its_overrides() -> None:
    class Mine(RolloutClient):
        def get_job(self, job_id: str) -> Any:
            return job_id

    assert Mine.get_job is not RolloutClient.get_job and Mine.list_jobs is RolloutClient.list_jobs


def client_modules() -> Iterator[Any]:
    """Every module of the distribution that imports here (a trainer bridge needs its trainer installed)."""
    yield rollouts_client
    for info in pkgutil.walk_packages(rollouts_client.__path__, "rollouts_client."):
        try:
            yield importlib.import_module(info.name)
        except ImportError:
            continue


def test_every_client_exception_derives_from_the_one_root() -> None:
    defined = {
        value
        for module in client_modules()
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.__name__
    }
    assert {"ApiError", "WaitTimeout", "BatchExhausted", "JobFailed", "RowError"} <= {e.__name__ for e in defined}
    assert [e.__name__ for e in defined if not issubclass(e, RolloutsClientError)] == []
    errors = rollouts_client.errors
    assert issubclass(errors.ApiError, RuntimeError) and issubclass(errors.WaitTimeout, TimeoutError)
