"""The request bodies in the OpenAPI document. The routes parse raw bodies themselves (to answer
every malformed body with our own 400), so FastAPI cannot see their models: this puts each model's
JSON schema, with its ranges and lengths, where generated clients and fuzzers look for it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from api.anthropic.protocol import CountTokensRequest, MessagesRequest
from api.cache.routes import FlushRequest
from api.openai.protocol import ChatCompletionRequest, CompletionRequest, LookupRequest, PinRequest
from api.openai.responses.protocol import ResponsesRequest
from api.openai.tokenize_routes import DetokenizeRequest, TokenizeRequest

BODIES: dict[tuple[str, str], type[BaseModel]] = {
    ("/v1/completions", "post"): CompletionRequest,
    ("/v1/chat/completions", "post"): ChatCompletionRequest,
    ("/v1/responses", "post"): ResponsesRequest,
    ("/v1/messages", "post"): MessagesRequest,
    ("/v1/messages/count_tokens", "post"): CountTokensRequest,
    ("/v1/cache/lookup", "post"): LookupRequest,
    ("/v1/cache/pin", "post"): PinRequest,
    ("/v1/cache/unpin", "post"): PinRequest,
    ("/v1/cache/flush", "post"): FlushRequest,
    ("/tokenize", "post"): TokenizeRequest,
    ("/detokenize", "post"): DetokenizeRequest,
}
OPTIONAL_BODIES = {("/v1/cache/flush", "post")}  # an empty body means "every namespace"


def install_request_schemas(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for (path, method), model in BODIES.items():
                operation = doc["paths"].get(path, {}).get(method)
                if operation is None:
                    continue
                js = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(js.pop("$defs", {}))
                schemas[model.__name__] = js
                ref = {"$ref": f"#/components/schemas/{model.__name__}"}
                operation["requestBody"] = {
                    "required": (path, method) not in OPTIONAL_BODIES,
                    "content": {"application/json": {"schema": ref}},
                }
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
