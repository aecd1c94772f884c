"""The deferred lanes: calls whose deadline is hours away, sent to the providers' batch APIs.

``store`` keeps every job, line and item durably (SQLite); ``keys`` names an item by
everything that determines its answer. Nothing here is imported eagerly.
"""
