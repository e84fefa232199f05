"""/docs: Swagger UI with its assets served from the `swagger-ui-py` package (FastAPI's default
page loads them from a CDN, which machines without internet cannot reach)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse

from api.package_assets import PackageAssets

SWAGGER = PackageAssets(
    "swagger_ui",
    "static",
    frozenset({"swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png"}),
)
ASSETS = "/docs/assets"


def docs_router(openapi_url: str, title: str) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/docs")
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            oauth2_redirect_url="/docs/oauth2-redirect",
        )

    @router.get("/docs/oauth2-redirect")
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @router.get(ASSETS + "/{name}")
    async def asset(name: str) -> FileResponse:
        return SWAGGER.response(name)

    return router
