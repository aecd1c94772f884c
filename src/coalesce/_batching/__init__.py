"""The generic micro-batcher: windows, dispatch policies, result slots, statistics.

The lowest layer: it knows nothing of LLMs, and imports only ``_exceptions`` and
``_validate`` from the rest of coalesce.
"""
