"""The Anthropic Messages protocol (/v1/messages): its request and response models and routes go
here, mapped onto api.serving's GenerationSpec as the OpenAI routes are. Nothing is served yet."""
