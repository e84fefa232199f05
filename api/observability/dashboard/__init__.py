"""The operators' dashboard: one live page (/dashboard) over the cache's stats and history."""
