"""The local Hub's uploads and limits, attacked (issue: reliability round 2, Medium 8-10 and the Hub Low items):
uploads stream to disk, `--private` is honoured for new and existing repos through the real client, the server
cleans only the uploads it started, and malformed numbers, huge batches, unknown methods and floods get a JSON 4xx
with bounded memory."""

from __future__ import annotations

import hashlib
import json
import os
import tracemalloc

import pytest
from test_hub import client, tiny_checkpoint
from test_hub_security import raw_exchange, request

from lab.local_hub import ACCESS_LOG_LENGTH, LocalHub

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` (CI) runs them


@pytest.fixture
def hub(tmp_path):
    server = LocalHub(tmp_path / "data", token="hf_test", timeout=5.0, multipart_threshold=4 * 2**20,
                      chunk_size=4 * 2**20).start()
    yield server
    server.stop()


def batch(hub: LocalHub, repo: str, objects: list[dict]) -> tuple[int, dict]:
    status, _, body = request(hub, "POST", f"/{repo}.git/info/lfs/objects/batch",
                              json.dumps({"operation": "upload", "objects": objects}))
    return status, json.loads(body)


def test_an_upload_streams_to_disk(hub):
    """A 48 MB object (one PUT, then as 12 parts) costs the server a few read buffers, not the object twice."""
    hub.create_repo("org/big", private=False)
    data, other = os.urandom(48 * 2**20), os.urandom(48 * 2**20)
    oid, other_oid = hashlib.sha256(data).hexdigest(), hashlib.sha256(other).hexdigest()
    pieces = [other[i * 4 * 2**20: (i + 1) * 4 * 2**20] for i in range(12)]
    hub.multipart_threshold = 64 * 2**20  # first as one PUT
    status, answer = batch(hub, "org/big", [{"oid": oid, "size": len(data)}])
    href = answer["objects"][0]["actions"]["upload"]["href"].removeprefix(hub.url)
    tracemalloc.start()
    try:
        assert request(hub, "PUT", href, data, token=False)[0] == 200
        _, single = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        hub.multipart_threshold = 4 * 2**20  # then as 12 parts
        status, answer = batch(hub, "org/big", [{"oid": other_oid, "size": len(other)}])
        upload = answer["objects"][0]["actions"]["upload"]
        parts = []
        for number, piece in enumerate(pieces, start=1):
            status, headers, _ = request(hub, "PUT", upload["header"][str(number)].removeprefix(hub.url), piece,
                                         token=False)
            parts.append({"partNumber": number, "etag": headers["ETag"]})
        status, _, body = request(hub, "POST", upload["href"].removeprefix(hub.url), json.dumps({"parts": parts}),
                                  token=False)
        _, multipart = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 200, body
    assert hub.owns_lfs("org/big", oid) and hub.owns_lfs("org/big", other_oid)
    assert (hub.data_dir / "objects" / "lfs" / other_oid).read_bytes() == other
    # the client's own request copies count here too: far below the 96 MB that two copies of the body were
    assert single < 24 * 2**20 and multipart < 24 * 2**20, (single / 2**20, multipart / 2**20)
    assert not [p for p in (hub.data_dir / "uploads").iterdir()]  # parts removed once joined


def test_private_is_honoured_for_new_and_existing_repos(tmp_path):
    hub = LocalHub(tmp_path / "data").start()
    try:
        folder = tiny_checkpoint(tmp_path / "ckpt")
        done = client(hub, tmp_path, f"""
            from huggingface_hub import HfApi
            from pape_hub_cli import main
            HfApi().create_repo("org/existing")  # public
            assert main(["push", "{folder}", "--repo-id", "org/existing", "--private"]) == 0
            assert main(["push", "{folder}", "--repo-id", "org/fresh", "--private"]) == 0
        """)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "org/existing existed as a public repository; made it private" in done.stderr
        for repo in ("org/existing", "org/fresh"):
            assert hub.repo_meta(repo)["private"] is True
            assert request_anonymous(hub, f"/api/models/{repo}") == 401
    finally:
        hub.stop()


def request_anonymous(hub: LocalHub, path: str) -> int:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{hub.url}{path}")
    except urllib.error.HTTPError as err:
        return err.code
    return 200


def test_stopping_cleans_only_the_uploads_this_server_started(tmp_path):
    (tmp_path / "data" / "uploads").mkdir(parents=True)
    (tmp_path / "data" / "uploads" / "mine.txt").write_text("the user's")
    hub = LocalHub(tmp_path / "data", token="hf_test", multipart_threshold=2**20, chunk_size=2**20).start()
    hub.create_repo("org/m", private=False)
    data = os.urandom(3 * 2**20)
    oid = hashlib.sha256(data).hexdigest()
    status, answer = batch(hub, "org/m", [{"oid": oid, "size": len(data)}])
    part = answer["objects"][0]["actions"]["upload"]["header"]["1"].removeprefix(hub.url)
    assert request(hub, "PUT", part, data[: 2**20], token=False)[0] == 200  # then abandoned
    assert len(list((tmp_path / "data" / "uploads").iterdir())) == 2
    hub.stop()
    assert [p.name for p in (tmp_path / "data" / "uploads").iterdir()] == ["mine.txt"]
    fresh = LocalHub(tmp_path / "fresh").start()
    fresh.stop()
    assert not (tmp_path / "fresh" / "uploads").exists()  # made by the server, empty: removed


@pytest.mark.parametrize("length", ["\u00b2", "9" * 5000, "12abc", "-1", "+5"])
def test_malformed_content_lengths_get_a_json_4xx(hub, length):
    hub.create_repo("org/m", private=False)
    answer = raw_exchange(hub, b"POST /api/repos/create HTTP/1.1\r\nHost: x\r\nContent-Length: "
                          + length.encode() + b"\r\n\r\n", wait=2.0)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 411") and "error" in json.loads(body), answer[:300]


def test_a_range_of_absurd_length_is_ignored_not_a_500(hub):
    hub.create_repo("org/m", private=False)
    from test_hub_security import commit

    assert commit(hub, "org/m", {"key": "file", "value": {"path": "a.txt", "content": "MDEyMw=="}})[0] == 200
    status, _, body = request(hub, "GET", "/org/m/resolve/main/a.txt", headers={"Range": "bytes=" + "9" * 5000 + "-"})
    assert status == 200 and body == b"0123"


def test_huge_lfs_batches_are_refused_with_a_small_answer(hub):
    hub.create_repo("org/m", private=False)
    objects = [{"oid": f"{i:064x}", "size": 10} for i in range(10_000)]
    status, answer = batch(hub, "org/m", objects)
    assert status == 400 and "at most 1000 objects" in answer["error"]
    status, answer = batch(hub, "org/m", [{"oid": "a" * 64, "size": 10**12}])  # 250,000 parts of 4 MB
    assert status == 400 and "more than 10000 upload parts" in answer["error"]


@pytest.mark.parametrize("method", ["OPTIONS", "TRACE", "FOO"])
def test_every_method_gets_a_json_answer(hub, method):
    status, headers, body = request(hub, method, "/api/whoami-v2")
    assert 400 <= status < 500 and "json" in headers["Content-Type"] and "error" in json.loads(body)


def test_the_access_log_is_bounded(hub):
    for _ in range(ACCESS_LOG_LENGTH + 50):
        request(hub, "GET", "/api/whoami-v2")
    assert len(hub.requests) == ACCESS_LOG_LENGTH


def test_push_never_follows_a_link_out_of_the_folder(hub, tmp_path):
    """A link the checkpoint did not write is not sent; one named by --include is refused before any upload. One
    client makes both pushes, and checks through the Hub's API between them that the refused one made no repo."""
    folder = tiny_checkpoint(tmp_path / "ckpt")
    (tmp_path / "secret.json").write_text('{"private": "data"}')
    os.symlink(tmp_path / "secret.json", folder / "results.json")
    done = client(hub, tmp_path, f"""
        import sys
        from huggingface_hub import HfApi
        from pape_hub_cli import main
        print("refused push exits", main(["push", "{folder}", "--repo-id", "org/linked", "--include", "results.json"]),
              "and leaves a repo:", HfApi().repo_exists("org/linked"), file=sys.stderr)
        sys.exit(main(["push", "{folder}", "--repo-id", "org/linked"]))
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "is a link or lies outside" in done.stderr, done.stderr[-2000:]
    assert "refused push exits 1 and leaves a repo: False" in done.stderr, done.stderr[-2000:]
    assert hub.repo_exists("org/linked"), done.stderr[-2000:]
    assert "results.json" not in hub.files("org/linked"), done.stderr[-2000:]
