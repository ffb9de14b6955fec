"""A minimal Hugging Face Hub endpoint on 127.0.0.1 for tests: enough of the API for huggingface_hub 2.x to
create a repo, commit files (``uploadMode: regular``, no LFS/Xet), and download them again (model_info, tree,
resolve), as described in ``shared/hub_protocol.md``. Writes need the token; reads of public repos do not.

Start with ``LocalHub().start()``; point clients at it with ``HF_ENDPOINT=hub.url``, ``HF_HUB_DISABLE_XET=1``,
``HF_TOKEN=hub.token`` set *before* huggingface_hub is imported (a subprocess is simplest).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

TOKEN = "hf_local_test_token"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class LocalHub:
    def __init__(self) -> None:
        self.repos: dict[str, dict] = {}  # repo_id -> {"files": {path: bytes}, "sha": str, "history": [...]}
        self.token = TOKEN
        self.requests: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> LocalHub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # noqa: ANN002 - quiet
                pass

            # --- helpers ---------------------------------------------------------------------------
            def send_json(self, status: int, body: object, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def error(self, status: int, code: str, message: str) -> None:
                self.send_json(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message})

            def authorized(self) -> bool:
                return self.headers.get("Authorization") == f"Bearer {hub.token}"

            def body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def repo_info(self, repo_id: str) -> dict:
                repo = hub.repos[repo_id]
                return {"id": repo_id, "modelId": repo_id, "sha": repo["sha"], "private": False,
                        "siblings": [{"rfilename": p} for p in sorted(repo["files"])], "tags": [], "downloads": 0}

            # --- routes ----------------------------------------------------------------------------
            def do_GET(self) -> None:  # noqa: N802 - http.server's names
                self.route()

            def do_HEAD(self) -> None:  # noqa: N802
                self.route()

            def do_POST(self) -> None:  # noqa: N802
                self.route()

            def route(self) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append(f"{self.command} {path}")
                parts = path.strip("/").split("/")
                if path == "/api/whoami-v2":
                    return self.send_json(200, {"name": "tester", "type": "user", "orgs": []}) if self.authorized() \
                        else self.error(401, "Unauthorized", "invalid token")
                if path == "/api/validate-yaml":
                    self.body()
                    return self.send_json(200, {"errors": [], "warnings": []})
                if path == "/api/repos/create" and self.command == "POST":
                    return self.create_repo()
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    repo_id = "/".join(parts[2:4])
                    if repo_id not in hub.repos:
                        return self.error(404, "RepoNotFound", f"repository {repo_id} not found")
                    rest = parts[4:]
                    if not rest or rest[0] == "revision":
                        return self.send_json(200, self.repo_info(repo_id))
                    if rest[0] == "tree":
                        files = hub.repos[repo_id]["files"]
                        return self.send_json(200, [{"type": "file", "path": p, "size": len(d),
                                                     "oid": git_blob_sha1(d)} for p, d in sorted(files.items())])
                    if rest[0] == "preupload" and self.command == "POST":
                        return self.preupload()
                    if rest[0] == "commit" and self.command == "POST":
                        return self.commit(repo_id)
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self.resolve("/".join(parts[:2]), "/".join(parts[4:]))
                return self.error(404, "EntryNotFound", f"no route for {self.command} {path}")

            def create_repo(self) -> None:
                if not self.authorized():
                    return self.error(401, "Unauthorized", "a token is needed to create a repository")
                spec = json.loads(self.body())
                repo_id = f"{spec.get('organization') or 'tester'}/{spec['name']}"
                url = f"{hub.url}/{repo_id}"
                if repo_id in hub.repos:
                    return self.send_json(409, {"error": "already exists", "url": url})
                hub.repos[repo_id] = {"files": {}, "sha": "0" * 40, "history": []}
                return self.send_json(200, {"url": url, "name": repo_id, "id": repo_id})

            def preupload(self) -> None:
                if not self.authorized():
                    return self.error(401, "Unauthorized", "token needed")
                files = json.loads(self.body())["files"]
                return self.send_json(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                       "shouldIgnore": False, "oid": None} for f in files]})

            def commit(self, repo_id: str) -> None:
                if not self.authorized():
                    return self.error(401, "Unauthorized", "token needed")
                repo = hub.repos[repo_id]
                lines = [json.loads(line) for line in self.body().decode().splitlines() if line.strip()]
                header = next(x["value"] for x in lines if x["key"] == "header")
                parent = header.get("parentCommit")
                if parent and parent != repo["sha"]:
                    return self.send_json(412, {"error": "parent commit is stale"})
                for op in lines:
                    if op["key"] == "file":
                        repo["files"][op["value"]["path"]] = base64.b64decode(op["value"]["content"])
                    elif op["key"] == "deletedFile":
                        repo["files"].pop(op["value"]["path"], None)
                    elif op["key"] == "lfsFile":
                        return self.send_json(400, {"error": "this test hub takes regular uploads only"})
                digest = hashlib.sha1(json.dumps(sorted((p, git_blob_sha1(d)) for p, d in repo["files"].items()))
                                      .encode() + repo["sha"].encode()).hexdigest()
                repo["sha"] = digest
                repo["history"].append(header.get("summary"))
                return self.send_json(200, {"commitOid": digest, "commitUrl": f"{hub.url}/{repo_id}/commit/{digest}"})

            def resolve(self, repo_id: str, file: str) -> None:
                if repo_id not in hub.repos:
                    return self.error(404, "RepoNotFound", f"repository {repo_id} not found")
                repo = hub.repos[repo_id]
                if file not in repo["files"]:
                    return self.error(404, "EntryNotFound", f"{file} not in {repo_id}")
                data = repo["files"][file]
                etag = git_blob_sha1(data)
                self.send_response(200)
                self.send_header("X-Repo-Commit", repo["sha"])
                self.send_header("ETag", f'"{etag}"')
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(data)

        return Handler
