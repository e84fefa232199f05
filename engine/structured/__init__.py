"""Constrained decoding: constraint specs, their compiled grammars (cached) and per-sequence
matchers that mask the sampler's logits."""
