"""Helper processes of the multi-process and failover tests (run as scripts)."""
