"""The wire: packing items into one request, reading the reply back per item."""
