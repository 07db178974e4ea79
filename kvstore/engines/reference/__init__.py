"""The reference engine: a small Llama-style model with a paged KV cache, served over HTTP."""
