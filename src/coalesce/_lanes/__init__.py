"""The deferred lanes: calls whose deadline is hours away, sent to the providers' batch APIs.

``store`` keeps every job, line and item durably (SQLite), on top of ``records`` (the
dataclasses and states), ``schema`` (the file format), ``statements`` (the SQL its methods
share) and ``paths`` (where the store lives); ``keys`` names an item by everything that
determines its answer. Nothing here is imported eagerly.
"""
