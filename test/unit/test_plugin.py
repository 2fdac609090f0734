"""The package loads through SGLang's plugin entry point and fails loudly on drift."""

import inspect
import re
import subprocess
import sys
import textwrap

import pytest

from sglang_adaptive import args, scheduler_hooks, telemetry, upstream
from sglang_adaptive.hooks import HOOKS


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("adaptive_spec") == "sglang_adaptive.plugin:register"


def test_load_plugins_installs_every_hook_by_identity(plugins):
    for hook in HOOKS:
        assert upstream.applied_hook(hook.target, hook.impl) is hook.impl, hook.target
    upstream.verify(HOOKS)


def test_each_hook_holds_the_function_it_patches():
    from sglang.srt.plugins.hook_registry import HookType

    bodies = {hook.impl for hook in HOOKS}
    assert len(bodies) == len(HOOKS)
    for hook in HOOKS:
        assert hook.impl.__module__ in (args.__name__, scheduler_hooks.__name__, telemetry.__name__), hook.target
        assert getattr(sys.modules[hook.impl.__module__], hook.impl.__name__) is hook.impl
        assert hasattr(HookType, hook.kind), hook.kind
    (hook,) = [h for h in HOOKS if h.target.endswith(".check_decode_mem")]
    assert hook.impl is scheduler_hooks.around_check_decode_mem


def test_hooked_symbols_are_the_ones_code_paths_use(plugins):
    # Modules that imported a hooked function by name see the patched one too.
    import sglang.srt.managers.schedule_batch as sb
    import sglang.srt.mem_cache.allocation_sizing as sizing
    import sglang.srt.speculative.eagle_utils as eu

    (hook,) = [h for h in HOOKS if h.target.endswith(".get_alloc_reserve_per_decode")]
    impl = hook.impl
    for module in (eu, sb):
        assert module.get_alloc_reserve_per_decode is sizing.get_alloc_reserve_per_decode
        target = f"{module.__name__}.get_alloc_reserve_per_decode"
        assert upstream.applied_hook(target, impl) is impl


def test_instance_attributes_are_checked_on_live_objects():
    from types import SimpleNamespace as NS

    upstream.check_instance(NS(attn_backend=1), ("attn_backend",), "ModelRunner instance")
    with pytest.raises(upstream.UpstreamDriftError, match=r"ModelRunner instance\.init_new_workspace does not exist"):
        upstream.check_instance(NS(attn_backend=1), ("attn_backend", "init_new_workspace"),
                                "ModelRunner instance")


DRIFT = "sglang_adaptive: upstream symbol {} {}; this package supports sglang==0.5.17, installed sglang is"


class _Without:
    """An upstream class as a release without one of its attributes would show it."""

    def __init__(self, cls, hidden: str):
        self._cls, self._hidden = cls, hidden

    def __getattr__(self, name):
        if name == self._hidden:
            raise AttributeError(name)
        return getattr(self._cls, name)


@pytest.mark.parametrize("owner, attr", upstream.ATTRIBUTES, ids=[f"{o}.{a}" for o, a in upstream.ATTRIBUTES])
def test_start_up_check_names_a_missing_attribute(plugins, monkeypatch, owner, attr):
    cls = getattr(upstream.sglang_symbols, owner)
    monkeypatch.setattr(upstream.sglang_symbols, owner, _Without(cls, attr))
    with pytest.raises(upstream.UpstreamDriftError) as e:
        upstream.verify(HOOKS)
    assert DRIFT.format(f"{upstream.SYMBOLS[owner]}.{attr}", "does not exist") in str(e.value)


FIELD_ENTRIES = [(owner, name) for owner, names in upstream.FIELDS.items() for name in names]


@pytest.mark.parametrize("owner, name", FIELD_ENTRIES, ids=[f"{o}.{n}" for o, n in FIELD_ENTRIES])
def test_start_up_check_names_a_missing_field(plugins, monkeypatch, owner, name):
    cls = getattr(upstream.sglang_symbols, owner)
    monkeypatch.delitem(cls.__dataclass_fields__, name)
    with pytest.raises(upstream.UpstreamDriftError) as e:
        upstream.verify(HOOKS)
    assert DRIFT.format(f"{upstream.SYMBOLS[owner]}.{name}", "is not a field") in str(e.value)


@pytest.fixture()
def sglang_source(monkeypatch):
    """Rewrite the source ``upstream.assigned_attributes`` reads, as a release would."""
    real = inspect.getsource

    def rewrite(edit):
        def getsource(obj):
            source = real(obj)
            return edit(source) if getattr(obj, "__module__", "").startswith("sglang.") else source

        upstream.assigned_attributes.cache_clear()
        monkeypatch.setattr(inspect, "getsource", getsource)

    yield rewrite
    upstream.assigned_attributes.cache_clear()


@pytest.mark.parametrize("owner, attr", upstream.ASSIGNED_ATTRIBUTES,
                         ids=[f"{o}.{a}" for o, a in upstream.ASSIGNED_ATTRIBUTES])
def test_start_up_check_names_an_instance_attribute_its_class_no_longer_sets(
        plugins, sglang_source, owner, attr):
    cls = getattr(upstream.sglang_symbols, owner)
    assert not hasattr(cls, attr) and attr in upstream.assigned_attributes(cls)
    sglang_source(lambda source: re.sub(rf"\b{attr}\b", f"{attr}_renamed", source))
    with pytest.raises(upstream.UpstreamDriftError) as e:
        upstream.verify(HOOKS)
    assert DRIFT.format(f"{upstream.SYMBOLS[owner]}.{attr}", "is not set by its class or its bases") in str(e.value)


def test_instance_attributes_are_read_from_assignments_not_from_text(plugins, sglang_source):
    req = upstream.sglang_symbols.Req
    # Still named in comments and read everywhere, but never assigned: not an attribute.
    sglang_source(lambda source: source.replace("self.kv_committed_len = ", "kv_committed_len = "))
    assert "kv_committed_len" not in upstream.assigned_attributes(req)
    assert {"is_retracted", "kv"} <= upstream.assigned_attributes(req)


def test_instance_attributes_of_an_unreadable_source_fail_closed(plugins, monkeypatch):
    def no_source(obj):
        raise OSError("could not get source code")

    upstream.assigned_attributes.cache_clear()
    monkeypatch.setattr(inspect, "getsource", no_source)
    try:
        with pytest.raises(upstream.UpstreamDriftError, match=r"schedule_batch\.Req\.kv_committed_len is not set"):
            upstream.verify(HOOKS)
    finally:
        upstream.assigned_attributes.cache_clear()


def _start_up(prelude: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(prelude) + "\nfrom sglang.srt.plugins import load_plugins\nload_plugins()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "prelude, sentence",
    [
        (
            """
            from sglang.srt.managers.schedule_batch import ScheduleBatch
            del ScheduleBatch.check_decode_mem  # as if a release renamed it
            """,
            "UpstreamDriftError: sglang_adaptive: upstream symbol "
            "sglang.srt.managers.schedule_batch.ScheduleBatch.check_decode_mem does not exist; "
            "this package supports sglang==0.5.17",
        ),
        (
            """
            from sglang.srt.plugins.hook_registry import HookRegistry
            apply_target = HookRegistry._apply_target.__func__
            def skip_one(cls, target, hooks):  # as if SGLang failed to patch it
                if not target.endswith("prepare_for_decode"):
                    apply_target(cls, target, hooks)
            HookRegistry._apply_target = classmethod(skip_one)
            """,
            "UpstreamDriftError: sglang_adaptive: upstream symbol "
            "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode "
            "was not patched by its hook",
        ),
        (
            """
            import importlib.metadata as md
            real = md.version
            md.version = lambda name: "0.5.23" if name == "sglang" else real(name)
            """,
            "UpstreamDriftError: sglang_adaptive supports sglang==0.5.17 only, "
            "but sglang 0.5.23 is installed",
        ),
        (
            """
            from sglang.srt.managers.schedule_batch import ReqKvInfo
            del ReqKvInfo.__dataclass_fields__["kv_allocated_len"]  # as if a release renamed it
            """,
            "UpstreamDriftError: sglang_adaptive: upstream symbol "
            "sglang.srt.managers.schedule_batch.ReqKvInfo.kv_allocated_len is not a field",
        ),
    ],
    ids=["missing-symbol", "hook-not-applied", "other-release", "missing-field"],
)
def test_start_up_fails_with_the_drift_named(prelude, sentence):
    out = _start_up(prelude)
    assert out.returncode != 0
    assert sentence in out.stderr, out.stderr[-3000:]


@pytest.mark.parametrize("path, names", upstream.PARAMETERS, ids=[p.rsplit(".", 2)[-2] + "." + p.rsplit(".", 1)[-1]
                                                                  for p, _ in upstream.PARAMETERS])
def test_start_up_check_names_a_renamed_parameter(plugins, monkeypatch, path, names):
    assert upstream.missing_parameters(path, names) == []
    real = inspect.signature

    def renamed(obj, *args, **kwargs):
        sig = real(obj, *args, **kwargs)
        target = upstream._resolve(path)  # a classmethod resolves to a new bound method each time
        if getattr(obj, "__func__", obj) is getattr(target, "__func__", target):
            sig = sig.replace(parameters=[p.replace(name=p.name + "_v2") if p.name == names[-1] else p
                                          for p in sig.parameters.values()])
        return sig

    monkeypatch.setattr(inspect, "signature", renamed)
    with pytest.raises(upstream.UpstreamDriftError) as e:
        upstream.verify(HOOKS)
    assert DRIFT.format(f"{path}({names[-1]}=...)", "has no such parameter") in str(e.value)
