"""Torch-free pieces that the engine, the server and the router must share exactly.

The router (`radixcache route`) runs no model and never imports the engine or torch, yet it has to
agree with every replica byte for byte: the same chat messages must render to the same prompt text
(`chat_template`, so both sides tokenize to the same ids and hash the same blocks), the KV events a
replica publishes must decode on the router (`kv_events_wire`, vLLM's wire format), and both
sides name the KV tiers alike (`tier_names`). They live here, beside the index and as light as it,
so each has one copy that every side imports; the storage tiers import `tier_names` too.
"""
