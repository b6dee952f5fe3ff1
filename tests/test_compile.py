"""Tests of natgrad_diag._compile: one keyed cache, one lock, one trace counter for every compiled path."""

from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest
import tensorflow as tf

from natgrad_diag import _compile


def _kind() -> str:
    """A trace kind no other test uses, so that counts are exact even in a shared process."""
    return f"test-{uuid.uuid4().hex}"


def _square_builder(kind: str, builds: list[int]):
    """A build function: a tf.function x ↦ x² that notes each trace of ``kind``, traced at once."""

    def build():
        builds.append(1)

        def body(x):
            _compile.note_trace(kind)
            return x * x

        return tf.function(body, input_signature=[tf.TensorSpec([3], tf.float64)], autograph=False).get_concrete_function()

    return build


def test_compiled__same_key_second_call_does_not_retrace():
    kind, builds = _kind(), []
    key = (kind, (3,), "float64")
    first = _compile.compiled(key, _square_builder(kind, builds))
    assert _compile.trace_count(kind) == 1
    np.testing.assert_array_equal(first(tf.constant([1.0, 2.0, 3.0], tf.float64)).numpy(), [1.0, 4.0, 9.0])
    second = _compile.compiled(key, _square_builder(kind, builds))
    assert second is first
    second(tf.constant([4.0, 5.0, 6.0], tf.float64))
    assert _compile.trace_count(kind) == 1 and builds == [1]


def test_compiled__different_key_builds_and_traces_again():
    kind, builds = _kind(), []
    a = _compile.compiled((kind, "a"), _square_builder(kind, builds))
    b = _compile.compiled((kind, "b"), _square_builder(kind, builds))
    assert a is not b
    assert _compile.trace_count(kind) == 2 and len(builds) == 2


def test_compiled__a_failing_build_stores_nothing():
    kind = _kind()

    def broken():
        raise ValueError("not traceable")

    with pytest.raises(ValueError, match="not traceable"):
        _compile.compiled((kind,), broken)
    assert _compile.compiled((kind,), lambda: "built") == "built"


def test_compiled__threads_asking_for_one_key_build_and_trace_it_once():
    kind, builds = _kind(), []
    key = (kind, "threads")
    start = threading.Barrier(6)
    results: list[object] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            start.wait()
            fn = _compile.compiled(key, _square_builder(kind, builds))
            results.append(fn)
            np.testing.assert_array_equal(fn(tf.constant([1.0, 2.0, 3.0], tf.float64)).numpy(), [1.0, 4.0, 9.0])
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert len(results) == 6 and all(r is results[0] for r in results)
    assert builds == [1] and _compile.trace_count(kind) == 1


def test_compiled__the_entry_keeps_its_keep_objects_alive():
    import gc
    import weakref

    class Owner:
        pass

    owner = Owner()
    ref = weakref.ref(owner)
    _compile.compiled((_kind(), id(owner)), lambda: "fn", keep=(owner,))
    del owner
    gc.collect()
    assert ref() is not None  # its id stays unique while the entry lives


def test_remember_and_recall__first_call_records_are_returned_and_unknown_keys_give_none():
    key = (_kind(), (2, 3))
    assert _compile.recall(key) is None
    _compile.remember(key, {"out_shapes": ((2, 3),)})
    assert _compile.recall(key) == {"out_shapes": ((2, 3),)}


def test_cache__least_recently_used_entry_goes_first_beyond_max_entries(monkeypatch: pytest.MonkeyPatch):
    kind = _kind()
    monkeypatch.setattr(_compile, "MAX_ENTRIES", 2)
    builds: list[str] = []
    for name in ("a", "b"):
        _compile.compiled((kind, name), lambda name=name: builds.append(name) or name)
    _compile.compiled((kind, "a"), lambda: builds.append("a again"))  # a is now the most recent
    _compile.compiled((kind, "c"), lambda: builds.append("c") or "c")  # evicts b
    _compile.compiled((kind, "a"), lambda: builds.append("a again"))
    _compile.compiled((kind, "b"), lambda: builds.append("b again") or "b")
    assert builds == ["a", "b", "c", "b again"]


def test_trace_count__none_counts_every_path():
    k1, k2 = _kind(), _kind()
    before = _compile.trace_count()
    _compile.note_trace(k1)
    _compile.note_trace(k2)
    _compile.note_trace(k2)
    assert (_compile.trace_count(k1), _compile.trace_count(k2)) == (1, 2)
    assert _compile.trace_count() - before == 3


def test_jacobian__counts_its_one_trace_under_its_path_and_in_every_path():
    from natgrad_diag.autodiff.chunks import TRACE_KIND
    from natgrad_diag.autodiff.dense import jacobian

    def cube(x):  # a function object of its own: its own cache entry
        return x**3

    x = tf.constant(np.linspace(0.5, 1.5, 70), tf.float64)  # > 64 rows: compiled on the first call
    before, every_path = _compile.trace_count(TRACE_KIND), _compile.trace_count()
    J = jacobian(cube, [x])
    np.testing.assert_allclose(np.diag(J.block(0, 0)), 3 * x.numpy() ** 2, rtol=1e-14)
    # the one trace is the one counter's: under the Jacobian's path and in the count of every path, once
    assert (_compile.trace_count(TRACE_KIND) - before, _compile.trace_count() - every_path) == (1, 1)
    jacobian(cube, [x + 1.0])
    assert _compile.trace_count(TRACE_KIND) == before + 1


class _Model:
    """Stands for a model: the per-model store needs only a weakly referenceable, hashable key."""


def test_for_model__a_deleted_model_frees_its_entries():
    import gc
    import weakref

    model, builds = _Model(), []
    gc.collect()  # models of earlier tests freed now, not during this test
    before = _compile.model_entries()
    first = _compile.for_model(model, "scratch", lambda: builds.append(1) or ["pieces"])
    assert _compile.for_model(model, "scratch", lambda: builds.append(2) or ["other"]) is first and builds == [1]
    assert _compile.model_entries(model) == 1
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None and _compile.model_entries() <= before  # its entry went with it


def test_for_model__keeps_the_most_recently_used_keys_of_each_model(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_compile, "MAX_PER_MODEL", 2)
    a, b, builds = _Model(), _Model(), []
    for key in ("x", "y"):
        _compile.for_model(a, key, lambda key=key: builds.append(key) or key)
    _compile.for_model(a, "x", lambda: builds.append("x again"))  # x is now the most recent
    _compile.for_model(a, "z", lambda: builds.append("z") or "z")  # evicts y
    _compile.for_model(b, "y", lambda: builds.append("b's y") or "y")  # another model: its own entries
    _compile.for_model(a, "y", lambda: builds.append("y again") or "y")
    assert builds == ["x", "y", "z", "b's y", "y again"]
    assert (_compile.model_entries(a), _compile.model_entries(b)) == (2, 1)


def test_package__has_one_compile_cache():
    """No module keeps compiled pieces or layouts in a cache of its own: every cache is natgrad_diag._compile's."""
    import ast
    from pathlib import Path

    root = Path(_compile.__file__).parent
    allowed = {"_compile.py", "strict/callsite.py"}  # callsite's lru_cache holds parsed source lines, not compiled code
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
            if name in ("lru_cache", "cache", "WeakKeyDictionary", "WeakValueDictionary") and rel not in allowed:
                found.append(f"{rel}:{node.lineno} {name}")
    assert found == []


def _trace_file(files: list[str]):
    """A body x ↦ |x| (x where Σx > 0, after the first trace) that records the file its traced code runs from (AutoGraph runs a converted copy from a file
    of its own), with a Python ``if`` on a tensor only when ``files`` already holds a first trace's entry."""
    import inspect

    def body(x):
        files.append(inspect.currentframe().f_code.co_filename)
        if len(files) > 1 and tf.reduce_sum(x) > 0:  # Python control flow on a tensor: only AutoGraph can trace it
            return x
        return tf.abs(x)

    return body


def test_function__traces_without_autograph_and_falls_back_to_it_for_control_flow_on_a_tensor():
    files: list[str] = []
    f = _compile.function(_trace_file(files))
    assert f(tf.constant(-2.0, tf.float64)).numpy() == 2.0
    assert files == [__file__]  # the plain trace: this file's own code, unconverted
    # a new signature retraces; this trace meets `if x > 0` on a tensor, which only AutoGraph turns into a tf.cond
    assert f(tf.constant([-3.0, 3.0], tf.float64)).numpy().tolist() == [3.0, 3.0]
    assert f(tf.constant([4.0], tf.float64)).numpy().tolist() == [4.0]
    assert len(files) >= 3 and files[1] == __file__ and all(name != __file__ for name in files[2:]), files
    # the same for a concrete function, traced at once (how fast check_gradients compiles a user's function)
    files.clear()
    files.append("a first trace")
    concrete = _compile.function(_trace_file(files)).get_concrete_function(tf.TensorSpec([2], tf.float64))
    assert concrete(tf.constant([-1.0, 2.0], tf.float64)).numpy().tolist() == [-1.0, 2.0]
    assert files[1] == __file__ and files[2] != __file__, files


def test_function__len_of_a_tensor_with_an_unknown_dimension_is_traced_by_autograph():
    """``len`` of a symbolic tensor whose first dimension is unknown raises a TypeError without AutoGraph, which
    turns it into ``tf.shape(x)[0]``: the second trace mends it (x·n, n = len(x), by hand)."""
    f = _compile.function(lambda x: x * tf.cast(len(x), x.dtype), input_signature=[tf.TensorSpec([None], tf.float64)])
    assert f(tf.constant([1.0, 2.0, 3.0], tf.float64)).numpy().tolist() == [3.0, 6.0, 9.0]


def test_function__an_error_that_is_not_control_flow_is_raised_as_it_is():
    def body(x):
        raise ValueError("the model's own error")

    with pytest.raises(ValueError, match="the model's own error"):
        _compile.function(body)(tf.constant(1.0, tf.float64))


def test_full_mode__a_second_check_of_a_model_traces_nothing():
    # Full mode's compiled losses and explicit Jacobians are cached per model (the scratch copy with them), so a model
    # checked again, as in a training loop, reuses their traces. Each check used to trace them anew, and TensorFlow
    # keeps a trace's memory: 9 MB more per check at M = 8 (test_full_mode__repeated_checks_keep_memory_flat).
    # Oracle: the trace counters of the compiled paths, and the first check's verdicts.
    from natgrad_diag import check_natgrad
    from natgrad_diag.demo import make_model

    model, data = make_model("svgp", "bernoulli", num_inducing=8, num_data=40, seed=0)
    kinds = ("scratch_grads", "jacobian_chunk")
    before = [_compile.trace_count(k) for k in kinds]
    first = check_natgrad(model, data, gamma=0.1, mode="full", progress=False)
    check_natgrad(model, data, gamma=0.1, mode="full", progress=False)  # a Jacobian compiles at its second call
    traced = [_compile.trace_count(k) for k in kinds]
    third = check_natgrad(model, data, gamma=0.1, mode="full", progress=False)
    assert all(t > b for t, b in zip(traced, before))  # the first checks traced both: the counts see them
    assert [_compile.trace_count(k) for k in kinds] == traced
    assert [(c.name, c.status) for c in third.checks] == [(c.name, c.status) for c in first.checks]
    assert third.gamma_losses == first.gamma_losses


@pytest.mark.slow  # 12 full checks, about 30 s
def test_full_mode__repeated_checks_keep_memory_flat():
    # A researcher checks a small model every epoch: the resident memory after the second check must not grow
    # (before the per-model cache, 9 MB per check; allocator noise is well under 1 MB per check here).
    from natgrad_diag import check_natgrad
    from natgrad_diag.demo import make_model

    def rss_mb():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))

    model, data = make_model("svgp", "bernoulli", num_inducing=8, num_data=40, seed=0)
    for _ in range(2):
        check_natgrad(model, data, gamma=0.1, mode="full", progress=False)
    start = rss_mb()
    for _ in range(10):
        check_natgrad(model, data, gamma=0.1, mode="full", progress=False)
    assert rss_mb() - start < 10.0, rss_mb() - start
