"""Everyday shapes of calling: blocking calls from synchronous code (``f.sync``), and many
items at once (``f.map``), with a concurrency limit and progress.

Both run on what :mod:`coalesce._batching.portal` gives: the process's background event
loop, and the hop of a call to the loop its batcher serves.
"""
