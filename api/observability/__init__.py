"""What the server reports about itself: Prometheus metrics (ours or vLLM's names), the engine's
counters read from one snapshot, their sampled history (/v1/stats/history) and the dashboard."""
