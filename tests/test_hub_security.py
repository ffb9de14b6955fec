"""The local Hub endpoint as a hostile client would probe it (all traffic on 127.0.0.1): every id, path, oid,
size and body is checked, every malformed request gets a 4xx with a JSON error, and nothing outside the data
folder is read or written. Each probe reproduces a reported hole (see the security issue)."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import socket
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from lab.local_hub import LocalHub, git_blob_sha1

SECRET = b"a file outside the data folder\n"


@pytest.fixture
def hub(tmp_path):
    (tmp_path / "outside.txt").write_bytes(SECRET)
    server = LocalHub(tmp_path / "data", token="hf_test", timeout=2.0).start()
    yield server
    server.stop()


def request(hub: LocalHub, method: str, path: str, body: bytes | str | None = None, token: bool = True,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", hub.server.server_address[1], timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        data = body.encode() if isinstance(body, str) else body
        sent = {"Authorization": "Bearer hf_test"} if token else {}
        sent.update(headers or {})
        if data is not None and "Content-Length" not in sent:
            sent["Content-Length"] = str(len(data))
        for key, value in sent.items():
            conn.putheader(key, value)
        conn.endheaders()
        if data:
            conn.send(data)
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        conn.close()


def ndjson(*lines: object) -> str:
    return "\n".join(json.dumps(line) for line in lines)


HEADER = {"key": "header", "value": {"summary": "probe"}}


def commit(hub: LocalHub, repo: str, *ops: object) -> tuple[int, dict[str, str], bytes]:
    return request(hub, "POST", f"/api/models/{repo}/commit/main", ndjson(HEADER, *ops),
                   headers={"Content-Type": "application/x-ndjson"})


def upload_lfs(hub: LocalHub, repo: str, data: bytes) -> str:
    """Upload through the batch API and the signed PUT, as huggingface_hub does; returns the oid."""
    oid = hashlib.sha256(data).hexdigest()
    status, _, body = request(hub, "POST", f"/{repo}.git/info/lfs/objects/batch", json.dumps(
        {"operation": "upload", "objects": [{"oid": oid, "size": len(data)}]}))
    assert status == 200, body
    href = json.loads(body)["objects"][0]["actions"]["upload"]["href"]
    status, _, body = request(hub, "PUT", href.removeprefix(hub.url), data, token=False)
    assert status == 200, body
    return oid


def tree_snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def outside(tmp_path: Path) -> dict[str, bytes]:
    return {k: v for k, v in tree_snapshot(tmp_path).items() if not k.startswith("data/")}


@pytest.fixture
def repo(hub):
    hub.create_repo("org/model", private=False)
    assert commit(hub, "org/model", {"key": "file", "value": {"path": "a.txt", "content": base64.b64encode(
        b"0123456789").decode()}})[0] == 200
    return "org/model"


# --- 1. an lfsFile oid is never a path, and only this repo's uploads count ---------------------------------
@pytest.mark.parametrize("oid", ["/etc/hostname", "../../../outside.txt", "../../outside.txt", "A" * 64,
                                 hashlib.sha256(SECRET).hexdigest()])
def test_a_commit_cannot_publish_a_file_that_was_not_uploaded_to_the_repo(hub, repo, oid):
    head = hub.head(repo)
    status, headers, body = commit(hub, repo, {"key": "lfsFile", "value": {
        "path": "leak.bin", "algo": "sha256", "oid": oid, "size": 5}})
    assert status in (400, 422) and "error" in json.loads(body)
    assert hub.head(repo) == head
    assert request(hub, "GET", f"/{repo}/resolve/main/leak.bin", token=False)[0] == 404


def test_another_repos_upload_cannot_be_committed(hub, repo):
    hub.create_repo("org/private", private=True)
    oid = upload_lfs(hub, "org/private", b"private weights")
    status, _, body = commit(hub, repo, {"key": "lfsFile", "value": {"path": "w.bin", "oid": oid, "size": 15}})
    assert status == 422 and b"never uploaded" in body
    # uploading the same content to this repo proves possession; then it may be committed
    assert upload_lfs(hub, repo, b"private weights") == oid
    assert commit(hub, repo, {"key": "lfsFile", "value": {"path": "w.bin", "oid": oid, "size": 15}})[0] == 200


# --- 2. repo ids and paths follow the Hub's rules on every route; nothing outside the data folder ----------
@pytest.mark.parametrize("path", [
    "/api/models/../..", "/api/models/%2E%2E/%2E%2E", "/api/models/org/..", "/api/models/org%2F..%2F../x",
    "/api/models/-org/x", "/api/models/org/x--y", "/api/models/org/x.git", "/api/models/o%00rg/x",
    "/api/models/org/" + "x" * 97, "/api/models/%C3%A9/x", "/api/models/org/%ff",
    "/../../resolve/main/outside.txt", "/org/model/resolve/main/..%2F..%2F..%2Foutside.txt",
    "/org/model/resolve/main/%2Fetc%2Fhostname", "/api/models/org/model/tree/main/..",
])
def test_malformed_ids_and_paths_are_refused_on_reads(hub, repo, tmp_path, path):
    status, headers, body = request(hub, "GET", path)
    assert 400 <= status < 500 and "error" in json.loads(body), (status, body)
    assert SECRET not in body


@pytest.mark.parametrize("repo_id", ["../..", "../../x", "org/..", "./x", "org/x/y", "a b/c", "org/.x", "org/x."])
def test_commits_and_creates_cannot_write_outside_the_data_folder(hub, tmp_path, repo_id):
    before = outside(tmp_path)
    raw = quote(repo_id, safe="/")
    status, _, _ = commit(hub, raw, {"key": "file", "value": {"path": "x", "content": ""}})
    assert 400 <= status < 500
    org, _, name = repo_id.rpartition("/")
    status, _, _ = request(hub, "POST", "/api/repos/create", json.dumps({"name": name, "organization": org}))
    assert status == 400
    assert outside(tmp_path) == before


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/abs", "a\\b", "a\0b", "", "a//b", "a/", ".", "a/./b",
                                  ".git/config", "x" * 5000, "a/" + "b" * 300, "tab\there", None, 5])
def test_commit_paths_that_break_a_download_are_refused(hub, repo, tmp_path, path):
    head, before = hub.head(repo), outside(tmp_path)
    status, _, body = commit(hub, repo, {"key": "file", "value": {"path": path, "content": "eA=="}})
    assert status == 400 and "error" in json.loads(body), body
    assert hub.head(repo) == head and outside(tmp_path) == before


# --- 3. sizes, ranges and base64 ---------------------------------------------------------------------------
@pytest.mark.parametrize("declared", [5, 10**9, -1, "1000", None, True])
def test_a_declared_lfs_size_must_be_the_uploaded_size(hub, repo, declared):
    oid = upload_lfs(hub, repo, b"w" * 1000)
    status, _, _ = commit(hub, repo, {"key": "lfsFile", "value": {"path": "w.bin", "oid": oid, "size": declared}})
    assert status == 400
    assert commit(hub, repo, {"key": "lfsFile", "value": {"path": "w.bin", "oid": oid, "size": 1000}})[0] == 200
    status, headers, body = request(hub, "GET", f"/{repo}/resolve/main/w.bin")
    assert status == 200 and body == b"w" * 1000 and headers["X-Linked-Size"] == "1000"


@pytest.mark.parametrize("header,status,expected", [
    ("bytes=0-999999", 206, b"0123456789"), ("bytes=2-4", 206, b"234"), ("bytes=7-", 206, b"789"),
    ("bytes=-3", 206, b"789"), ("bytes=-50", 206, b"0123456789"), ("bytes=10-", 416, None), ("bytes=5-2", 416, None),
    ("bytes=0-1,4-5", 200, b"0123456789"), ("junk", 200, b"0123456789"),
])
def test_ranges_are_clamped_to_the_file(hub, repo, header, status, expected):
    got, headers, body = request(hub, "GET", f"/{repo}/resolve/main/a.txt", headers={"Range": header})
    assert got == status
    if expected is not None:
        assert body == expected and int(headers["Content-Length"]) == len(expected)


@pytest.mark.parametrize("content", ["not base64!", "eA", "eA==x", 5, None])
def test_bad_base64_commits_nothing(hub, repo, content):
    head = hub.head(repo)
    status, _, _ = commit(hub, repo, {"key": "file", "value": {"path": "b.txt", "content": content}})
    assert status == 400 and hub.head(repo) == head


# --- 4. wrong-shaped JSON, huge bodies, keep-alive, timeouts -----------------------------------------------
MALFORMED_COMMITS = [
    "[1, 2]", '"header"', "{}", '{"key": "header"}', '{"key": "header", "value": "x"}',
    ndjson(HEADER, [1]), ndjson(HEADER, "file"), ndjson(HEADER, {"key": "file"}),
    ndjson(HEADER, {"key": "file", "value": "x"}), ndjson(HEADER, {"key": "lfsFile", "value": {"path": "a"}}),
    ndjson(HEADER, {"key": "lfsFile", "value": {"path": "a", "oid": "0" * 64, "size": None}}),
    ndjson(HEADER, {"key": 5, "value": {}}), ndjson(HEADER, {"key": "chmod", "value": {"path": "a"}}),
    ndjson(HEADER, HEADER), "[" * 100_000 + "]" * 100_000, "{not json", "\xff\xfe", ndjson(HEADER, None),
    ndjson({"key": "header", "value": {"summary": 5}}), ndjson({"key": "header", "value": {"parentCommit": []}}),
]


@pytest.mark.parametrize("body", MALFORMED_COMMITS, ids=range(len(MALFORMED_COMMITS)))
def test_malformed_commit_bodies_get_a_json_4xx(hub, repo, body):
    head = hub.head(repo)
    status, headers, answer = request(hub, "POST", f"/api/models/{repo}/commit/main", body)
    assert 400 <= status < 500 and "error" in json.loads(answer) and headers.get("X-Error-Code")
    assert hub.head(repo) == head


@pytest.mark.parametrize("path,body", [
    ("/api/repos/create", "[]"), ("/api/repos/create", '{"name": 5}'), ("/api/repos/create", '{"name": null}'),
    ("/api/repos/create", '{"name": "x", "private": "yes"}'), ("/api/repos/create", '{"name": "x", "type": 3}'),
    ("/api/models/org/model/preupload/main", '{"files": "x"}'), ("/api/models/org/model/preupload/main", "[]"),
    ("/api/models/org/model/preupload/main", '{"files": [{"path": "a", "size": null}]}'),
    ("/api/models/org/model/preupload/main", '{"files": [{"path": "../a", "size": 1}]}'),
    ("/api/models/org/model/preupload/main", '{"files": [{"path": "a", "size": 1, "sample": "!!"}]}'),
    ("/org/model.git/info/lfs/objects/batch", '{"operation": "upload", "objects": [5]}'),
    ("/org/model.git/info/lfs/objects/batch", '{"operation": "upload", "objects": [{"oid": "x", "size": 1}]}'),
    ("/org/model.git/info/lfs/objects/batch", '{"operation": "upload", "objects": "x"}'),
    ("/org/model.git/info/lfs/objects/batch", '{"operation": "download", "objects": []}'),
    ("/api/validate-yaml", "[]"),
])
def test_malformed_api_bodies_get_a_json_4xx(hub, repo, path, body):
    status, headers, answer = request(hub, "POST", path, body)
    assert 400 <= status < 500 and "error" in json.loads(answer), (status, answer)


def test_unsigned_or_forged_lfs_urls_are_refused(hub, repo):
    oid = hashlib.sha256(b"x").hexdigest()
    for path in (f"/lfs/org/model/put/{oid}", f"/lfs/org/model/put/{oid}?sig=0000", "/lfs/org/model/put/../../x"):
        assert request(hub, "PUT", path, b"x")[0] in (400, 403, 404)
    assert not hub.owns_lfs("org/model", oid)


def test_a_huge_content_length_is_refused_and_the_connection_closed(hub, repo):
    status, headers, body = request(hub, "POST", "/api/repos/create", b"", headers={"Content-Length": str(10**15)})
    assert status == 413 and "error" in json.loads(body) and headers.get("Connection") == "close"
    status, _, _ = request(hub, "POST", "/api/repos/create", b"", headers={"Content-Length": "12abc"})
    assert status == 411


def raw_exchange(hub: LocalHub, data: bytes, wait: float = 1.0) -> bytes:
    with socket.create_connection(("127.0.0.1", hub.server.server_address[1]), timeout=5) as sock:
        sock.sendall(data)
        chunks, deadline = [], time.time() + wait
        while time.time() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_an_unread_body_is_never_parsed_as_the_next_request(hub, repo):
    smuggled = b"GET /api/whoami-v2 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer hf_test\r\n\r\n"
    # refused before its body is read (no token): the body must not become a second request
    first = (b"POST /api/repos/create HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled)) + smuggled
    answer = raw_exchange(hub, first, wait=3.0)
    assert answer.startswith(b"HTTP/1.1 401") and b"local-user" not in answer


def test_idle_connections_time_out(hub):
    started = time.time()
    with socket.create_connection(("127.0.0.1", hub.server.server_address[1]), timeout=10) as sock:
        sock.sendall(b"GET /api/whoami-v2 HTTP/1.1\r\nHost: x\r\n")  # then silence, mid-headers
        assert sock.recv(1024) == b""  # closed by the server's 2 s timeout, not held open
    assert 1.5 < time.time() - started < 8


def test_a_body_that_never_arrives_times_out(hub, repo):
    started = time.time()
    with socket.create_connection(("127.0.0.1", hub.server.server_address[1]), timeout=10) as sock:
        sock.sendall(b"POST /api/models/org/model/commit/main HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer hf_test"
                     b"\r\nContent-Length: 100\r\n\r\n{")
        assert sock.recv(1024) == b""
    assert time.time() - started < 8


# --- 5. and nothing at all is written outside the data folder by any probe above ---------------------------
def test_the_server_only_writes_inside_its_data_folder(hub, repo, tmp_path):
    before = outside(tmp_path)
    for body in MALFORMED_COMMITS:
        request(hub, "POST", f"/api/models/{repo}/commit/main", body)
    commit(hub, "..%2F..", {"key": "file", "value": {"path": "../../pwned", "content": "eA=="}})
    assert outside(tmp_path) == before and not any("pwned" in p for p in tree_snapshot(tmp_path))
    assert os.listdir(tmp_path) == ["outside.txt", "data"] or set(os.listdir(tmp_path)) == {"outside.txt", "data"}
    assert git_blob_sha1(b"0123456789") in os.listdir(hub.data_dir / "objects" / "regular")
