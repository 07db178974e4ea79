"""The metadata service's process: the gRPC server and fast lane (meta, fastlane) over the handlers that
turn calls into MetaStore operations (handlers, auth), and the KV events it publishes (events)."""
