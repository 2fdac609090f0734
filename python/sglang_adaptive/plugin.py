"""Entry point of the ``sglang.srt.plugins`` group.

``sglang.srt.plugins.load_plugins()`` runs ``register()`` once per process (launcher,
every scheduler child) and then ``HookRegistry.apply_hooks()``. SGLang swallows
exceptions raised by a plugin function and only logs hooks that fail to apply, so
``register`` wraps ``apply_hooks``: right after the hooks are applied it verifies
them (``upstream.verify``) and raises, which load_plugins does not catch, so the
process stops with the sentence that names the drift.
"""

from __future__ import annotations

import logging

from sglang_adaptive import upstream

logger = logging.getLogger(__name__)

_register_error: BaseException | None = None
_registered: tuple[upstream.Hook, ...] = ()


def _apply_hooks_then_verify(original):
    def apply_hooks(cls):
        original(cls)
        if _register_error is not None:
            raise upstream.UpstreamDriftError(
                f"sglang_adaptive could not register its hooks: {_register_error}"
            ) from _register_error
        upstream.verify(_registered)
        from sglang_adaptive import hosttime

        hosttime.maybe_install()

    apply_hooks._sglang_adaptive_verifies = True
    return apply_hooks


def register() -> None:
    global _register_error, _registered
    registry = upstream.sglang_symbols.HookRegistry
    current = registry.__dict__["apply_hooks"]
    if not getattr(current.__func__, "_sglang_adaptive_verifies", False):
        registry.apply_hooks = classmethod(_apply_hooks_then_verify(current.__func__))
    try:
        # Imported here, not at the top: load_plugins only logs an entry point that
        # fails to import, while an error here stops start-up in apply_hooks.
        from sglang_adaptive.hooks import HOOKS

        upstream.register_hooks(HOOKS)
        _registered = HOOKS
    except Exception as e:  # reported by the verifying apply_hooks, not swallowed
        _register_error = e
        raise
