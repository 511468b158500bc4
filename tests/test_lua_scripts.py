"""Lua reaches Redis one way: `.lua` files loaded through shared/lua_scripts.py; no module of the service
holds Lua in a string or registers a script by itself, and every script file is loaded by someone."""

from __future__ import annotations

import re
from pathlib import Path

from shared.lua_scripts import lua_source, register_lua

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("api", "cli", "gateway", "shared", "workers")
LOADER = ROOT / "shared" / "lua_scripts.py"


def _product_modules() -> list[Path]:
    return [path for package in PRODUCT for path in (ROOT / package).rglob("*.py") if path != LOADER]


def test_no_module_holds_inline_lua_or_registers_a_script_itself() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in _product_modules()
        if re.search(r"redis\.call\(|register_script\(|\.eval\(\s*[\"'_A-Z]", path.read_text())
    ]
    assert offenders == []


def test_every_lua_file_is_loaded_by_name() -> None:
    sources = "\n".join(path.read_text() for path in _product_modules())
    unused = [
        str(script.relative_to(ROOT))
        for package in PRODUCT
        for script in (ROOT / package).rglob("*.lua")
        if f'"{script.name}"' not in sources
    ]
    assert unused == []


def test_scripts_load_in_order_and_run(redis) -> None:  # type: ignore[no-untyped-def]
    joined = lua_source("shared.batches", "reserve.lua", "fill.lua")
    assert joined.index(lua_source("shared.batches", "reserve.lua")) == 0
    assert joined.endswith(lua_source("shared.batches", "fill.lua"))
    hset = register_lua(redis, "shared.backend_pool", "hset_if_exists.lua")
    assert hset(keys=["house:absent"], args=["a", "1"]) == 0 and not redis.exists("house:absent")
    redis.hset("house:present", "a", "0")
    assert hset(keys=["house:present"], args=["a", "1"]) == 1 and redis.hget("house:present", "a") == b"1"
