"""Daemon-side storage: the memory or disk behind a segment, one class per tier."""
