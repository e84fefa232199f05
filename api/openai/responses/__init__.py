"""OpenAI's Responses API: /v1/responses, its stream events, and the store that keeps each stored
response's conversation for `previous_response_id`."""
