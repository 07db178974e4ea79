"""The version of kvstore, written once (the wheel's metadata reads it too)."""

__version__ = "0.1.0"
