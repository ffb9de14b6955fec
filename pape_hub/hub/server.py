"""A Hugging Face Hub endpoint that runs on 127.0.0.1: the part of the Hub HTTP API ``huggingface_hub`` uses to
create a repo, upload (regular and LFS, single-part and multipart), commit, and download (resolve, revision,
tree, model info), with token checks. It lets the project's real push and pull code run where the public Hub is
out of reach: ``pape-hub hub serve --port 8910 --data-dir hub-data``, then point clients at it::

    export HF_ENDPOINT=http://127.0.0.1:8910 HF_TOKEN=<the printed token> HF_HUB_DISABLE_XET=1

(``huggingface_hub`` reads these at import time. Xet is the client's choice and there is no fallback, so it must
be disabled for this endpoint; uploads then take the classic LFS path.)

Storage (``--data-dir``): content-addressed objects (``objects/regular/<git blob sha1>``,
``objects/lfs/<sha256>``), and per repo a ``repo.json``, one immutable JSON file per commit (its whole file
table) and ``refs.json`` naming the commit ``main`` points at. A commit is written first and published by an
atomic rename of ``refs.json``, so an interrupted push leaves the repo at its previous commit, never half of a
new one, and retrying is safe. Writes need the token; reads of public repos do not (private repos need it).

Upload modes: ``auto`` answers ``lfs`` for binary files (a NUL byte in the first 512 bytes) and files over 10 MB,
like the Hub; ``regular`` answers ``regular`` for every file (inline base64 in the commit); ``lfs`` for every
file. LFS files over ``multipart_threshold`` bytes are uploaded in parts of ``chunk_size``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlparse

__all__ = ["LocalHub", "git_blob_sha1"]

_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_EMPTY_COMMIT = "0" * 40


def git_blob_sha1(data: bytes) -> str:
    """The id git (and the Hub, for regular files) gives a file's content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class HubError(Exception):
    """An API error: HTTP status, the Hub's ``X-Error-Code`` and a message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class LocalHub:
    """The endpoint. ``start()`` serves in a background thread; ``serve_forever()`` in the calling one."""

    def __init__(self, data_dir: str | Path, token: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 upload_mode: str = "auto", multipart_threshold: int = 64 * 2**20, chunk_size: int = 16 * 2**20,
                 user: str = "local-user") -> None:
        if upload_mode not in ("auto", "regular", "lfs"):
            raise ValueError(f"upload_mode must be 'auto', 'regular' or 'lfs', got {upload_mode!r}")
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the local Hub listens on the loopback interface only, not {host!r}")
        self.data_dir = Path(data_dir)
        (self.data_dir / "objects" / "regular").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "objects" / "lfs").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "uploads").mkdir(parents=True, exist_ok=True)
        self.token = token or f"hf_local_{secrets.token_hex(12)}"
        self.user = user
        self.upload_mode = upload_mode
        self.multipart_threshold, self.chunk_size = multipart_threshold, chunk_size
        self._signing_key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        #: test hooks: fail the next N commit requests / LFS part uploads with a dropped connection
        self.fail_commits = 0
        self.fail_uploads = 0
        self.requests: list[str] = []
        self.server = ThreadingHTTPServer((host, port), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> LocalHub:
        threading.Thread(target=self.server.serve_forever, daemon=True, name="local-hub").start()
        return self

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def client_env(self) -> dict[str, str]:
        """Environment variables that point ``huggingface_hub`` (and timm / transformers) at this endpoint."""
        return dict(HF_ENDPOINT=self.url, HF_TOKEN=self.token, HF_HUB_DISABLE_XET="1",
                    HF_HUB_DISABLE_TELEMETRY="1")

    # --- storage ---------------------------------------------------------------------------------
    def _repo_dir(self, repo_id: str) -> Path:
        return self.data_dir / "repos" / repo_id

    def repo_exists(self, repo_id: str) -> bool:
        return (self._repo_dir(repo_id) / "repo.json").exists()

    def _repo_meta(self, repo_id: str) -> dict[str, Any]:
        if not self.repo_exists(repo_id):
            raise HubError(404, "RepoNotFound", f"Repository {repo_id} not found")
        return json.loads((self._repo_dir(repo_id) / "repo.json").read_text())

    def head(self, repo_id: str) -> str:
        refs = self._repo_dir(repo_id) / "refs.json"
        return json.loads(refs.read_text())["main"] if refs.exists() else _EMPTY_COMMIT

    def commit_record(self, repo_id: str, commit: str) -> dict[str, Any]:
        if commit == _EMPTY_COMMIT:
            return dict(id=commit, parent=None, title="", message="", date=None, files={})
        path = self._repo_dir(repo_id) / "commits" / f"{commit}.json"
        if not path.exists():
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {commit}")
        return json.loads(path.read_text())

    def resolve_revision(self, repo_id: str, revision: str | None) -> str:
        revision = unquote(revision or "main")
        if revision in ("main", "refs/heads/main"):
            return self.head(repo_id)
        if re.fullmatch(r"[0-9a-f]{40}", revision) and (revision == _EMPTY_COMMIT or (
                self._repo_dir(repo_id) / "commits" / f"{revision}.json").exists()):
            return revision
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def files(self, repo_id: str, revision: str | None = None) -> dict[str, dict[str, Any]]:
        """{path: {"kind": "regular"|"lfs", "oid": sha1|sha256, "size": int}} at a revision."""
        return self.commit_record(repo_id, self.resolve_revision(repo_id, revision))["files"]

    def read_file(self, entry: dict[str, Any]) -> Path:
        return self.data_dir / "objects" / entry["kind"] / entry["oid"]

    def _store_object(self, kind: str, oid: str, data: bytes) -> None:
        path = self.data_dir / "objects" / kind / oid
        if not path.exists():
            _atomic_write(path, data)

    # --- signed upload URLs (the LFS PUTs carry no Authorization header, like presigned storage URLs) ----------
    def _sign(self, text: str) -> str:
        return hmac.new(self._signing_key, text.encode(), hashlib.sha256).hexdigest()[:32]

    def _signed(self, path: str) -> str:
        return f"{self.url}{path}?sig={self._sign(path)}"

    def _check_signature(self, path: str, query: dict[str, list[str]]) -> None:
        if not hmac.compare_digest(query.get("sig", [""])[0], self._sign(path)):
            raise HubError(403, "Forbidden", "invalid or missing upload signature")

    # --- operations --------------------------------------------------------------------------------------
    def create_repo(self, repo_id: str, private: bool) -> tuple[int, dict[str, Any]]:
        url = f"{self.url}/{repo_id}"
        with self._lock:
            if self.repo_exists(repo_id):
                return 409, {"error": f"You already created this model repo: {repo_id}", "url": url}
            _atomic_write(self._repo_dir(repo_id) / "repo.json",
                          json.dumps(dict(id=repo_id, private=private, created=time.time())).encode())
        return 200, {"url": url, "name": repo_id, "id": repo_id}

    def upload_mode_for(self, sample: bytes, size: int) -> str:
        if self.upload_mode != "auto":
            return self.upload_mode
        return "lfs" if size > 10 * 2**20 or b"\0" in sample else "regular"

    def commit(self, repo_id: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
        """Apply one NDJSON commit: everything is checked and stored first, then ``main`` moves in one rename."""
        header = next((line["value"] for line in lines if line.get("key") == "header"), None)
        if header is None:
            raise HubError(400, "BadRequest", "commit payload has no header line")
        ops = [line for line in lines if line.get("key") != "header"]
        with self._lock:
            parent = self.head(repo_id)
            if header.get("parentCommit") and header["parentCommit"] != parent:
                raise HubError(412, "PreconditionFailed",
                               f"parent commit {header['parentCommit']} is not the head of main ({parent})")
            files = dict(self.commit_record(repo_id, parent)["files"])
            for op in ops:
                key, value = op.get("key"), op.get("value", {})
                path = value.get("path", "")
                if key == "file":
                    data = base64.b64decode(value["content"]) if value.get("encoding", "base64") == "base64" \
                        else value["content"].encode()
                    oid = git_blob_sha1(data)
                    self._store_object("regular", oid, data)
                    files[path] = dict(kind="regular", oid=oid, size=len(data))
                elif key == "lfsFile":
                    if value.get("algo", "sha256") != "sha256":
                        raise HubError(400, "BadRequest", f"unsupported LFS hash {value.get('algo')!r}")
                    if not (self.data_dir / "objects" / "lfs" / value["oid"]).exists():
                        raise HubError(422, "LfsObjectMissing", f"LFS object {value['oid']} for {path} was never "
                                       "uploaded")
                    files[path] = dict(kind="lfs", oid=value["oid"], size=int(value["size"]))
                elif key == "deletedFile":
                    if path not in files:
                        raise HubError(404, "EntryNotFound", f"cannot delete {path}: not in the repository")
                    files.pop(path)
                elif key == "deletedFolder":
                    prefix = path.rstrip("/") + "/"
                    files = {p: e for p, e in files.items() if not p.startswith(prefix)}
                else:
                    raise HubError(400, "BadRequest", f"unknown commit operation {key!r}")
            record = dict(parent=parent, title=header.get("summary") or "Upload", message=header.get("description")
                          or "", date=time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()), files=files)
            commit = hashlib.sha1(json.dumps(record, sort_keys=True).encode()).hexdigest()
            record["id"] = commit
            repo = self._repo_dir(repo_id)
            _atomic_write(repo / "commits" / f"{commit}.json", json.dumps(record, indent=1).encode())
            _atomic_write(repo / "refs.json", json.dumps({"main": commit}).encode())  # the publishing step
        return {"commitOid": commit, "commitUrl": f"{self.url}/{repo_id}/commit/{commit}", "pullRequestUrl": None}

    def history(self, repo_id: str, revision: str | None) -> list[dict[str, Any]]:
        commit, out = self.resolve_revision(repo_id, revision), []
        while commit and commit != _EMPTY_COMMIT:
            record = self.commit_record(repo_id, commit)
            out.append(dict(id=commit, title=record["title"], message=record["message"], date=record["date"],
                            authors=[{"user": self.user}]))
            commit = record["parent"]
        return out

    def model_info(self, repo_id: str, revision: str | None = None) -> dict[str, Any]:
        meta = self._repo_meta(repo_id)
        commit = self.resolve_revision(repo_id, revision)
        record = self.commit_record(repo_id, commit)
        siblings = []
        for path, entry in sorted(record["files"].items()):
            sibling = {"rfilename": path, "size": entry["size"]}
            if entry["kind"] == "lfs":
                sibling["lfs"] = {"sha256": entry["oid"], "size": entry["size"], "pointerSize": 134}
            siblings.append(sibling)
        return {"id": repo_id, "modelId": repo_id, "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
                "author": repo_id.split("/")[0], "sha": commit, "private": meta["private"], "disabled": False,
                "gated": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
                "lastModified": record["date"], "createdAt": time.strftime("%Y-%m-%dT%H:%M:%S.000Z",
                                                                            time.gmtime(meta["created"]))}

    def tree(self, repo_id: str, revision: str | None, folder: str, recursive: bool) -> list[dict[str, Any]]:
        files = self.files(repo_id, revision)
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        entries, folders = [], set()
        for path, entry in sorted(files.items()):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/")[0])
                continue
            if recursive:
                parts = rest.split("/")[:-1]
                folders.update(prefix + "/".join(parts[: i + 1]) for i in range(len(parts)))
            item = {"type": "file", "path": path, "size": entry["size"],
                    "oid": entry["oid"] if entry["kind"] == "regular" else git_blob_sha1(entry["oid"].encode())}
            if entry["kind"] == "lfs":
                item["lfs"] = {"oid": entry["oid"], "size": entry["size"], "pointerSize": 134}
            entries.append(item)
        if prefix and not entries and not folders:
            raise HubError(404, "EntryNotFound", f"{folder} does not exist in {repo_id}")
        return [{"type": "directory", "path": f, "oid": _EMPTY_COMMIT, "size": 0} for f in sorted(folders)] + entries

    def lfs_batch(self, repo_id: str, objects: list[dict[str, Any]]) -> dict[str, Any]:
        out = []
        for obj in objects:
            oid, size = obj["oid"], int(obj["size"])
            item: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if not re.fullmatch(r"[0-9a-f]{64}", oid):
                item["error"] = {"code": 422, "message": f"invalid sha256 oid {oid!r}"}
            elif not (self.data_dir / "objects" / "lfs" / oid).exists():  # else: no actions = already present
                verify = {"href": self._signed(f"/lfs/{repo_id}/verify/{oid}")}
                if size > self.multipart_threshold:
                    parts = -(-size // self.chunk_size)
                    header = {"chunk_size": str(self.chunk_size)}
                    header.update({str(i): self._signed(f"/lfs/{repo_id}/part/{oid}/{i}") for i in range(1, parts + 1)})
                    item["actions"] = {"upload": {"href": self._signed(f"/lfs/{repo_id}/complete/{oid}"),
                                                  "header": header}, "verify": verify}
                else:
                    item["actions"] = {"upload": {"href": self._signed(f"/lfs/{repo_id}/put/{oid}")},
                                       "verify": verify}
            out.append(item)
        return {"transfer": "basic", "objects": out}

    def receive_lfs(self, oid: str, data: bytes) -> None:
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, "BadRequest", f"uploaded content does not hash to {oid}")
        self._store_object("lfs", oid, data)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return _make_handler(self)


def _make_handler(hub: LocalHub) -> type[BaseHTTPRequestHandler]:  # noqa: C901 - one router
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet: the command prints its own one-line log
            pass

        # --- responses ---------------------------------------------------------------------------
        def send_body(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
                      ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            self.send_body(status, json.dumps(body).encode(), "application/json", headers)

        def fail(self, err: HubError) -> None:
            self.send_json(err.status, {"error": err.message},
                           {"X-Error-Code": err.code, "X-Error-Message": err.message})

        def body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def authorized(self) -> bool:
            given = self.headers.get("Authorization", "")
            return hmac.compare_digest(given.encode(), f"Bearer {hub.token}".encode())

        def require_token(self, what: str) -> None:
            if not self.authorized():
                raise HubError(401, "Unauthorized", f"Invalid credentials: a valid token is needed to {what}")

        def require_read(self, repo_id: str) -> None:
            if hub._repo_meta(repo_id)["private"] and not self.authorized():
                # the Hub hides private repos from anonymous readers
                raise HubError(401, "RepoNotFound", f"Repository {repo_id} not found or not accessible")

        # --- routing -----------------------------------------------------------------------------
        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self.route()

        def do_HEAD(self) -> None:  # noqa: N802
            self.route()

        def do_POST(self) -> None:  # noqa: N802
            self.route()

        def do_PUT(self) -> None:  # noqa: N802
            self.route()

        def route(self) -> None:
            parsed = urlparse(self.path)
            path, query = unquote(parsed.path), parse_qs(parsed.query)
            hub.requests.append(f"{self.command} {path}")
            try:
                self.dispatch(path, query)
            except HubError as err:
                self.fail(err)
            except (KeyError, ValueError, json.JSONDecodeError) as err:
                self.fail(HubError(400, "BadRequest", f"malformed request: {err}"))
            except ConnectionDropped:
                self.close_connection = True

        def dispatch(self, path: str, query: dict[str, list[str]]) -> None:
            parts = [p for p in path.split("/") if p]
            method = self.command
            if path == "/api/whoami-v2":
                self.require_token("identify you")
                return self.send_json(200, {"type": "user", "name": hub.user, "fullname": hub.user, "orgs": [],
                                            "auth": {"type": "access_token", "accessToken": {
                                                "displayName": "local", "role": "write"}}})
            if path == "/api/validate-yaml" and method == "POST":
                self.body()
                return self.send_json(200, {"errors": [], "warnings": []})
            if path == "/api/repos/create" and method == "POST":
                self.require_token("create a repository")
                spec = json.loads(self.body())
                name, org = spec.get("name", ""), spec.get("organization") or hub.user
                for part in (org, name):
                    if not _REPO_PART.match(part) or ".." in part or part.endswith((".git", ".")):
                        raise HubError(400, "BadRequest", f"invalid repository name {org}/{name}")
                if spec.get("type", "model") not in ("model", None):
                    raise HubError(400, "BadRequest", "this local Hub holds model repositories only")
                status, body = hub.create_repo(f"{org}/{name}", bool(spec.get("private")))
                return self.send_json(status, body)
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                return self.api_models("/".join(parts[2:4]), parts[4:], query)
            if parts and parts[0] == "lfs" and len(parts) >= 5:
                return self.lfs("/".join(parts[1:3]), parts[3:], path, query)
            if len(parts) == 6 and parts[1].endswith(".git") and parts[2:] == ["info", "lfs", "objects", "batch"]:
                return self.lfs_batch(f"{parts[0]}/{parts[1][:-4]}")
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
            raise HubError(404, "EntryNotFound", f"no route for {method} {path}")

        def api_models(self, repo_id: str, rest: list[str], query: dict[str, list[str]]) -> None:
            method = self.command
            if rest[:1] == ["preupload"] and method == "POST":
                self.require_token("upload")
                hub._repo_meta(repo_id)
                revision = hub.resolve_revision(repo_id, rest[1] if len(rest) > 1 else None)
                current = hub.files(repo_id, revision)
                answers = []
                for f in json.loads(self.body())["files"]:
                    mode = hub.upload_mode_for(base64.b64decode(f.get("sample", "")), int(f["size"]))
                    entry = current.get(f["path"])
                    answers.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False,
                                    "oid": entry["oid"] if entry and entry["kind"] == mode else None})
                return self.send_json(200, {"files": answers, "commitOid": revision})
            if rest[:1] == ["commit"] and method == "POST":
                self.require_token("commit")
                hub._repo_meta(repo_id)
                if rest[1:] and unquote(rest[1]) not in ("main", "refs/heads/main"):
                    raise HubError(400, "BadRequest", "this local Hub commits to the main branch only")
                raw = self.body()
                if hub.fail_commits > 0:
                    hub.fail_commits -= 1
                    raise ConnectionDropped
                lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
                return self.send_json(200, hub.commit(repo_id, lines))
            self.require_read(repo_id)
            if not rest or rest[0] == "revision":
                revision = rest[1] if len(rest) > 1 else None
                return self.send_json(200, hub.model_info(repo_id, revision))
            if rest[0] == "tree":
                revision = rest[1] if len(rest) > 1 else None
                recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                return self.send_json(200, hub.tree(repo_id, revision, "/".join(rest[2:]), recursive))
            if rest[0] == "commits":
                return self.send_json(200, hub.history(repo_id, rest[1] if len(rest) > 1 else None))
            if rest[0] == "refs":
                head = hub.head(repo_id)
                return self.send_json(200, {"branches": [{"name": "main", "ref": "refs/heads/main",
                                                          "targetCommit": head}], "tags": [], "converts": []})
            raise HubError(404, "EntryNotFound", f"no route for {self.command} /api/models/{repo_id}/"
                           + "/".join(rest))

        def lfs_batch(self, repo_id: str) -> None:
            self.require_token("upload large files")
            hub._repo_meta(repo_id)
            request = json.loads(self.body())
            if request.get("operation") != "upload":
                raise HubError(400, "BadRequest", "this local Hub's LFS endpoint takes uploads only")
            self.send_body(200, json.dumps(hub.lfs_batch(repo_id, request["objects"])).encode(),
                           "application/vnd.git-lfs+json")

        def lfs(self, repo_id: str, rest: list[str], path: str, query: dict[str, list[str]]) -> None:
            hub._check_signature(path, query)  # presigned: the PUTs come without an Authorization header
            action, oid = rest[0], rest[1]
            if action == "put" and self.command == "PUT":
                data = self.read_upload()
                hub.receive_lfs(oid, data)
                return self.send_body(200, b"", "text/plain")
            if action == "part" and self.command == "PUT":
                data = self.read_upload()
                part = hub.data_dir / "uploads" / f"{oid}.{int(rest[2]):05d}"
                _atomic_write(part, data)
                return self.send_body(200, b"", "text/plain", {"ETag": f'"{hashlib.md5(data).hexdigest()}"'})
            if action == "complete" and self.command == "POST":
                request = json.loads(self.body())
                pieces = []
                for item in sorted(request["parts"], key=lambda p: p["partNumber"]):
                    part = hub.data_dir / "uploads" / f"{oid}.{int(item['partNumber']):05d}"
                    if not part.exists():
                        raise HubError(400, "BadRequest", f"part {item['partNumber']} of {oid} was never uploaded")
                    data = part.read_bytes()
                    if f'"{hashlib.md5(data).hexdigest()}"' != item["etag"] and hashlib.md5(data).hexdigest() != \
                            item["etag"].strip('"'):
                        raise HubError(400, "BadRequest", f"part {item['partNumber']} etag mismatch")
                    pieces.append(data)
                hub.receive_lfs(oid, b"".join(pieces))
                for part in (hub.data_dir / "uploads").glob(f"{oid}.*"):
                    part.unlink()
                return self.send_json(200, {"oid": oid})
            if action == "verify" and self.command == "POST":
                request = json.loads(self.body())
                stored = hub.data_dir / "objects" / "lfs" / oid
                if request.get("oid") != oid or not stored.exists() or stored.stat().st_size != request.get("size"):
                    raise HubError(404, "LfsObjectMissing", f"LFS object {oid} is not stored (or has another size)")
                return self.send_json(200, {"oid": oid, "size": request["size"]})
            raise HubError(404, "EntryNotFound", f"no LFS route for {self.command} {path}")

        def read_upload(self) -> bytes:
            if hub.fail_uploads > 0:
                hub.fail_uploads -= 1
                self.rfile.read(min(1024, int(self.headers.get("Content-Length") or 0)))
                raise ConnectionDropped
            return self.body()

        def resolve(self, repo_id: str, revision: str, file: str) -> None:
            self.require_read(repo_id)
            commit = hub.resolve_revision(repo_id, revision)
            entry = hub.files(repo_id, commit).get(file)
            if entry is None:
                raise HubError(404, "EntryNotFound", f"{file} does not exist in {repo_id} at {commit[:12]}")
            data_path = hub.read_file(entry)
            size = entry["size"]
            headers = {"X-Repo-Commit": commit, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes",
                       "Content-Disposition": f"attachment; filename*=UTF-8''{quote(file.split('/')[-1])}"}
            if entry["kind"] == "lfs":
                headers.update({"X-Linked-Etag": f'"{entry["oid"]}"', "X-Linked-Size": str(size)})
            start, end = 0, size - 1
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            status = 200
            if match and self.command == "GET":
                start, end = int(match.group(1)), int(match.group(2) or size - 1)
                if start >= size:
                    raise HubError(416, "RangeNotSatisfiable", f"range starts at {start} of {size} bytes")
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start + 1 if self.command == "GET" else size))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command == "GET":
                with open(data_path, "rb") as fh:
                    fh.seek(start)
                    remaining = end - start + 1
                    while remaining > 0:
                        chunk = fh.read(min(remaining, 1 << 20))
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        remaining -= len(chunk)

    return Handler


class ConnectionDropped(Exception):
    """Test hook: the server closes the connection without an answer (a push interrupted midway)."""


def serve(data_dir: str | Path, port: int, token: str | None = None, host: str = "127.0.0.1",
          upload_mode: str = "auto") -> None:
    """Run the endpoint in the foreground until interrupted (``pape-hub hub serve``)."""
    hub = LocalHub(data_dir, token=token, host=host, port=port, upload_mode=upload_mode)
    print(f"local Hub serving {Path(data_dir).resolve()} at {hub.url}\n"
          f"point clients at it:\n  export HF_ENDPOINT={hub.url} HF_TOKEN={hub.token} HF_HUB_DISABLE_XET=1",
          flush=True)
    try:
        hub.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        hub.server.server_close()
        shutil.rmtree(hub.data_dir / "uploads", ignore_errors=True)
