"""Runs one assert test with the solution in another process: the judge never runs the solution's code.

Copied into the eval sandbox and run there as a script (standard library only: it also runs on an
image's own Python):

    python -I harness.py snippet|function TARGET MODULE   3< token   4< test source

It forks. The child (the solution's process) closes fds 3 and 4 before it imports MODULE, then
serves calls over a socket. The parent (the judge) makes itself non-dumpable, reads the token and
the test's source only after the fork (so neither is in the child's memory, on disk, or behind
/proc), and runs the test against a stand-in module whose functions call into the child. Values
cross as tagged JSON of plain data (numbers, strings, bytes, tuples, lists, dicts, sets, and a few
standard library types), so the judge compares the test's expectations with values of its own
types: an object whose ``__eq__`` always holds, a patched ``assert``, a forged report, an early
``exit(0)`` or an ``atexit`` hook all stay in the child, which cannot tell the judge a test passed.
Anything else the solution returns (its own classes, generators) comes back as a handle whose
methods run in the child and whose equality is identity.

The judge prints "<token> PASS" as the last line, after killing the child, only if the test
returned. The judge's sys.path never holds the workspace (``-I``), so nothing the solution writes
there is ever imported by the judge.
"""

from __future__ import annotations

import base64
import builtins
import collections
import contextlib
import ctypes
import datetime
import decimal
import fractions
import importlib
import json
import os
import signal
import socket
import struct
import sys
import traceback
import types

TOKEN_FD, SOURCE_FD = 3, 4
MAX_FRAME = 64 * 1024 * 1024
_PLAIN_BASES = (bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset)
# Standard library types rebuilt by the judge by name (never by anything the child sends as code).
_REBUILT = {"Counter": collections.Counter, "OrderedDict": collections.OrderedDict}


# --- values as tagged JSON -------------------------------------------------------------------
def encode(value, handle_of=None):
    """A JSON-able tagged form of `value`; objects that are not data become handles (or TypeError)."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return ["v", value]
    if kind is bytes:
        return ["b", base64.b64encode(value).decode()]
    if kind is complex:
        return ["c", value.real, value.imag]
    if kind in (tuple, list, set, frozenset):
        tag = {tuple: "t", list: "l", set: "s", frozenset: "f"}[kind]
        return [tag, [encode(item, handle_of) for item in value]]
    if kind is dict:
        return ["d", [[encode(k, handle_of), encode(v, handle_of)] for k, v in value.items()]]
    if kind is fractions.Fraction:
        return ["F", value.numerator, value.denominator]
    if kind is decimal.Decimal:
        return ["D", str(value)]
    if kind is collections.deque:
        return ["q", [encode(item, handle_of) for item in value]]
    if kind in (datetime.datetime, datetime.date, datetime.time):
        return ["T", kind.__name__, value.isoformat()]
    if kind is datetime.timedelta:
        return ["Δ", value.days, value.seconds, value.microseconds]
    if isinstance(value, RemoteObject):
        return ["h", value._handle]
    for base in _PLAIN_BASES:  # a subclass (Counter, namedtuple, IntEnum, a solution's own) as its base
        if isinstance(value, base):
            tagged = encode(base(value) if base is not dict else dict(value.items()), handle_of)
            name = kind.__name__ if kind.__name__ in _REBUILT and kind.__module__ == "collections" else None
            return ["S", name, tagged] if name else tagged
    if handle_of is None:
        raise TypeError(f"cannot pass a {kind.__name__} to the solution's process")
    return ["h", handle_of(value)]


def decode(tagged, resolve):
    """The value of a tagged form; `resolve(handle)` gives what a handle stands for on this side."""
    tag = tagged[0]
    if tag == "v":
        return tagged[1]
    if tag == "b":
        return base64.b64decode(tagged[1])
    if tag == "c":
        return complex(tagged[1], tagged[2])
    if tag in ("t", "l", "s", "f", "q"):
        items = [decode(item, resolve) for item in tagged[1]]
        return {"t": tuple, "l": list, "s": set, "f": frozenset, "q": collections.deque}[tag](items)
    if tag == "d":
        return {decode(k, resolve): decode(v, resolve) for k, v in tagged[1]}
    if tag == "F":
        return fractions.Fraction(tagged[1], tagged[2])
    if tag == "D":
        return decimal.Decimal(tagged[1])
    if tag == "T":
        kind = {"datetime": datetime.datetime, "date": datetime.date, "time": datetime.time}[tagged[1]]
        return kind.fromisoformat(tagged[2])
    if tag == "Δ":
        return datetime.timedelta(days=tagged[1], seconds=tagged[2], microseconds=tagged[3])
    if tag == "S":
        return _REBUILT[tagged[1]](decode(tagged[2], resolve))
    if tag == "h":
        return resolve(tagged[1])
    raise ValueError(f"unknown tag {tag!r}")


# --- frames over the socket ------------------------------------------------------------------
def send(sock, message):
    data = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def receive(sock):
    head = _read_exactly(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">I", head)
    if size > MAX_FRAME:
        raise RemoteError(f"the solution's process sent {size} bytes at once")
    body = _read_exactly(sock, size)
    if body is None:
        return None
    return json.loads(body)


def _read_exactly(sock, size):
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --- the judge's side --------------------------------------------------------------------------
class RemoteError(Exception):
    """An exception in the solution's process that is not a built-in one, or a broken connection."""


class Connection:
    def __init__(self, sock):
        self.sock = sock

    def ask(self, request, mutable_args=()):
        send(self.sock, request)
        reply = receive(self.sock)
        if reply is None:
            raise RemoteError("the solution's process ended during a call")
        if "x" in reply:
            raise _exception(*reply["x"])
        for original, tagged in zip(mutable_args, reply.get("m", ())):
            if tagged is not None:
                _update_in_place(original, decode(tagged, self.handle))
        return decode(reply["v"], self.handle)

    def handle(self, number):
        return RemoteObject(self, number)


def _exception(name, message):
    """The built-in exception of that name (so `pytest.raises(ValueError)` works), else RemoteError."""
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except TypeError:  # one that takes more than a message (UnicodeDecodeError, ExceptionGroup)
            pass
    return RemoteError(f"{name}: {message}")


def _update_in_place(original, new):
    """A list, dict or set the test passed and the solution changed: the test sees the change."""
    if isinstance(original, list) and isinstance(new, list):
        original[:] = new
    elif (isinstance(original, dict) and isinstance(new, dict)) or (isinstance(original, set) and isinstance(new, set)):
        original.clear()
        original.update(new)


class RemoteObject:
    """Something of the solution's that is not data: its methods run there; equality is identity."""

    def __init__(self, connection, handle):
        object.__setattr__(self, "_connection", connection)
        object.__setattr__(self, "_handle", handle)

    def _ask(self, op, *args, **kwargs):
        mutable = [a for a in args if isinstance(a, (list, dict, set))]
        request = {
            "op": op,
            "h": self._handle,
            "a": [encode(a) for a in args],
            "k": {k: encode(v) for k, v in kwargs.items()},
        }
        return self._connection.ask(request, mutable if op == "call" else ())

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        self._ask("setattr", name, value)

    def __call__(self, *args, **kwargs):
        return self._ask("call", *args, **kwargs)

    def __eq__(self, other):
        return isinstance(other, RemoteObject) and other._handle == self._handle

    def __hash__(self):
        return hash(("remote", self._handle))


def _asked(op):
    """A special method of RemoteObject that runs as the child's `__<op>__` of the object."""

    def method(self, *args):
        return self._ask(op, *args)

    method.__name__ = f"__{op}__"
    method.__qualname__ = f"RemoteObject.__{op}__"
    return method


# The special methods asked of the child, each by the op of its name (__len__ asks "len").
for _op in ("iter", "next", "len", "getitem", "contains", "bool", "repr", "str"):
    setattr(RemoteObject, f"__{_op}__", _asked(_op))


def stand_in_module(name, connection, names):
    """The module the test imports: the solution's names, as values or handles."""
    module = types.ModuleType(name)
    for attr, tagged in names.items():
        value = decode(tagged, connection.handle)
        trusted = _trusted_twin(value)
        setattr(module, attr, trusted if trusted is not None else value)
    module.__all__ = [attr for attr in names if not attr.startswith("_")]
    return module


def _trusted_twin(value):
    """For a module, class or function the solution only imported (math, Counter): the judge's own."""
    if not isinstance(value, RemoteObject):
        return None
    try:
        origin = value._ask("origin")
    except Exception:  # noqa: BLE001 - the solution's side may fail any way: then there is no twin
        return None
    if not origin:
        return None
    module_name, qualname = origin
    # Only what the judge would import anyway: the standard library, or a module it already holds.
    stdlib = getattr(sys, "stdlib_module_names", ())
    if module_name.split(".")[0] not in stdlib and module_name not in sys.modules:
        return None
    try:
        found = importlib.import_module(module_name)
        for part in qualname.split(".") if qualname else ():
            found = getattr(found, part)
        return found
    except Exception:  # noqa: BLE001 - importing the named module may raise anything: then no twin
        return None


def judge(mode, target, module_name, sock, child):
    with contextlib.suppress(OSError, AttributeError):  # no libc, or no prctl in it (as cli/procs.py says)
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the child cannot read this process
    token = os.read(TOKEN_FD, 256).decode().strip()
    os.close(TOKEN_FD)
    with os.fdopen(SOURCE_FD, "r") as handle:
        source = handle.read()
    connection = Connection(sock)
    hello = receive(sock)
    passed = False
    try:
        if hello is None:
            raise RemoteError("the solution's process ended before it could be imported")
        if "x" in hello:
            name, message = hello["x"]
            module = types.ModuleType(module_name)
            error = ImportError(f"importing the solution failed: {name}: {message}")

            def missing(attr, error=error):
                raise error

            module.__getattr__ = missing
        else:
            module = stand_in_module(module_name, connection, hello["names"])
        _install(module_name, module)
        if mode == "snippet":
            namespace = {"__name__": "__hidden_test__"}
            exec(f"from {module_name} import *", namespace)  # noqa: S102 - running the tests is the job
            exec(compile(source, "<hidden test>", "exec"), namespace)  # noqa: S102 - running the tests is the job
        else:
            tests = types.ModuleType("_hidden_tests")
            tests.__file__ = "_hidden_tests.py"
            sys.modules["_hidden_tests"] = tests
            exec(compile(source, "_hidden_tests.py", "exec"), tests.__dict__)  # noqa: S102 - running the tests is the job
            getattr(tests, target)()
        passed = True
    except BaseException:  # noqa: BLE001 - anything the test raises, SystemExit included, fails it
        traceback.print_exc()
    finally:
        _end(child)
    sys.stdout.flush()
    sys.stderr.flush()
    if passed:
        sys.stdout.write("\n" + token + " PASS\n")
        sys.stdout.flush()
        os._exit(0)
    os._exit(1)


def _install(name, module):
    """`name` importable in the judge, with empty stand-ins for its parent packages (src.solution)."""
    sys.modules[name] = module
    while "." in name:
        parent_name, _, leaf = name.rpartition(".")
        parent = sys.modules.get(parent_name)
        if parent is None:
            parent = types.ModuleType(parent_name)
            parent.__path__ = []
            sys.modules[parent_name] = parent
        setattr(parent, leaf, sys.modules[name])
        name = parent_name


def _end(child):
    with contextlib.suppress(OSError):
        os.kill(child, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(child, 0)


# --- the solution's side ----------------------------------------------------------------------
def serve(module_name, sock):
    """Import the solution and answer the judge's calls until it hangs up. Never returns."""
    handles = {}

    def handle_of(value):
        number = id(value)
        handles[number] = value
        return number

    def resolve(number):
        return handles[number]

    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
        public = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
        names = {name: encode(getattr(module, name), handle_of) for name in public if hasattr(module, name)}
        send(sock, {"names": names})
    except BaseException as exc:  # noqa: BLE001 - whatever importing the solution raises goes back to the judge
        _send_error(sock, exc)
        os._exit(0)
    while True:
        try:
            request = receive(sock)
        except BaseException:  # noqa: BLE001 - the judge is gone or spoke garbage: this process ends
            os._exit(0)
        if request is None:
            os._exit(0)
        try:
            args = [decode(a, resolve) for a in request.get("a", ())]
            kwargs = {k: decode(v, resolve) for k, v in request.get("k", {}).items()}
            value = _perform(request["op"], handles[request["h"]], args, kwargs)
            reply = {"v": encode(value, handle_of)}
            if request["op"] == "call":
                reply["m"] = [_mutable_state(a, handle_of) for a in args if isinstance(a, (list, dict, set))]
            send(sock, reply)
        except BaseException as exc:  # noqa: BLE001 - whatever the solution's code raises goes back to the judge
            _send_error(sock, exc)


# The ops that are a builtin applied to the target alone (RemoteObject's special methods of those names).
_BUILTIN_OPS = {"iter": iter, "next": next, "len": len, "bool": bool, "repr": repr, "str": str}


def _perform(op, target, args, kwargs):
    if op == "call":
        return target(*args, **kwargs)
    if op == "getattr":
        return getattr(target, args[0])
    if op == "setattr":
        setattr(target, args[0], args[1])
        return None
    if op in _BUILTIN_OPS:
        return _BUILTIN_OPS[op](target)
    if op == "getitem":
        return target[args[0]]
    if op == "contains":
        return args[0] in target
    if op == "origin":
        return _origin(target)
    raise ValueError(f"unknown operation {op!r}")


def _origin(value):
    """(module, qualname) of a module, class or function that comes from outside the workspace."""
    if isinstance(value, types.ModuleType):
        name, qualname, where = value.__name__, "", getattr(value, "__file__", None)
    else:
        name, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if not isinstance(name, str) or not isinstance(qualname, str) or "<" in qualname:
            return None
        where = getattr(sys.modules.get(name), "__file__", None)
    if where is not None and os.path.abspath(where).startswith(os.getcwd() + os.sep):
        return None  # the workspace's own: only the child has it
    return [name, qualname]


def _mutable_state(value, handle_of):
    try:
        return encode(value, handle_of)
    except Exception:  # noqa: BLE001 - a solution's object may fail to encode any way: no state then
        return None


def _send_error(sock, exc):
    message = str(exc)[:2000]
    try:
        send(sock, {"x": [type(exc).__name__, message]})
    except Exception:  # noqa: BLE001 - the error cannot be sent: this process ends
        os._exit(1)


def main():
    mode, target, module_name = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.stdout.flush()
    sys.stderr.flush()
    judge_end, solution_end = socket.socketpair()
    child = os.fork()
    if child == 0:
        for fd in (TOKEN_FD, SOURCE_FD):
            os.close(fd)
        judge_end.close()
        serve(module_name, solution_end)
    solution_end.close()
    judge(mode, target, module_name, judge_end, child)


if __name__ == "__main__":
    main()
