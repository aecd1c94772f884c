"""The deferred lanes: calls whose deadline is hours away, sent to the providers' batch APIs.

``store`` keeps every job, line and item durably (SQLite), its methods split by concern
over ``connection``, ``item_table``, ``job_writes``, ``line_writes`` and ``job_queries``
(each module's row in ``docs/architecture.md`` says what it holds). Nothing here is
imported eagerly.
"""
