"""The OpenAI protocol: request and response models, the /v1/models, /v1/completions and
/v1/chat/completions routes, their choices (whole and streamed), tool calls and output formats, and
vLLM's /tokenize and /detokenize. A request is mapped onto api.serving's protocol-neutral
GenerationSpec; /v1/responses belongs here too."""
