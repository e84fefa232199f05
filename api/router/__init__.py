"""`radixcache route`: an OpenAI-compatible front that sends each request to the replica holding
the longest cached prefix of its prompt (known from the replicas' KV events), balanced by load."""
