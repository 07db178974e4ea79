"""kvstore: a KVCache-centric store for disaggregated LLM serving."""

__version__ = "0.1.0"
