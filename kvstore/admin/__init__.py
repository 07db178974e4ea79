"""The HTTP admin face that the service and the daemons serve (metrics, dashboard, indexer routes)."""
