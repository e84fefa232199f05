"""The Anthropic Messages protocol (/v1/messages, /v1/messages/count_tokens), mapped onto
api.serving's GenerationSpec as the OpenAI routes are: protocol.py (request and response models),
prompt.py (the conversation -> ChatPrompt, tools onto OpenAI's), breakpoints.py (cache_control ->
token positions), usage.py (Anthropic's counts), content.py (whole answers), events.py (the
stream), errors.py (Anthropic's error shape), routes.py. The breakpoints' pins are leases kept by
api/serving/pin_leases.py."""
