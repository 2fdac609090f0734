"""Load-aware EAGLE speculative decoding for SGLang: speculate where it helps, plain decode where it hurts.

Installed next to the pinned SGLang release, the package is activated by SGLang's
general-plugin entry point (``sglang.srt.plugins``); nothing here is imported by
hand. See ``hooks.py`` for the SGLang functions it patches and ``upstream.py`` for
every other SGLang symbol it touches.
"""

__version__ = "0.1.0"
