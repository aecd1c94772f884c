"""The generic micro-batcher: windows, dispatch policies, result slots, statistics.

The lowest layer above the base: it knows nothing of LLMs, and imports only
``_exceptions``, ``_validate`` and ``_options`` from the rest of coalesce.
"""
