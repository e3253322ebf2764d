"""Numbered SQL migrations (``NNNN_name.sql``), applied by :mod:`router.db.migrate`."""
