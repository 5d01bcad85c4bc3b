"""download: real HTTP against a loopback server that injects the faults of the internet."""

from __future__ import annotations

import hashlib
import os

import pytest

from xylent.tasks.download import fetch, opus_list_pairs
from xylent.errors import XylentError

BODY = os.urandom(300_000)


def _fetch(url, tmp_path, **kw):
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("chunk_bytes", 8192)
    return fetch(url, tmp_path / "x.part", **kw)


def test_plain_download_verifies_checksum(http_corpus, tmp_path):
    http_corpus.files["/a.bin"] = BODY
    rec = _fetch(http_corpus.base + "/a.bin", tmp_path, sha256=hashlib.sha256(BODY).hexdigest(), size=len(BODY))
    assert (tmp_path / "x.part").read_bytes() == BODY
    assert rec["bytes"] == len(BODY) and rec["sha256"] == hashlib.sha256(BODY).hexdigest()
    assert rec["etag"] == '"' + hashlib.md5(BODY).hexdigest() + '"', "the server's ETag, kept to resume safely"
    assert rec["truncated"] is False and rec["url"] == http_corpus.base + "/a.bin"
    assert http_corpus.count("/a.bin") == 1


def test_connection_dropped_mid_body_resumes_with_range(http_corpus, tmp_path):
    http_corpus.files["/a.bin"] = BODY
    http_corpus.drop_after["/a.bin"] = 100_000
    rec = _fetch(http_corpus.base + "/a.bin", tmp_path, sha256=hashlib.sha256(BODY).hexdigest())
    assert (tmp_path / "x.part").read_bytes() == BODY
    assert rec["bytes"] == len(BODY)
    ranges = [h.get("Range") for p, h in http_corpus.requests if p == "/a.bin"]
    assert ranges[0] is None
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 100_000, "the second request must resume, not start over"
    assert http_corpus.count("/a.bin") == 2


def test_partial_file_from_an_earlier_run_is_resumed(http_corpus, tmp_path):
    http_corpus.files["/a.bin"] = BODY
    (tmp_path / "x.part").write_bytes(BODY[:123_456])
    _fetch(http_corpus.base + "/a.bin", tmp_path)
    assert (tmp_path / "x.part").read_bytes() == BODY
    assert [h.get("Range") for _, h in http_corpus.requests] == ["bytes=123456-"]


def test_server_error_then_success_is_retried_with_backoff(http_corpus, tmp_path):
    http_corpus.files["/a.bin"] = BODY
    http_corpus.fail_first["/a.bin"] = 2
    rec = _fetch(http_corpus.base + "/a.bin", tmp_path, retries=3)
    assert rec["bytes"] == len(BODY) and http_corpus.count("/a.bin") == 3
    assert (tmp_path / "x.part").read_bytes() == BODY, "the error pages are not part of the file"
    assert rec["sha256"] == hashlib.sha256(BODY).hexdigest()


def test_persistent_server_error_gives_up_with_a_clear_error(http_corpus, tmp_path):
    http_corpus.files["/a.bin"] = BODY
    http_corpus.fail_first["/a.bin"] = 10
    with pytest.raises(XylentError) as err:
        _fetch(http_corpus.base + "/a.bin", tmp_path, retries=2)
    assert "after 3 attempts" in str(err.value) and "/a.bin" in str(err.value)
    assert http_corpus.count("/a.bin") == 3


def test_404_is_not_retried_and_names_the_url(http_corpus, tmp_path):
    with pytest.raises(XylentError) as err:
        _fetch(http_corpus.base + "/missing.txt.xz", tmp_path, retries=5)
    msg = str(err.value)
    assert "404" in msg and "/missing.txt.xz" in msg and "what to do" in msg
    assert http_corpus.count("/missing.txt.xz") == 1


def test_wrong_checksum_discards_the_file(http_corpus, tmp_path):
    http_corpus.files["/a.bin"] = BODY
    with pytest.raises(XylentError) as err:
        _fetch(http_corpus.base + "/a.bin", tmp_path, sha256="0" * 64)
    assert "checksum mismatch" in str(err.value)
    assert not (tmp_path / "x.part").exists(), "a file that failed its checksum must not be kept"


def test_wrong_size_discards_the_file(http_corpus, tmp_path):
    http_corpus.files["/a.bin"] = BODY
    with pytest.raises(XylentError, match="size mismatch"):
        _fetch(http_corpus.base + "/a.bin", tmp_path, size=len(BODY) + 1)
    assert not (tmp_path / "x.part").exists()


def test_max_bytes_fetches_a_prefix(http_corpus, tmp_path):
    http_corpus.files["/a.bin"] = BODY
    rec = _fetch(http_corpus.base + "/a.bin", tmp_path, max_bytes=5000)
    assert (tmp_path / "x.part").read_bytes() == BODY[:5000]
    assert rec["truncated"] is True
    assert http_corpus.requests[0][1]["Range"] == "bytes=0-4999"


def test_file_url(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(BODY)
    rec = fetch(src.as_uri(), tmp_path / "y.part")
    assert (tmp_path / "y.part").read_bytes() == BODY and rec["bytes"] == len(BODY)
    assert rec["sha256"] == hashlib.sha256(BODY).hexdigest() and rec["truncated"] is False


def test_missing_file_url_is_a_user_error(tmp_path):
    with pytest.raises(XylentError, match="not found"):
        fetch((tmp_path / "nope").as_uri(), tmp_path / "y.part")


def test_opus_api_listing(http_corpus):
    http_corpus.opus[("CCMatrix", "v1")] = [
        {"source": "en", "target": "sw", "url": "x"},
        {"source": "de", "target": "en", "url": "y"},
    ]
    assert opus_list_pairs(http_corpus.base + "/opusapi/", "CCMatrix", "v1") == ["de-en", "en-sw"]
    with pytest.raises(XylentError, match="no moses files"):
        opus_list_pairs(http_corpus.base + "/opusapi/", "CCMatrix", "v9")


def test_a_server_ignoring_if_range_after_the_file_changed_never_splices_two_files(http_corpus, tmp_path):
    old, new = BODY, bytes(reversed(BODY))
    http_corpus.files["/a.bin"] = old
    http_corpus.drop_after["/a.bin"] = 10_000  # the first attempt is cut short ...
    http_corpus.ignore_if_range.add("/a.bin")

    def change_after_first_request(n):  # ... and the file changes on the server before the resume
        if http_corpus.count("/a.bin") == 1:
            http_corpus.files["/a.bin"] = new

    rec = fetch(http_corpus.base + "/a.bin", tmp_path / "x.part", retries=3, backoff_s=0, chunk_bytes=4096,
                on_bytes=change_after_first_request)
    ranges = [h.get("Range") for p, h in http_corpus.requests]
    kept = int(ranges[1].removeprefix("bytes=").rstrip("-")) if ranges[1] else 0
    assert 0 < kept <= 10_000, "the second request resumed from the bytes kept ..."
    assert ranges[2] is None, "... and the changed ETag sent the third back to byte 0"
    assert (tmp_path / "x.part").read_bytes() == new, "the resumed file must be one version, not a splice"
    assert rec["sha256"] == hashlib.sha256(new).hexdigest()


def test_a_body_gzip_encoded_against_our_request_is_decoded_and_complete(http_corpus, tmp_path):
    http_corpus.files["/a.txt"] = BODY
    http_corpus.gzip.add("/a.txt")
    rec = fetch(http_corpus.base + "/a.txt", tmp_path / "x.part", retries=1, backoff_s=0)
    assert (tmp_path / "x.part").read_bytes() == BODY and rec["bytes"] == len(BODY)


def test_a_body_without_a_length_cut_short_is_resumed_not_taken_as_whole(http_corpus, tmp_path):
    http_corpus.files["/n.bin"] = BODY
    http_corpus.no_length.add("/n.bin")
    http_corpus.drop_after["/n.bin"] = 10_000  # a clean close after 10 kB: nothing in the response says "cut"
    rec = _fetch(http_corpus.base + "/n.bin", tmp_path)
    assert (tmp_path / "x.part").read_bytes() == BODY and rec["length_verified"] is True
    ranges = [h.get("Range") for _, h in http_corpus.requests]
    assert ranges[:2] == [None, "bytes=10000-"], "after the close, we asked whether more follows"
    assert ranges[-1] == f"bytes={len(BODY)}-", "... and, once resumed, that nothing follows the end"


def test_a_body_without_a_length_from_a_server_ignoring_ranges_is_marked_unverified(http_corpus, tmp_path):
    http_corpus.files["/n.bin"] = BODY
    http_corpus.no_length.add("/n.bin")
    http_corpus.ignore_ranges.add("/n.bin")
    rec = _fetch(http_corpus.base + "/n.bin", tmp_path)
    assert (tmp_path / "x.part").read_bytes() == BODY and rec["length_verified"] is False
    rec = _fetch(http_corpus.base + "/n.bin", tmp_path / "again", sha256=hashlib.sha256(BODY).hexdigest())
    assert rec["length_verified"] is True, "a checksum in the spec is the proof the server could not give"
    http_corpus.files["/a.bin"] = BODY
    assert "length_verified" not in _fetch(http_corpus.base + "/a.bin", tmp_path / "sized")


def test_total_timeout_stops_a_trickling_server_and_keeps_its_bytes(http_corpus, tmp_path):
    import time

    http_corpus.files["/slow.bin"] = BODY[:100_000]
    http_corpus.slow["/slow.bin"] = 4000  # 25 s for the file; every read is quick, so timeout_s never fires
    started = time.monotonic()
    with pytest.raises(XylentError, match="total_timeout_s = 1 s") as err:
        _fetch(http_corpus.base + "/slow.bin", tmp_path, timeout_s=5, total_timeout_s=1)
    assert time.monotonic() - started < 4
    assert "resumes" in str(err.value) and 0 < (tmp_path / "x.part").stat().st_size < 100_000


def test_size_caps_stop_an_endless_or_oversized_file_and_a_nearly_full_disk(http_corpus, tmp_path):
    http_corpus.files["/big.bin"] = BODY
    with pytest.raises(XylentError, match="announces 300,000 bytes, more than download.max_file_bytes = 100,000"):
        _fetch(http_corpus.base + "/big.bin", tmp_path, max_file_bytes=100_000)
    assert not (tmp_path / "x.part").exists() or (tmp_path / "x.part").stat().st_size == 0, "refused before a byte"
    http_corpus.files["/endless.bin"] = BODY  # no length: only the bytes themselves can tell
    http_corpus.no_length.add("/endless.bin")
    with pytest.raises(XylentError, match="passed 100,000 bytes, more than download.max_file_bytes") as err:
        _fetch(http_corpus.base + "/endless.bin", tmp_path / "endless", max_file_bytes=100_000)
    assert "max_bytes (below it) to fetch a prefix" in err.value.render()
    local = tmp_path / "local.bin"
    local.write_bytes(BODY)
    with pytest.raises(XylentError, match="announces 300,000 bytes"):  # file:// and fsspec: its size, up front
        _fetch(local.as_uri(), tmp_path / "local", max_file_bytes=100_000)
    assert (tmp_path / "local" / "x.part").stat().st_size == 0
    with pytest.raises(XylentError, match="the disk is nearly full") as err:
        _fetch(http_corpus.base + "/big.bin", tmp_path / "full", min_free_bytes=1 << 60)
    assert "download.min_free_bytes" in str(err.value) and "resumes" in err.value.render()
    from xylent.spec.download import DownloadConfig

    assert DownloadConfig().max_file_bytes == 1 << 38 and DownloadConfig().min_free_bytes == 1 << 30, "on by default"


@pytest.mark.parametrize("mode", ["answer", "body"])
def test_a_silent_server_is_abandoned_after_two_silent_attempts_not_every_retry(http_corpus, tmp_path, mode):
    """A server that accepts and never answers, or sends a length and never the body (issue 64):
    abandoned after download.silent_attempts timeouts, with a message that says so."""
    import time

    http_corpus.files["/quiet.bin"] = BODY  # its length is announced in "body" mode
    http_corpus.silent["/quiet.bin"] = mode
    started = time.monotonic()
    with pytest.raises(XylentError, match="sent nothing for 2 attempts in a row, 0.5 s each") as err:
        _fetch(http_corpus.base + "/quiet.bin", tmp_path, timeout_s=0.5, retries=5)
    assert time.monotonic() - started < 3
    assert http_corpus.count("/quiet.bin") == 2, "not retries + 1 attempts"
    assert "another mirror" in err.value.render()


def test_the_default_timeouts_abandon_a_silent_server_well_under_a_minute():
    from xylent.spec.download import DownloadConfig

    cfg = DownloadConfig()
    worst = cfg.silent_attempts * cfg.timeout_s + sum(cfg.backoff_s * 2 ** k for k in range(cfg.silent_attempts - 1))
    assert worst <= 35, worst


@pytest.mark.parametrize("mode", ["answer", "body"])
def test_a_stop_request_ends_a_read_blocked_on_a_silent_server_at_once(http_corpus, tmp_path, mode):
    """SIGTERM's stop request (``xylent.interrupt``) reaches a download waiting on a server that sends
    nothing: it ends in well under a second, not at the read's timeout."""
    import threading
    import time

    from xylent import interrupt

    http_corpus.files["/quiet.bin"] = BODY  # its length is announced in "body" mode
    http_corpus.silent["/quiet.bin"] = mode
    timer = threading.Timer(0.5, interrupt.request)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            _fetch(http_corpus.base + "/quiet.bin", tmp_path, timeout_s=30)
    finally:
        timer.cancel()
        interrupt.clear()
    assert time.monotonic() - started < 2


def test_an_answer_with_two_different_lengths_is_refused_by_name_not_retried(tmp_path):
    """Issue 64: two Content-Length headers that disagree ended in "internal error (a bug)"."""
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    answered = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                answered.append(1)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello!!")

    threading.Thread(target=serve, daemon=True).start()
    try:
        with pytest.raises(XylentError, match="breaks HTTP: Content-Length contained multiple unmatching values") as err:
            _fetch(f"http://127.0.0.1:{srv.getsockname()[1]}/x.txt", tmp_path)
    finally:
        srv.close()
    assert "another mirror" in err.value.render() and len(answered) == 1, "a broken answer is not retried"


def test_a_gettext_package_that_is_missing_or_a_single_module_is_named_for_what_it_is():
    """Issue 64: a module without catalogs (six.py) was reported "not installed"."""
    from xylent.tasks.download.plan import _catalog_dirs

    with pytest.raises(XylentError, match="'no_such_package_xy' is not installed"):
        _catalog_dirs("no_such_package_xy")
    with pytest.raises(XylentError, match=r"'bisect' is a single Python module .*bisect.py.*, not a package: it ships no "
                                          "gettext catalogs"):
        _catalog_dirs("bisect")  # a module of the standard library, present everywhere
    assert (_catalog_dirs("django") / "conf" / "locale").is_dir()
