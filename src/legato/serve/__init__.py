"""Serving: a multi-LoRA inference engine (continuous batching, paged KV cache with prefix
caching, segmented LoRA GEMMs), and what serves it over HTTP (docs/serving.md)."""
