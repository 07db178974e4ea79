"""Observability: Prometheus metrics of the metadata service (meta.py), the storage daemons
(daemon.py) and the client (client.py); the link monitor (links.py); the service's history of
samples behind the dashboard and its structured events (history.py). Names and meanings are
listed in docs/observability.md.

Importing this package imports nothing: the data plane's hooks (kvstore/observe.py) stay free of
prometheus_client, which loads only where metrics are switched on.
"""
