"""Static files served from an installed package (no CDN: the server works without internet).
Only names listed in advance are served, so a URL can never reach another file."""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path

from fastapi.responses import FileResponse

from api.errors import ApiError

_MEDIA = {".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".html": "text/html"}


@dataclass(frozen=True)
class PackageAssets:
    package: str  # the importable package that ships the files
    folder: str  # inside the package
    names: frozenset[str]

    def path(self, name: str) -> Path:
        if name not in self.names:
            raise ApiError(404, f"No asset named {name!r}")
        found = importlib.resources.files(self.package).joinpath(self.folder, name)
        return Path(str(found))

    def response(self, name: str) -> FileResponse:
        path = self.path(name)
        if not path.is_file():
            raise ApiError(404, f"The asset {name!r} is missing from package {self.package}")
        media = _MEDIA.get(path.suffix, "application/octet-stream")
        return FileResponse(path, media_type=media, headers={"Cache-Control": "max-age=86400"})
