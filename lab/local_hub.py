"""A Hugging Face Hub endpoint that runs on 127.0.0.1: the part of the Hub HTTP API ``huggingface_hub`` uses to
create a repo, upload (regular and LFS, single-part and multipart), commit, and download (resolve, revision,
tree, model info), with token checks. It lets the project's real push and pull code run where the public Hub is
out of reach: ``python -m lab hub serve --port 8910 --data-dir hub-data``, then point clients at it::

    export HF_ENDPOINT=http://127.0.0.1:8910 HF_TOKEN=<the printed token> HF_HUB_DISABLE_XET=1

(``huggingface_hub`` reads these at import time. Xet is the client's choice and there is no fallback, so it must
be disabled for this endpoint; uploads then take the classic LFS path.)

What it is for: tests and offline work on one machine. It listens on the loopback interface only, has one user
and one token, holds model repos with a ``main`` branch only, and is not hardened for exposure to a network (no
TLS, no rate limits, no quotas beyond the body caps below).

What it does promise, whatever a client sends: every repo id, revision, file path, LFS oid, size and body is
checked against the Hub's rules before it touches the disk, so no request reads or writes outside ``--data-dir``;
every malformed request is answered with a 4xx and a JSON ``{"error": ...}`` (the Hub's ``X-Error-Code`` header
too); an unread request body closes the connection instead of being parsed as the next request; idle connections
time out. An LFS file can be committed only with an oid this repo's own uploads stored, at its stored size.
Private repos and missing ones answer anonymous readers alike (401 ``RepoNotFound``, as the Hub does).

Storage (``--data-dir``): content-addressed objects (``objects/regular/<git blob sha1>``,
``objects/lfs/<sha256>``), and per repo a ``repo.json``, the LFS oids its uploads stored (``lfs/<sha256>``), one
immutable JSON file per commit (its whole file table) and ``refs.json`` naming the commit ``main`` points at. A
commit is written first and published by an atomic rename of ``refs.json``, so an interrupted push leaves the repo
at its previous commit, never half of a new one, and retrying is safe. Writes need the token; reads of public repos
do not (private repos need it).

Upload modes: ``auto`` answers ``lfs`` for binary files (a NUL byte in the first 512 bytes) and files over 10 MB,
like the Hub; ``regular`` answers ``regular`` for every file (inline base64 in the commit); ``lfs`` for every
file. LFS files over ``multipart_threshold`` bytes are uploaded in parts of ``chunk_size``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = ["DropConnection", "HubError", "LocalHub", "check_path_in_repo", "check_repo_id", "git_blob_sha1"]

_EMPTY_COMMIT = "0" * 40
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHA1 = re.compile(r"[0-9a-f]{40}")
#: a namespace or repo name: the Hub's characters, no leading/trailing '-' or '.', no '--' or '..' (96 at most)
_REPO_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
MAX_PATH_BYTES, MAX_SEGMENT_BYTES = 1024, 255  # a path in a repo; one folder or file name (what file systems take)
MAX_JSON_BODY = 64 * 2**20  # a commit carries regular files (up to 10 MB each on the Hub) inline as base64
MAX_FILES_PER_REQUEST = 10_000
MAX_LFS_OBJECTS = 1_000  # per batch request (huggingface_hub sends 256 at most)
MAX_PARTS_PER_BATCH = 10_000  # signed part URLs in one batch answer (about 1.5 MB of JSON)
ACCESS_LOG_LENGTH = 1_000  # requests the access log keeps
READ_CHUNK = 2**20  # bodies are streamed to disk in pieces of this size


class HubError(Exception):
    """An API error: HTTP status, the Hub's ``X-Error-Code`` and a message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class DropConnection(Exception):
    """Close the connection without an answer (what a network failure midway looks like to a client)."""


def bad_request(message: str) -> HubError:
    return HubError(400, "BadRequest", message)


# --- the Hub's rules for names ------------------------------------------------------------------------------
def check_repo_id(repo_id: str) -> str:
    """``namespace/name`` by the Hub's rules, or a 400 naming the problem."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(
            _REPO_PART.fullmatch(p) and ".." not in p and "--" not in p and not p.endswith(".git") for p in parts):
        raise bad_request(f"invalid repo id {repo_id[:200]!r}: expected 'namespace/name' of letters, digits, '-', "
                          "'_' and '.', neither starting nor ending with '-' or '.', without '--' or '..', at most "
                          "96 characters each")
    return repo_id


def check_path_in_repo(path: Any) -> str:
    """A relative file path of non-empty segments without '.', '..', '.git', backslashes or control characters."""
    if not isinstance(path, str) or not path:
        raise bad_request(f"invalid path in repo {path!r}: expected a non-empty string")
    shown = repr(path[:200])
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise bad_request(f"invalid path in repo {shown}: longer than {MAX_PATH_BYTES} bytes")
    if "\\" in path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise bad_request(f"invalid path in repo {shown}: backslashes and control characters are not allowed")
    for segment in path.split("/"):
        if segment in ("", ".", "..", ".git"):
            raise bad_request(f"invalid path in repo {shown}: it must be relative, without empty, '.', '..' or "
                              "'.git' parts")
        if len(segment.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:
            raise bad_request(f"invalid path in repo {shown}: a part is longer than {MAX_SEGMENT_BYTES} bytes")
    return path


def check_oid(oid: Any) -> str:
    if not isinstance(oid, str) or not _SHA256.fullmatch(oid):
        raise bad_request(f"invalid LFS oid {str(oid)[:100]!r}: expected 64 lowercase hex characters (sha256)")
    return oid


def _get(obj: Any, key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    """``obj[key]`` checked to be a JSON object member of ``kind`` (bools are not ints), or a 400."""
    if not isinstance(obj, dict):
        raise bad_request(f"{where} must be a JSON object, got {type(obj).__name__}")
    if key not in obj and default is not ...:
        return default
    value = obj.get(key)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise bad_request(f"{where}.{key} must be {names}, got {type(value).__name__}")
    return value


def _size(obj: Any, where: str) -> int:
    size = _get(obj, "size", int, where)
    if size < 0:
        raise bad_request(f"{where}.size must not be negative, got {size}")
    return size


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


def _now(seconds: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(seconds))


class LocalHub:
    """The endpoint's storage and operations. ``start()`` serves in a background thread; ``serve_forever()`` in the
    calling one. Every method that takes a repo id, oid or path checks it first."""

    def __init__(self, data_dir: str | Path, token: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 upload_mode: str = "auto", multipart_threshold: int = 64 * 2**20, chunk_size: int = 16 * 2**20,
                 user: str = "local-user", timeout: float = 60.0) -> None:
        if upload_mode not in ("auto", "regular", "lfs"):
            raise ValueError(f"upload_mode must be 'auto', 'regular' or 'lfs', got {upload_mode!r}")
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the local Hub listens on the loopback interface only, not {host!r}")
        self.data_dir = Path(data_dir).resolve()
        self._made_uploads_dir = not (self.data_dir / "uploads").exists()
        for sub in ("objects/regular", "objects/lfs", "uploads", "repos"):
            (self.data_dir / sub).mkdir(parents=True, exist_ok=True)
        self._session_uploads: set[Path] = set()  # parts and partial objects this server wrote (cleaned at stop)
        self.token = token or f"hf_local_{secrets.token_hex(12)}"
        self.user = user
        self.upload_mode = upload_mode
        self.multipart_threshold, self.chunk_size = multipart_threshold, chunk_size
        self._signing_key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self.requests: deque[str] = deque(maxlen=ACCESS_LOG_LENGTH)  # the last requests: "METHOD /path" each
        self.server = ThreadingHTTPServer((host, port), _make_handler(self, timeout))
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"

    # --- lifecycle -------------------------------------------------------------------------------
    #: how often the serving loop looks for a stop request (seconds): ``stop()`` waits up to this long
    POLL_INTERVAL = 0.05

    def start(self) -> LocalHub:
        threading.Thread(target=self.server.serve_forever, args=(self.POLL_INTERVAL,), daemon=True,
                         name="local-hub").start()
        return self

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.clean_uploads()

    def clean_uploads(self) -> None:
        """Remove what this server's unfinished uploads left (abandoned multipart parts, partial objects), and the
        uploads folder if this server made it and it is empty; nothing else there is touched."""
        for path in list(self._session_uploads):
            path.unlink(missing_ok=True)
            self._session_uploads.discard(path)
        uploads = self.data_dir / "uploads"
        if self._made_uploads_dir and uploads.is_dir() and not any(uploads.iterdir()):
            uploads.rmdir()

    def client_env(self) -> dict[str, str]:
        """Environment variables that point ``huggingface_hub`` (and timm / transformers) at this endpoint."""
        return dict(HF_ENDPOINT=self.url, HF_TOKEN=self.token, HF_HUB_DISABLE_XET="1",
                    HF_HUB_DISABLE_TELEMETRY="1")

    @property
    def max_upload(self) -> int:
        """The largest single PUT: a whole object below the multipart threshold, or one part."""
        return max(self.multipart_threshold, self.chunk_size)

    # --- storage: every path below is built from checked ids only, and checked to stay inside ----------
    def _inside(self, *parts: str) -> Path:
        path = self.data_dir.joinpath(*parts)
        if not path.resolve().is_relative_to(self.data_dir):
            raise HubError(400, "BadRequest", "path leaves the data folder")  # unreachable after the checks
        return path

    def _repo_dir(self, repo_id: str) -> Path:
        return self._inside("repos", *check_repo_id(repo_id).split("/"))

    def _object(self, kind: str, oid: str) -> Path:
        if kind not in ("regular", "lfs") or not (_SHA1 if kind == "regular" else _SHA256).fullmatch(oid):
            raise bad_request(f"invalid {kind} object id {oid[:100]!r}")
        return self._inside("objects", kind, oid)

    def repo_exists(self, repo_id: str) -> bool:
        return (self._repo_dir(repo_id) / "repo.json").exists()

    def repo_meta(self, repo_id: str) -> dict[str, Any]:
        if not self.repo_exists(repo_id):
            raise HubError(404, "RepoNotFound", f"Repository {repo_id} not found")
        return json.loads((self._repo_dir(repo_id) / "repo.json").read_text())

    def head(self, repo_id: str) -> str:
        refs = self._repo_dir(repo_id) / "refs.json"
        return json.loads(refs.read_text())["main"] if refs.exists() else _EMPTY_COMMIT

    def commit_record(self, repo_id: str, commit: str) -> dict[str, Any]:
        if commit == _EMPTY_COMMIT:
            return dict(id=commit, parent=None, title="", message="", date=None, files={})
        if not _SHA1.fullmatch(commit):
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {commit[:100]}")
        path = self._repo_dir(repo_id) / "commits" / f"{commit}.json"
        if not path.exists():
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {commit}")
        return json.loads(path.read_text())

    def resolve_revision(self, repo_id: str, revision: str | None) -> str:
        revision = revision or "main"
        if revision in ("main", "refs/heads/main"):
            return self.head(repo_id)
        self.commit_record(repo_id, revision)  # 404 unless it is a commit of this repo
        return revision

    def files(self, repo_id: str, revision: str | None = None) -> dict[str, dict[str, Any]]:
        """{path: {"kind": "regular"|"lfs", "oid": sha1|sha256, "size": int}} at a revision."""
        return self.commit_record(repo_id, self.resolve_revision(repo_id, revision))["files"]

    def read_file(self, entry: dict[str, Any]) -> Path:
        return self._object(entry["kind"], entry["oid"])

    def _store_object(self, kind: str, oid: str, data: bytes) -> None:
        path = self._object(kind, oid)
        if not path.exists():
            _atomic_write(path, data)

    def owns_lfs(self, repo_id: str, oid: str) -> bool:
        """Whether this repo's own uploads stored the object (another repo's upload does not count)."""
        return (self._repo_dir(repo_id) / "lfs" / check_oid(oid)).exists() and self._object("lfs", oid).exists()

    # --- signed upload URLs (the LFS PUTs carry no Authorization header, like presigned storage URLs) ----------
    def _sign(self, text: str) -> str:
        return hmac.new(self._signing_key, text.encode(), hashlib.sha256).hexdigest()[:32]

    def signed(self, path: str) -> str:
        return f"{self.url}{path}?sig={self._sign(path)}"

    def check_signature(self, path: str, query: dict[str, list[str]]) -> None:
        if not hmac.compare_digest(query.get("sig", [""])[0].encode(), self._sign(path).encode()):
            raise HubError(403, "Forbidden", "invalid or missing upload signature")

    # --- operations --------------------------------------------------------------------------------------
    def create_repo(self, repo_id: str, private: bool) -> tuple[int, dict[str, Any]]:
        url = f"{self.url}/{check_repo_id(repo_id)}"
        with self._lock:
            if self.repo_exists(repo_id):
                return 409, {"error": f"You already created this model repo: {repo_id}", "url": url}
            _atomic_write(self._repo_dir(repo_id) / "repo.json",
                          json.dumps(dict(id=repo_id, private=private, created=time.time())).encode())
        return 200, {"url": url, "name": repo_id, "id": repo_id}

    def set_private(self, repo_id: str, private: bool) -> None:
        with self._lock:
            meta = self.repo_meta(repo_id)
            meta["private"] = private
            _atomic_write(self._repo_dir(repo_id) / "repo.json", json.dumps(meta).encode())

    def upload_mode_for(self, sample: bytes, size: int) -> str:
        if self.upload_mode != "auto":
            return self.upload_mode
        return "lfs" if size > 10 * 2**20 or b"\0" in sample else "regular"

    def commit(self, repo_id: str, lines: list[Any]) -> dict[str, Any]:
        """Apply one NDJSON commit: every line is checked and stored first, then ``main`` moves in one rename."""
        headers = [line for line in lines if _get(line, "key", str, "commit line") == "header"]
        if len(headers) != 1:
            raise bad_request(f"a commit needs exactly one header line, got {len(headers)}")
        header = _get(headers[0], "value", dict, "header")
        for key in ("summary", "description", "parentCommit"):
            _get(header, key, (str, type(None)), "header.value", None)
        ops = [line for line in lines if line["key"] != "header"]
        with self._lock:
            parent = self.head(repo_id)
            if header.get("parentCommit") and header["parentCommit"] != parent:
                raise HubError(412, "PreconditionFailed",
                               f"parent commit {header['parentCommit'][:100]} is not the head of main ({parent})")
            files = dict(self.commit_record(repo_id, parent)["files"])
            for op in ops:
                self._apply(repo_id, op, files)
            record = dict(parent=parent, title=header.get("summary") or "Upload",
                          message=header.get("description") or "", date=_now(), files=files)
            commit = hashlib.sha1(json.dumps(record, sort_keys=True).encode()).hexdigest()
            record["id"] = commit
            repo = self._repo_dir(repo_id)
            _atomic_write(repo / "commits" / f"{commit}.json", json.dumps(record, indent=1).encode())
            _atomic_write(repo / "refs.json", json.dumps({"main": commit}).encode())  # the publishing step
        return {"commitOid": commit, "commitUrl": f"{self.url}/{repo_id}/commit/{commit}", "pullRequestUrl": None}

    def _apply(self, repo_id: str, op: dict[str, Any], files: dict[str, dict[str, Any]]) -> None:
        """One commit operation applied to ``files`` (objects are stored; nothing is published yet)."""
        key, value = op["key"], _get(op, "value", dict, f"{op['key']} line")
        path = _get(value, "path", str, f"{key} line")
        path = check_path_in_repo(path.rstrip("/") if key == "deletedFolder" else path)
        if key == "file":
            content = _get(value, "content", str, "file")
            encoding = _get(value, "encoding", str, "file", "base64")
            if encoding != "base64":
                raise bad_request(f"file {path}: unsupported encoding {encoding[:50]!r} (expected base64)")
            try:
                data = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as err:
                raise bad_request(f"file {path}: content is not valid base64 ({err})") from None
            oid = git_blob_sha1(data)
            self._store_object("regular", oid, data)
            files[path] = dict(kind="regular", oid=oid, size=len(data))
        elif key == "lfsFile":
            algo, oid, size = _get(value, "algo", str, "lfsFile", "sha256"), value.get("oid"), _size(value, "lfsFile")
            if algo != "sha256":
                raise bad_request(f"lfsFile {path}: unsupported LFS hash {algo[:50]!r}")
            if not self.owns_lfs(repo_id, check_oid(oid)):
                raise HubError(422, "LfsObjectMissing", f"LFS object {oid} for {path} was never uploaded to {repo_id}")
            stored = self._object("lfs", oid).stat().st_size
            if size != stored:
                raise bad_request(f"lfsFile {path}: declared size {size} but the uploaded object has {stored} bytes")
            files[path] = dict(kind="lfs", oid=oid, size=size)
        elif key == "deletedFile":
            if path not in files:
                raise HubError(404, "EntryNotFound", f"cannot delete {path}: not in the repository")
            files.pop(path)
        elif key == "deletedFolder":
            prefix = path + "/"
            for name in [p for p in files if p.startswith(prefix)]:
                files.pop(name)
        else:
            raise bad_request(f"unknown commit operation {key[:50]!r}")

    def history(self, repo_id: str, revision: str | None) -> list[dict[str, Any]]:
        commit, out = self.resolve_revision(repo_id, revision), []
        while commit and commit != _EMPTY_COMMIT:
            record = self.commit_record(repo_id, commit)
            out.append(dict(id=commit, title=record["title"], message=record["message"], date=record["date"],
                            authors=[{"user": self.user}]))
            commit = record["parent"]
        return out

    def model_info(self, repo_id: str, revision: str | None = None) -> dict[str, Any]:
        meta = self.repo_meta(repo_id)
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
                "lastModified": record["date"], "createdAt": _now(meta["created"])}

    def tree(self, repo_id: str, revision: str | None, folder: str, recursive: bool) -> list[dict[str, Any]]:
        files = self.files(repo_id, revision)
        prefix = check_path_in_repo(folder.strip("/")) + "/" if folder.strip("/") else ""
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

    def lfs_batch(self, repo_id: str, objects: list[Any]) -> dict[str, Any]:
        """Upload actions for each object this repo does not own yet (no action = already stored for this repo)."""
        out, parts_total = [], 0
        for i, obj in enumerate(objects):
            oid, size = check_oid(_get(obj, "oid", str, f"objects[{i}]")), _size(obj, f"objects[{i}]")
            parts_total += -(-size // self.chunk_size) if size > self.multipart_threshold else 0
            if parts_total > MAX_PARTS_PER_BATCH:
                raise bad_request(f"the batch's objects need more than {MAX_PARTS_PER_BATCH} upload parts; send "
                                  "fewer or smaller objects per batch")
            item: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if not self.owns_lfs(repo_id, oid):
                verify = {"href": self.signed(f"/lfs/{repo_id}/verify/{oid}")}
                if size > self.multipart_threshold:
                    parts = -(-size // self.chunk_size)
                    if parts > MAX_FILES_PER_REQUEST:
                        raise bad_request(f"object {oid} of {size} bytes needs more than {MAX_FILES_PER_REQUEST} parts")
                    header = {"chunk_size": str(self.chunk_size)}
                    header.update({str(i): self.signed(f"/lfs/{repo_id}/part/{oid}/{i}") for i in range(1, parts + 1)})
                    item["actions"] = {"upload": {"href": self.signed(f"/lfs/{repo_id}/complete/{oid}"),
                                                  "header": header}, "verify": verify}
                else:
                    item["actions"] = {"upload": {"href": self.signed(f"/lfs/{repo_id}/put/{oid}")},
                                       "verify": verify}
            out.append(item)
        return {"transfer": "basic", "objects": out}

    def _upload_file(self, final: Path | None = None) -> Path:
        """A new file in ``uploads/`` for a body being received; this server's to remove if the upload fails."""
        uploads = self._inside("uploads")
        uploads.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name if final else 'object'}.", dir=uploads)
        os.close(fd)
        self._session_uploads.add(Path(tmp))
        return Path(tmp)

    def receive_lfs(self, repo_id: str, oid: str, save_body: Callable[[Path], dict[str, str]]) -> None:
        """Store an uploaded object, streamed to disk by ``save_body(path)`` (which returns its digests; the content
        must hash to ``oid``), and record that ``repo_id`` uploaded it. Memory stays at one read buffer."""
        check_oid(oid)
        tmp = self._upload_file()
        try:
            if save_body(tmp)["sha256"] != oid:
                raise bad_request(f"uploaded content does not hash to {oid}")
            self._store_file("lfs", oid, tmp)
        finally:
            tmp.unlink(missing_ok=True)
            self._session_uploads.discard(tmp)
        _atomic_write(self._repo_dir(repo_id) / "lfs" / oid, b"")

    def _store_file(self, kind: str, oid: str, tmp: Path) -> None:
        path = self._object(kind, oid)
        if not path.exists():
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)

    def _part(self, oid: str, number: int) -> Path:
        return self._inside("uploads", f"{check_oid(oid)}.{number:05d}")

    def receive_part(self, oid: str, number: int, save_body: Callable[[Path], dict[str, str]]) -> str:
        """Store one part of a multipart upload (streamed, then renamed into place); returns its etag."""
        part = self._part(oid, number)
        tmp = self._upload_file(part)
        try:
            etag = save_body(tmp)["md5"]
            os.replace(tmp, part)
        finally:
            tmp.unlink(missing_ok=True)
            self._session_uploads.discard(tmp)
        self._session_uploads.add(part)  # removed once completed, or when the server stops
        return f'"{etag}"'

    def complete_multipart(self, repo_id: str, oid: str, parts: list[Any]) -> None:
        """Join the parts (each checked against its etag) into the object, streaming; then remove them."""
        numbers = [_get(p, "partNumber", int, "parts[]") for p in parts]
        paths = []
        for number, part in sorted(zip(numbers, parts), key=lambda item: item[0]):
            etag = _get(part, "etag", str, "parts[]")
            path = self._part(oid, number) if 1 <= number <= MAX_FILES_PER_REQUEST else None
            if path is None or not path.exists():
                raise bad_request(f"part {number} of {oid} was never uploaded")
            if _file_digests(path)["md5"] != etag.strip('"'):
                raise bad_request(f"part {number} etag mismatch")
            paths.append(path)

        def join(target: Path) -> dict[str, str]:
            with open(target, "wb") as out:
                return _copy_hashed((open(p, "rb") for p in paths), out)

        self.receive_lfs(repo_id, oid, join)
        for path in self._inside("uploads").glob(f"{oid}.*"):
            path.unlink(missing_ok=True)
            self._session_uploads.discard(path)


def _copy_hashed(sources: Iterable[BinaryIO], out: BinaryIO | None = None) -> dict[str, str]:
    """Copy each source (closed after) into ``out`` in 1 MiB chunks; the sha256 and md5 of all of it."""
    sha, md5 = hashlib.sha256(), hashlib.md5()
    for source in sources:
        with source:
            while chunk := source.read(READ_CHUNK):
                sha.update(chunk)
                md5.update(chunk)
                if out is not None:
                    out.write(chunk)
    return {"sha256": sha.hexdigest(), "md5": md5.hexdigest()}


def _file_digests(path: Path) -> dict[str, str]:
    return _copy_hashed([open(path, "rb")])


# --- HTTP: requests, replies and the route table ---------------------------------------------------------------
@dataclass
class Request:
    """One parsed request: the route's parameters (percent-decoded, unchecked), the query and a way to the body."""

    method: str
    path: str
    params: dict[str, str]
    query: dict[str, list[str]]
    headers: Message
    authorized: bool
    read_body: Callable[[int], bytes]
    save_body: Callable[[int, Path], dict[str, str]]  # (limit, file) -> digests: the body streamed to disk

    def json(self, limit: int = MAX_JSON_BODY) -> Any:
        try:
            return json.loads(self.read_body(limit))
        except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise bad_request(f"the body is not valid JSON ({str(err)[:200]})") from None

    def repo_id(self) -> str:
        return check_repo_id(f"{self.params['namespace']}/{self.params['name']}")


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    file: tuple[Path, int, int] | None = None  # (path, first byte, byte count) streamed instead of body

    @classmethod
    def json(cls, status: int, value: Any, content_type: str = "application/json") -> Reply:
        return cls(status, json.dumps(value).encode(), content_type)


_REPO = r"(?P<namespace>[^/]+)/(?P<name>[^/]+)"


class Routes:
    """The API as a table of (method, path pattern, handler); each handler is small and checks what it reads."""

    def __init__(self, hub: LocalHub) -> None:
        self.hub = hub
        self.table: list[tuple[tuple[str, ...], re.Pattern[str], Callable[[Request], Reply]]] = [
            (("GET",), re.compile(r"/api/whoami-v2"), self.whoami),
            (("POST",), re.compile(r"/api/validate-yaml"), self.validate_yaml),
            (("POST",), re.compile(r"/api/repos/create"), self.create_repo),
            (("PUT",), re.compile(rf"/api/models/{_REPO}/settings"), self.settings),
            (("POST",), re.compile(rf"/api/models/{_REPO}/preupload/(?P<rev>[^/]+)"), self.preupload),
            (("POST",), re.compile(rf"/api/models/{_REPO}/commit/(?P<rev>[^/]+)"), self.commit),
            (("GET", "HEAD"), re.compile(rf"/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?"), self.model_info),
            (("GET",), re.compile(rf"/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?"), self.tree),
            (("GET",), re.compile(rf"/api/models/{_REPO}/commits/(?P<rev>[^/]+)"), self.commits),
            (("GET",), re.compile(rf"/api/models/{_REPO}/refs"), self.refs),
            (("POST",), re.compile(r"/(?P<namespace>[^/]+)/(?P<name>[^/]+)\.git/info/lfs/objects/batch"),
             self.lfs_batch),
            (("PUT",), re.compile(rf"/lfs/{_REPO}/put/(?P<oid>[^/]+)"), self.lfs_put),
            (("PUT",), re.compile(rf"/lfs/{_REPO}/part/(?P<oid>[^/]+)/(?P<part>[0-9]{{1,5}})"), self.lfs_part),
            (("POST",), re.compile(rf"/lfs/{_REPO}/complete/(?P<oid>[^/]+)"), self.lfs_complete),
            (("POST",), re.compile(rf"/lfs/{_REPO}/verify/(?P<oid>[^/]+)"), self.lfs_verify),
            (("GET", "HEAD"), re.compile(rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)"), self.resolve),
        ]

    def match(self, method: str, raw_path: str) -> tuple[Callable[[Request], Reply], dict[str, str]]:
        """The handler and its percent-decoded parameters (split before decoding, so '%2F' cannot add a part)."""
        allowed = False
        for methods, pattern, handler in self.table:
            found = pattern.fullmatch(raw_path)
            if found:
                if method in methods:
                    return handler, {k: unquote(v, errors="strict") for k, v in found.groupdict().items() if v}
                allowed = True
        if allowed:
            raise HubError(405, "MethodNotAllowed", f"{method} is not allowed on {raw_path[:200]}")
        # a repo id without a namespace (timm's "vit_tiny_patch16_224", as transformers' backbone="<timm name>" asks
        # for it): the Hub answers that no such repo exists, which clients treat as "not on the Hub"
        if re.fullmatch(r"/api/models/[^/]+(?:/revision/[^/]+)?|/[^/]+/resolve/[^/]+/.+", raw_path):
            raise HubError(404, "RepoNotFound", f"Repository {raw_path.split('/')[-1][:100]} not found")
        raise HubError(404, "EntryNotFound", f"no route for {method} {raw_path[:200]}")

    # --- access ----------------------------------------------------------------------------------------------
    @staticmethod
    def require_token(req: Request, what: str) -> None:
        if not req.authorized:
            raise HubError(401, "Unauthorized", f"Invalid credentials: a valid token is needed to {what}")

    def readable_repo(self, req: Request) -> str:
        """The repo id, if the caller may read it. Missing and private repos look alike to anonymous callers."""
        repo_id = req.repo_id()
        if not self.hub.repo_exists(repo_id) or (self.hub.repo_meta(repo_id)["private"] and not req.authorized):
            status = 404 if req.authorized else 401
            raise HubError(status, "RepoNotFound", f"Repository {repo_id} not found or not accessible")
        return repo_id

    def writable_repo(self, req: Request, what: str) -> str:
        self.require_token(req, what)
        repo_id = req.repo_id()
        self.hub.repo_meta(repo_id)
        return repo_id

    # --- account and repos -------------------------------------------------------------------------------------
    def whoami(self, req: Request) -> Reply:
        self.require_token(req, "identify you")
        user = self.hub.user
        return Reply.json(200, {"type": "user", "name": user, "fullname": user, "orgs": [], "auth": {
            "type": "access_token", "accessToken": {"displayName": "local", "role": "write"}}})

    def validate_yaml(self, req: Request) -> Reply:
        _get(req.json(), "content", str, "body", "")
        return Reply.json(200, {"errors": [], "warnings": []})

    def create_repo(self, req: Request) -> Reply:
        self.require_token(req, "create a repository")
        spec = req.json()
        name = _get(spec, "name", str, "body")
        org = _get(spec, "organization", (str, type(None)), "body", None) or self.hub.user
        if _get(spec, "type", (str, type(None)), "body", "model") not in ("model", None):
            raise bad_request("this local Hub holds model repositories only")
        status, body = self.hub.create_repo(check_repo_id(f"{org}/{name}"), _private(spec))
        return Reply.json(status, body)

    def settings(self, req: Request) -> Reply:
        """``update_repo_settings``: the visibility (``private``/``public``); this Hub has no gated repos."""
        repo_id = self.writable_repo(req, "change a repository's settings")
        spec = req.json()
        if _get(spec, "gated", (str, bool, type(None)), "body", None) not in (None, False):
            raise bad_request("this local Hub has no gated repositories")
        if "visibility" in spec or "private" in spec:
            self.hub.set_private(repo_id, _private(spec))
        return Reply.json(200, {})

    def model_info(self, req: Request) -> Reply:
        return Reply.json(200, self.hub.model_info(self.readable_repo(req), req.params.get("rev")))

    def tree(self, req: Request) -> Reply:
        recursive = req.query.get("recursive", ["false"])[0].lower() in ("1", "true")
        return Reply.json(200, self.hub.tree(self.readable_repo(req), req.params["rev"], req.params.get("path", ""),
                                             recursive))

    def commits(self, req: Request) -> Reply:
        return Reply.json(200, self.hub.history(self.readable_repo(req), req.params["rev"]))

    def refs(self, req: Request) -> Reply:
        head = self.hub.head(self.readable_repo(req))
        return Reply.json(200, {"branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": head}],
                                "tags": [], "converts": []})

    # --- uploads -----------------------------------------------------------------------------------------------
    def preupload(self, req: Request) -> Reply:
        repo_id = self.writable_repo(req, "upload")
        revision = self.hub.resolve_revision(repo_id, req.params["rev"])
        current = self.hub.files(repo_id, revision)
        listed = _get(req.json(), "files", list, "body")
        if len(listed) > MAX_FILES_PER_REQUEST:
            raise bad_request(f"at most {MAX_FILES_PER_REQUEST} files per preupload request")
        answers = []
        for i, item in enumerate(listed):
            path = check_path_in_repo(_get(item, "path", str, f"files[{i}]"))
            try:
                sample = base64.b64decode(_get(item, "sample", str, f"files[{i}]", ""), validate=True)
            except (binascii.Error, ValueError):
                raise bad_request(f"files[{i}].sample is not valid base64") from None
            mode = self.hub.upload_mode_for(sample, _size(item, f"files[{i}]"))
            entry = current.get(path)
            answers.append({"path": path, "uploadMode": mode, "shouldIgnore": False,
                            "oid": entry["oid"] if entry and entry["kind"] == mode else None})
        return Reply.json(200, {"files": answers, "commitOid": revision})

    def commit(self, req: Request) -> Reply:
        repo_id = self.writable_repo(req, "commit")
        if req.params["rev"] not in ("main", "refs/heads/main"):
            raise bad_request("this local Hub commits to the main branch only")
        try:
            text = req.read_body(MAX_JSON_BODY).decode()
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        except (ValueError, RecursionError) as err:
            raise bad_request(f"the commit is not NDJSON ({str(err)[:200]})") from None
        return Reply.json(200, self.hub.commit(repo_id, lines))

    def lfs_batch(self, req: Request) -> Reply:
        repo_id = self.writable_repo(req, "upload large files")
        request = req.json()
        if _get(request, "operation", str, "body") != "upload":
            raise bad_request("this local Hub's LFS endpoint takes uploads only")
        objects = _get(request, "objects", list, "body")
        if len(objects) > MAX_LFS_OBJECTS:
            raise bad_request(f"at most {MAX_LFS_OBJECTS} objects per batch, got {len(objects)}")
        return Reply.json(200, self.hub.lfs_batch(repo_id, objects), "application/vnd.git-lfs+json")

    def signed_lfs(self, req: Request) -> tuple[str, str]:
        """(repo id, oid) of a presigned LFS URL: the PUTs come without an Authorization header."""
        self.hub.check_signature(req.path, req.query)
        return req.repo_id(), check_oid(req.params["oid"])

    def lfs_put(self, req: Request) -> Reply:
        repo_id, oid = self.signed_lfs(req)
        self.hub.receive_lfs(repo_id, oid, lambda path: req.save_body(self.hub.max_upload, path))
        return Reply(200, b"", "text/plain")

    def lfs_part(self, req: Request) -> Reply:
        _, oid = self.signed_lfs(req)
        etag = self.hub.receive_part(oid, int(req.params["part"]), lambda path: req.save_body(self.hub.chunk_size,
                                                                                              path))
        return Reply(200, b"", "text/plain", {"ETag": etag})

    def lfs_complete(self, req: Request) -> Reply:
        repo_id, oid = self.signed_lfs(req)
        self.hub.complete_multipart(repo_id, oid, _get(req.json(), "parts", list, "body"))
        return Reply.json(200, {"oid": oid})

    def lfs_verify(self, req: Request) -> Reply:
        repo_id, oid = self.signed_lfs(req)
        request = req.json()
        size = _size(request, "body")
        if _get(request, "oid", str, "body") != oid or not self.hub.owns_lfs(repo_id, oid) or \
                self.hub.read_file(dict(kind="lfs", oid=oid)).stat().st_size != size:
            raise HubError(404, "LfsObjectMissing", f"LFS object {oid} is not stored (or has another size)")
        return Reply.json(200, {"oid": oid, "size": size})

    # --- downloads ---------------------------------------------------------------------------------------------
    def resolve(self, req: Request) -> Reply:
        repo_id = self.readable_repo(req)
        commit = self.hub.resolve_revision(repo_id, req.params["rev"])
        file = check_path_in_repo(req.params["path"])
        entry = self.hub.files(repo_id, commit).get(file)
        if entry is None:
            raise HubError(404, "EntryNotFound", f"{file} does not exist in {repo_id} at {commit[:12]}")
        size = entry["size"]
        headers = {"X-Repo-Commit": commit, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes",
                   "Content-Disposition": f"attachment; filename*=UTF-8''{quote(file.split('/')[-1])}"}
        if entry["kind"] == "lfs":
            headers.update({"X-Linked-Etag": f'"{entry["oid"]}"', "X-Linked-Size": str(size)})
        first, last = 0, size - 1
        wanted = parse_range(req.headers.get("Range"), size) if req.method == "GET" else None
        if wanted is not None:
            first, last = wanted
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        return Reply(206 if wanted else 200, content_type="application/octet-stream", headers=headers,
                     file=(self.hub.read_file(entry), first, last - first + 1))


def _private(spec: dict[str, Any]) -> bool:
    """A create or settings request's visibility: ``"visibility"`` (huggingface_hub 1.x and later) or the older
    ``"private"`` flag; public when neither is given."""
    visibility = _get(spec, "visibility", (str, type(None)), "body", None)
    if visibility not in (None, "public", "private"):
        raise bad_request(f"visibility must be 'public' or 'private', got {visibility[:50]!r}")
    private = _get(spec, "private", (bool, type(None)), "body", None)
    return visibility == "private" if visibility is not None else bool(private)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a single ``bytes=`` range clamped to the file, None to send it whole (no or another
    kind of range), or a 416 when it lies outside the file."""
    match = re.fullmatch(r"bytes=([0-9]{0,18})-([0-9]{0,18})", (header or "").strip())  # ASCII digits; else whole
    if not match or match.groups() == ("", ""):
        return None
    start, end = match.groups()
    if start == "":  # the last N bytes
        first, last = max(0, size - int(end)), size - 1
        if int(end) == 0:
            first = size
    else:
        first, last = int(start), min(int(end), size - 1) if end else size - 1
    if first >= size or first > last:
        raise HubError(416, "RangeNotSatisfiable", f"range {header[:100]} is outside the file's {size} bytes")
    return first, last


class HubRequestHandler(BaseHTTPRequestHandler):
    """One HTTP/1.1 connection of the local Hub: reads a request (refusing a body without a plain Content-Length),
    dispatches it through the route table, and answers every outcome, errors included, with a status code. A
    server subclasses it with its ``hub``, ``routes`` and ``idle_timeout`` (:func:`_make_handler`)."""

    hub: LocalHub
    routes: Routes
    idle_timeout: float
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.timeout = self.idle_timeout  # idle or slow connections are closed
        super().setup()

    def log_message(self, *args: Any) -> None:  # quiet: the command prints its own one-line log
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self.handle_request()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET  # noqa: N815

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (an unknown method, a malformed request line, headers too long): JSON with the
        Hub's error header, like every other answer, instead of its HTML page."""
        self.close_connection = True
        if code == 501:  # "unsupported method": the client's mistake, a 405 like every other method not offered
            code, message = 405, f"method {str(self.command)[:20]!r} is not allowed"
        text = message or self.responses.get(code, ("error",))[0]
        body = json.dumps({"error": text}).encode()
        self.send_response(code, text)
        for key, value in (("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                           ("X-Error-Message", _header_safe(text)), ("Connection", "close")):
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD" and code >= 200 and code not in (204, 304):
            self.wfile.write(body)

    def handle_request(self) -> None:
        self.body_pending = None  # unknown until Content-Length is read: an error answer closes the connection
        self.hub.requests.append(f"{self.command} {self.path[:300]}")
        try:
            self.body_pending = self._declared_length()
            reply = self.dispatch()
        except HubError as err:
            reply = Reply.json(err.status, {"error": err.message})
            reply.headers.update({"X-Error-Code": err.code, "X-Error-Message": _header_safe(err.message)})
        except DropConnection:
            self.close_connection = True
            return
        except Exception as err:  # noqa: BLE001 - a bug must still get an HTTP answer, not a dropped socket
            reply = Reply.json(500, {"error": f"internal error: {type(err).__name__}"})
        self.send(reply)

    def _declared_length(self) -> int | None:
        """Content-Length as an int (0 if absent); None with Transfer-Encoding (refused when a body is read); a 411
        for anything but 1 to 18 ASCII digits."""
        value = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            return None
        if value is None:
            return 0
        if not re.fullmatch(r"[0-9]{1,18}", value.strip()):
            raise HubError(411, "LengthRequired", f"Content-Length must be 1 to 18 ASCII digits, got {value[:40]!r}")
        return int(value)

    def _body_length(self, limit: int) -> int:
        length = self.body_pending
        if length is None:
            raise HubError(411, "LengthRequired", "a body needs a plain Content-Length (no Transfer-Encoding)")
        if length > limit:
            raise HubError(413, "PayloadTooLarge", f"the body has {length} bytes; at most {limit} are accepted")
        return length

    def read_body(self, limit: int) -> bytes:
        length = self._body_length(limit)
        try:
            data = self.rfile.read(length)
        except OSError:  # timed out or reset: there is nobody to answer
            raise DropConnection from None
        self.body_pending = 0
        if len(data) != length:
            raise DropConnection
        return data

    def save_body(self, limit: int, path: Path) -> dict[str, str]:
        """Stream the body into ``path`` in pieces (memory: one piece); returns its sha256 and md5."""
        remaining = self._body_length(limit)

        class Body:  # the request body as a file of ``remaining`` bytes, for _copy_hashed
            def __init__(self, handler: HubRequestHandler) -> None:
                self.handler = handler

            def __enter__(self) -> Body:
                return self

            def __exit__(self, *exc: Any) -> None:
                return None

            def read(self, size: int) -> bytes:
                nonlocal remaining
                try:
                    chunk = self.handler.rfile.read(min(size, remaining)) if remaining else b""
                except OSError:
                    raise DropConnection from None
                if remaining and not chunk:
                    raise DropConnection  # the client went away midway
                remaining -= len(chunk)
                return chunk

        with open(path, "wb") as out:
            digests = _copy_hashed([Body(self)], out)
        self.body_pending = 0
        return digests

    def dispatch(self) -> Reply:
        split = urlsplit(self.path)
        try:
            handler, params = self.routes.match(self.command, split.path)
        except UnicodeDecodeError:
            raise bad_request("the path is not valid percent-encoded UTF-8") from None
        given = self.headers.get("Authorization", "")
        request = Request(self.command, split.path, params, parse_qs(split.query), self.headers,
                          hmac.compare_digest(given.encode(), f"Bearer {self.hub.token}".encode()), self.read_body,
                          self.save_body)
        return handler(request)

    def send(self, reply: Reply) -> None:
        if self.body_pending != 0:  # the body was not read: it must not be taken for the next request
            self.close_connection = True
            reply.headers["Connection"] = "close"
        length = reply.file[2] if reply.file else len(reply.body)
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(length))
        for key, value in reply.headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command == "HEAD":
            return
        if reply.file is None:
            self.wfile.write(reply.body)
            return
        path, first, remaining = reply.file
        with open(path, "rb") as fh:
            fh.seek(first)
            while remaining > 0:
                chunk = fh.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)


def _make_handler(hub: LocalHub, timeout: float) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (HubRequestHandler,), dict(hub=hub, routes=Routes(hub), idle_timeout=timeout))


def _header_safe(text: str) -> str:
    return text.encode("ascii", "replace").decode().replace("\r", " ").replace("\n", " ")[:500]


def serve(data_dir: str | Path, port: int, token: str | None = None, host: str = "127.0.0.1",
          upload_mode: str = "auto") -> None:
    """Run the endpoint in the foreground until interrupted (``python -m lab hub serve``)."""
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
        hub.clean_uploads()  # only what this server's unfinished uploads left
