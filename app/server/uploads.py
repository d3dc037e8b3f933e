"""A file sent to an upload route (/api/replay, /api/sweep/import): as the raw request body
(`curl --data-binary @trace.json`, the page's own upload), or as a form with one file field
(`curl -F file=@trace.json`). BodyLimit (middleware.py) has bounded the whole request already."""
from __future__ import annotations

from starlette.datastructures import UploadFile
from starlette.requests import Request

from .errors import UnsupportedUpload

HOW_TO_SEND = ("send the file as the request body (curl --data-binary @FILE) or as multipart/form-data with one "
               "file field (curl -F file=@FILE)")


async def read_upload(request: Request, what: str) -> tuple[bytes, str | None]:
    """(the file's bytes, its file name if the form gave one). `what` names the file in the refusals, e.g.
    "a batchscope.timeline/1 JSON document or a profiler trace". An empty upload is a ValueError (400); a form
    without exactly one file field, or a urlencoded form, an UnsupportedUpload (415)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/x-www-form-urlencoded":
        raise UnsupportedUpload(f"a urlencoded form carries no file: {HOW_TO_SEND}")
    if kind != "multipart/form-data":
        raw = await request.body()
        if not raw:
            raise ValueError(f"send {what} as the request body, or as a form with one file field")
        return raw, None
    async with request.form(max_files=2, max_fields=8) as form:
        files = [(key, value) for key, value in form.multi_items() if isinstance(value, UploadFile)]
        if len(files) != 1:
            raise UnsupportedUpload(f"the form has {len(files)} file fields, not one: {HOW_TO_SEND}")
        key, upload = files[0]
        raw = await upload.read()
        if not raw:
            raise ValueError(f"the form's file field {key!r} is empty: send {what}")
        return raw, upload.filename or None
