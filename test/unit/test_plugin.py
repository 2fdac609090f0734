"""The package loads through SGLang's plugin entry point and fails loudly on drift."""

import subprocess
import sys
import textwrap

import pytest

from sglang_adaptive import upstream


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("adaptive_spec") == "sglang_adaptive.plugin:register"


def test_load_plugins_installs_every_hook_by_identity(plugins):
    for hook in upstream.HOOKS:
        impl = upstream.load_impl(hook)
        assert upstream.applied_hook(hook.target, impl) is impl, hook.target
    upstream.verify()


def test_hooked_symbols_are_the_ones_code_paths_use(plugins):
    # Modules that imported a hooked function by name see the patched one too.
    import sglang.srt.managers.schedule_batch as sb
    import sglang.srt.mem_cache.allocation_sizing as sizing
    import sglang.srt.speculative.eagle_utils as eu

    (hook,) = [h for h in upstream.HOOKS if h.target.endswith(".get_alloc_reserve_per_decode")]
    impl = upstream.load_impl(hook)
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
    ],
    ids=["missing-symbol", "hook-not-applied", "other-release"],
)
def test_start_up_fails_with_the_drift_named(prelude, sentence):
    out = _start_up(prelude)
    assert out.returncode != 0
    assert sentence in out.stderr, out.stderr[-3000:]
