"""The wire: protobuf messages to and from the store's values (convert, listing, tenant_info) and
the fast lane's framing (frames)."""
