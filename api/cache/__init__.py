"""Cache analytics and administration over HTTP: /v1/cache/stats, lookup, prefixes, flush, pin,
unpin and integrity."""
