"""The deferred lanes: calls whose deadline is hours away, sent to the providers' batch APIs.

``store`` keeps every job, line and item durably (SQLite); its methods live by concern in
``connection`` (the file, its lock and transactions), ``item_table``, ``job_writes``,
``line_writes`` and ``job_queries``, on top of ``records`` (the dataclasses and states),
``schema`` (the file format) and ``statements`` (the SQL its methods share; where the
store lives by default is ``coalesce._paths``); ``keys`` names an item by everything that determines its answer.
``openai_jobs`` and ``anthropic_jobs`` run a provider's batches, ``results`` records what
their lines gave and ``resume`` finishes what an earlier process left. Nothing here is
imported eagerly.
"""
