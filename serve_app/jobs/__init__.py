"""Asynchronous jobs: the job book (queue, workers, expiry, idempotency), its
SQLite journal and Redis backend, results, states, clients' shares, and the
JobStore deployment over them (store)."""
