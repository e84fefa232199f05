"""What every protocol shares to run a request: the one request builder (a protocol-neutral
GenerationSpec and its caller -> engine jobs, after the checks that need the model), running the
jobs and collecting or streaming their outputs, server-sent events, and engine errors as HTTP
errors."""
