"""The store's classes as a reader would follow them: one class reads a store and one writes it, no method only hands
its call to another object, the integrity rules never call back into the reader that called them, no featstore
class takes a name Zarr already gives, and Zarr's private event-loop helper is imported in one module only. Each is
checked on the source (its syntax tree) or on the calls a real read makes, not on the code's own account of
itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import zarr
import zarr.storage
from synthetic import class_clusters, write_feature_store

from featstore.store.reader import FeatureStore
from featstore.store.writer import StoreWriter

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "featstore" / "store"
PUBLIC_HANDLE = ROOT / "api" / "store.py"  # `fs.Store` and `ModelData`, the public handle over the reader
ZARR_LOOP = ROOT / "featstore" / "store" / "zarr_loop.py"  # the one module that runs Zarr's coroutines


def _sources() -> list[Path]:
    """Every Python file of the repository (package, tests, benchmarks), none of a hidden folder (.venv, .git)."""
    return [p for p in ROOT.rglob("*.py") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _classes(path: Path) -> list[ast.ClassDef]:
    return [node for node in ast.walk(_tree(path)) if isinstance(node, ast.ClassDef)]


def _methods(cls: ast.ClassDef) -> list[ast.FunctionDef]:
    return [node for node in cls.body if isinstance(node, ast.FunctionDef)]


def _one_call(fn: ast.FunctionDef) -> ast.Call | None:
    """The call a method's body is made of, when it is nothing else (`return call(...)` or `call(...)`, after a
    docstring)."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return | ast.Expr):
        return None
    return body[0].value if isinstance(body[0].value, ast.Call) else None


def _held(func: ast.expr) -> str | None:
    """'_x' for a call of `self._x.<method>`: a method of an object the instance holds."""
    if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)
            and isinstance(func.value.value, ast.Name) and func.value.value.id == "self"):
        return func.value.attr
    return None


def _hands_self_on(call: ast.Call) -> bool:
    """A call of a function (not a method of self) given the instance itself: `module.function(self, ...)`."""
    func = call.func
    own = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
    return not own and bool(call.args) and isinstance(call.args[0], ast.Name) and call.args[0].id == "self"


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id in ("property", "cached_property") for d in fn.decorator_list)


def test_one_class_reads_a_store_and_one_writes_it():
    """The classes of featstore/store that open a store's Zarr root are the reader and the writer, and the writer is
    the reader with its writing methods: no role class reading through a store it holds, no base class between."""
    opens_root = {cls.name for path in STORE.glob("*.py") for cls in _classes(path)
                  if any(isinstance(node, ast.Attribute) and node.attr == "root" for node in ast.walk(cls))}
    assert opens_root == {"FeatureStore", "StoreWriter"}
    assert FeatureStore.__bases__ == (object,) and StoreWriter.__bases__ == (FeatureStore,)


def test_no_store_method_only_hands_its_call_on():
    """In the core's store classes no method is only a call through an object the instance holds
    (`return self._x.anything(...)`) or a function handed the instance (`return module.f(self, ...)`). The public
    handle (`fs.Store`, `ModelData`) holds the reader and binds a model's key: none of its methods is only
    `return self._x.same_name(...)` (properties that make a reader's method an attribute, `.models`, `.anchors`,
    are its documented surface, docs/python.md)."""
    found = []
    for path in STORE.glob("*.py"):
        for cls in _classes(path):
            for fn in _methods(cls):
                call = _one_call(fn)
                if call is not None and (_held(call.func) is not None or _hands_self_on(call)):
                    found.append(f"{path.name} {cls.name}.{fn.name}: {ast.unparse(call)}")
    for cls in _classes(PUBLIC_HANDLE):
        for fn in _methods(cls):
            call = _one_call(fn)
            if (call is not None and not _is_property(fn) and _held(call.func) is not None
                    and isinstance(call.func, ast.Attribute) and call.func.attr == fn.name):
                found.append(f"{PUBLIC_HANDLE.name} {cls.name}.{fn.name}: {ast.unparse(call)}")
    assert found == []


def test_verification_imports_no_reader():
    """The integrity rules import neither the reader nor the writer (nor under TYPE_CHECKING): they judge what they
    are handed."""
    imported = set()
    for node in ast.walk(_tree(STORE / "verification.py")):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
            imported |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
    readers = ("featstore.store.reader", "featstore.store.reading", "featstore.store.writer",
               "featstore.store.image_table", "featstore.store.summary")
    assert {m for m in imported if m.startswith(readers)} == set()


def test_the_walk_of_a_check_goes_one_way(tmp_path):
    """Every call a probe job's checks (`check_view_arrays`, `check_view`), `verify` and `info` make, recorded as
    it runs: no function of the reader or the writer is ever entered while a function of the integrity rules is
    on the stack below it. A damaged chunk (its logits rewritten behind the store's back) makes the rules read
    chunk values too."""
    feats, labels = class_clusters(40, 2, [3, 5], seed=2)
    path = write_feature_store(tmp_path / "s.zarr", feats, labels, 2, chunk_rows=16)
    logits = zarr.open_group(str(path), mode="a")["synthetic/clean/logits"]
    logits[16:32] = np.full((16, 2), 7, dtype=np.float16)  # chunk 1, not what its commit wrote
    store = FeatureStore(path)
    reader_files = {str(STORE / name) for name in ("reader.py", "reading.py", "image_table.py", "writer.py")}
    rules = str(STORE / "verification.py")
    back_calls: set[str] = set()

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_filename in reader_files:
            caller = frame.f_back
            while caller is not None:
                if caller.f_code.co_filename == rules:
                    back_calls.add(f"{caller.f_code.co_name} -> {frame.f_code.co_name}")
                    break
                caller = caller.f_back

    sys.setprofile(watch)
    try:
        arrays = store.check_view_arrays("synthetic", "clean")
        chunks = store.check_view("synthetic", "clean")
        problems = store.verify()
        info = store.info()
    finally:
        sys.setprofile(None)
    assert back_calls == set()
    assert arrays == []  # the arrays' shapes are sound; the checks did look: the changed chunk is found
    assert [(p.array, p.chunk) for p in chunks] == [("logits", 1)]
    assert [str(p) for p in problems] == [str(p) for p in chunks]
    assert info.models["synthetic"].views["clean"].chunks_done == 3  # 40 rows in chunks of 16


def test_no_featstore_class_takes_a_zarr_name():
    """A class named like one of Zarr's public ones (`zarr.storage.StorePath`) reads as Zarr's wherever both are
    imported."""
    zarr_names = {n for module in (zarr, zarr.storage) for n in dir(module) if n[:1].isupper()}
    ours = {cls.name for path in _sources() for cls in _classes(path)}
    assert "StorePath" in zarr_names  # the name this guards against is Zarr's
    assert ours & zarr_names == set()


def test_zarr_private_event_loop_is_imported_in_one_module():
    """Zarr's private `zarr.core` (its `sync` runs a coroutine on Zarr's loop) is imported by one module only, which
    says why; every other module uses Zarr's public API or that module."""
    found = set()
    for path in _sources():
        for node in ast.walk(_tree(path)):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            used = (isinstance(node, ast.Attribute) and node.attr == "core" and isinstance(node.value, ast.Name)
                    and node.value.id == "zarr")
            if used or any(n == "zarr.core" or n.startswith("zarr.core.") for n in names):
                found.add(path.relative_to(ROOT).as_posix())
    assert found == {ZARR_LOOP.relative_to(ROOT).as_posix()}
