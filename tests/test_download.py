"""scripts/download.py's fetching (`taser.pipeline.download`), against fixture files served on the
loopback by a server that honours Range requests and can cut a response short: a cut download
resumes from its bytes; a wrong checksum is refused and the file removed; a checksum unknown to the
publisher is recorded at the first download and checked after; a gzip file is unpacked; a table's
missing data is named with the command that fetches it."""

import gzip
import hashlib
import http.server
import json
import threading
import time

import pytest

from taser.data.resources import Resource
from taser.pipeline.download import PART, ChecksumMismatch, RecordedChecksums, ResumingDownloader, fetch

STALL_S = 2.0  # a stalling server's delay: four times the timeout its test sets
PAYLOAD = b"".join(f"{i}\t{hashlib.sha1(str(i).encode()).hexdigest()} passage {i}\tTitle {i % 7}\n".encode() for i in range(20_000))  # ~1.3 MB


class _Handler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    cut_after: dict[str, int] = {}  # path -> bytes sent before the connection is dropped (once)
    ranges: list[str | None] = []
    if_ranges: list[str | None] = []
    # path -> how the server departs from a plain one: "ignores-ranges" (200 and the whole file to a Range request),
    # "restarts-at-0" (206 from byte 0 whatever was asked), "last-modified" (a Last-Modified validator, no ETag),
    # "no-validator" (neither), "no-length" (no Content-Length), "bare-416" (416 without Content-Range), "stalls"
    modes: dict[str, set[str]] = {}

    def _validator(self, body: bytes) -> tuple[str, str] | None:
        modes = self.modes.get(self.path, set())
        if "no-validator" in modes:
            return None
        if "last-modified" in modes:
            return "Last-Modified", f"Mon, 0{len(body) % 9 + 1} Dec 2026 10:00:00 GMT"
        return "ETag", f'"{hashlib.sha1(body).hexdigest()}"'

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.startswith("/moved"):  # /moved/<path>: a redirect to <path>
            self.send_response(302)
            self.send_header("Location", self.path.removeprefix("/moved"))
            self.end_headers()
            return
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        modes = self.modes.get(self.path, set())
        if "stalls" in modes:
            time.sleep(STALL_S)
        wanted = self.headers.get("Range")
        self.ranges.append(wanted)
        self.if_ranges.append(self.headers.get("If-Range"))
        validator = self._validator(body)
        if self.headers.get("If-Range") is not None and (validator is None or self.headers["If-Range"] != validator[1]):
            wanted = None  # the file changed since the part was fetched: the whole new file (RFC 9110, If-Range)
        if "ignores-ranges" in modes:
            wanted = None
        start = int(wanted.removeprefix("bytes=").split("-")[0]) if wanted else 0
        if start >= len(body) and wanted:
            self.send_response(416)
            if "bare-416" not in modes:
                self.send_header("Content-Range", f"bytes */{len(body)}")
            self.end_headers()
            return
        if "restarts-at-0" in modes:
            start = 0
        self.send_response(206 if wanted else 200)
        if "no-length" not in modes:
            self.send_header("Content-Length", str(len(body) - start))
        if validator is not None:
            self.send_header(*validator)
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()
        cut = self.cut_after.pop(self.path, None)
        self.wfile.write(body[start:cut] if cut is not None else body[start:])

    def do_HEAD(self):  # noqa: N802
        moved = self.path.startswith("/moved")  # /moved/<path>: a redirect to <path>
        if "stalls" in self.modes.get(self.path, set()):
            time.sleep(STALL_S)
        if moved or self.path in self.files:
            self.send_response(302 if moved else 200)
            if moved:
                self.send_header("Location", self.path.removeprefix("/moved"))
            self.end_headers()
        else:
            self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Handler.files, _Handler.cut_after, _Handler.ranges, _Handler.if_ranges, _Handler.modes = {}, {}, [], [], {}
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", _Handler
    httpd.shutdown()
    httpd.server_close()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_cut_download_resumes_from_its_bytes(server, tmp_path):
    base, handler = server
    handler.files["/psgs.tsv.gz"] = packed = gzip.compress(PAYLOAD)
    handler.cut_after["/psgs.tsv.gz"] = len(packed) // 3
    res = Resource("data.wikipedia_split.tiny", f"{base}/psgs.tsv.gz", ".tsv", gzip=True, sha256=sha256(packed))
    with pytest.raises(Exception):  # noqa: B017 (the connection drops: requests' error, whichever it is)
        fetch(res, tmp_path, show_progress=False)
    final = res.path(tmp_path)
    part = final.parent / ("psgs.tsv.gz" + PART)
    assert not final.exists() and part.is_file() and 0 < part.stat().st_size < len(packed)  # nothing under the final name
    kept = part.stat().st_size
    assert fetch(res, tmp_path, show_progress=False) == final == tmp_path / "data" / "wikipedia_split" / "tiny.tsv"
    assert final.read_bytes() == PAYLOAD and handler.ranges[-1] == f"bytes={kept}-"  # asked only for the rest
    assert not part.exists() and not (final.parent / "psgs.tsv.gz").exists()  # the archive is gone once unpacked
    requests_before = len(handler.ranges)
    fetch(res, tmp_path, show_progress=False)
    assert len(handler.ranges) == requests_before  # present: nothing fetched


def test_a_wrong_checksum_is_refused_and_the_file_removed(server, tmp_path):
    base, handler = server
    handler.files["/nq-test.qa.csv"] = b"who?\t['me']\n"
    res = Resource("data.retriever.qas.tiny", f"{base}/nq-test.qa.csv", ".csv", sha256="0" * 64)
    with pytest.raises(ChecksumMismatch, match="does not have the SHA-256 published"):
        fetch(res, tmp_path, show_progress=False)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))  # no file left, partial or whole


def test_an_unpublished_checksum_is_recorded_then_checked(server, tmp_path, caplog):
    base, handler = server
    handler.files["/train.json"] = first = json.dumps([{"question": "q"}]).encode()
    res = Resource("data.retriever.tiny-train", f"{base}/train.json", ".json")
    with caplog.at_level("INFO", logger="taser.pipeline.download"):
        path = fetch(res, tmp_path, show_progress=False)
        assert path.read_bytes() == first and RecordedChecksums(tmp_path).get(res) == sha256(first)
        assert fetch(res, tmp_path, show_progress=False) == path  # present: not fetched again
    ledger = tmp_path / "checksums.json"
    assert [r.getMessage() for r in caplog.records if r.name == "taser.pipeline.download"] == [
        f"{res.name}: SHA-256 {sha256(first)} recorded in {ledger} (checked at every later download)",
        f"{res.name}: {path}", f"{res.name}: present at {path}"]  # what was recorded where, and what was found
    path.unlink()
    handler.files["/train.json"] = b"[]"  # the publisher's file changed under the same address
    with pytest.raises(ChecksumMismatch) as refused:
        fetch(res, tmp_path, show_progress=False)
    assert str(refused.value) == (f"{res.name}: the file downloaded from {res.url} does not have the SHA-256 recorded at its first download in "
                                  f"{ledger} ({sha256(first)}); it was removed. If the publisher changed the file on purpose, remove its "
                                  f"entry from {ledger} and download it again")
    assert not path.exists()


def test_a_tables_missing_data_names_the_download_command(tmp_path):
    from hydra import compose, initialize_config_dir

    from taser.cli import CONFIG_DIR, typed
    from taser.pipeline.rows import MissingData, RowRun

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("experiment", overrides=["table=dpr_nq", "row=dpr", f"table.data.data_dir={tmp_path}", "out_dir=/tmp/unused"])
    job = typed(cfg)
    with pytest.raises(MissingData) as error:
        RowRun(job).data()
    message = str(error.value)
    assert "taser-download" in message and "resource=data.retriever.nq-train" in message and str(tmp_path) in message
    from importlib.metadata import entry_points

    assert "taser-download" in {ep.name for ep in entry_points(group="console_scripts")}  # the command named is installed


def test_download_settings_refuse_unknown_names():
    from taser.pipeline.jobs import DownloadJob

    with pytest.raises(ValueError, match="unknown resource 'data.retriever.nq-trian'; known: data.wikipedia_split.psgs_w100"):
        DownloadJob(resource="data.retriever.nq-trian")
    assert DownloadJob(resource="data.retriever.nq-train").names() == ["data.retriever.nq-train"]
    table = {"name": "t", "data": {"resources": ["data.retriever.nq-train", "data.retriever.qas.nq-test"]}}
    assert DownloadJob(resource="data.retriever.nq-train", table=table).names() == ["data.retriever.nq-train", "data.retriever.qas.nq-test"]
    with pytest.raises(ValueError, match="name what to fetch"):
        DownloadJob()


def test_download_script_fetches_a_tables_resources(tmp_path):
    """The documented command: `table=<name>` composes the table's config and lists what it needs."""
    import subprocess
    import sys

    from conftest import ROOT

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "download.py"), "table=squad_cpu", f"data_dir={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "table squad_cpu names no resources to fetch" in done.stdout
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "download.py"), "table=dpr_nqx"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Could not find 'table/dpr_nqx'" in done.stderr


# -- issue 46: an error page, a cut unpack and a part that does not fit are never taken as the file --
def test_an_error_page_is_not_saved_as_the_file_nor_its_checksum_recorded(server, tmp_path):
    """Would catch a download without `raise_for_status`: the server's 404 page would be saved as
    the data file and its SHA-256 recorded as the file's."""
    import requests

    base, handler = server
    res = Resource("data.retriever.tiny-missing", f"{base}/missing.json", ".json")
    with pytest.raises(requests.HTTPError, match="404"):
        fetch(res, tmp_path, show_progress=False)
    assert not res.path(tmp_path).exists() and RecordedChecksums(tmp_path).get(res) is None
    assert not any(p.is_file() for p in tmp_path.rglob("*"))  # no part, no checksums.json
    handler.files["/missing.json"] = b"[]"  # published after all: fetched, and its own checksum recorded
    assert fetch(res, tmp_path, show_progress=False).read_bytes() == b"[]" and RecordedChecksums(tmp_path).get(res) == sha256(b"[]")


def test_a_cut_unpack_leaves_nothing_under_the_final_name_and_a_rerun_unpacks_it_whole(server, tmp_path, monkeypatch):
    """Would catch a gzip file unpacked straight into its final name: a kill mid-unpack would leave a
    truncated file there, which the next run takes as present."""
    import taser.pipeline.download as download

    base, handler = server
    handler.files["/psgs.tsv.gz"] = packed = gzip.compress(PAYLOAD)
    res = Resource("data.wikipedia_split.tiny", f"{base}/psgs.tsv.gz", ".tsv", gzip=True, sha256=sha256(packed))
    real_open = gzip.open

    class Killed(Exception):
        pass

    class CutReader:  # the decompressor's reads, killed after a third of the file
        def __init__(self, *args, **kwargs):
            self.inner, self.given = real_open(*args, **kwargs), 0

        def read(self, size=-1):
            if self.given > len(PAYLOAD) // 3:
                raise Killed("killed mid-unpack")
            block = self.inner.read(size)
            self.given += len(block)
            return block

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.inner.close()
            return False

    monkeypatch.setattr(download.gzip, "open", CutReader)
    final = res.path(tmp_path)
    with pytest.raises(Killed):
        fetch(res, tmp_path, show_progress=False)
    assert not final.exists()  # nothing under the final name
    monkeypatch.undo()
    requests_before = len(handler.ranges)
    assert fetch(res, tmp_path, show_progress=False) == final and final.read_bytes() == PAYLOAD
    assert len(handler.ranges) == requests_before  # the downloaded archive was kept and checked, not fetched again
    assert not list(final.parent.glob("*.unpacking")) and not (final.parent / "psgs.tsv.gz").exists()


@pytest.mark.parametrize("published", [True, False])
def test_a_part_larger_than_the_servers_file_is_downloaded_again(server, tmp_path, published):
    """Would catch any 416 taking the partial file as whole: a part of another size than the server's
    file (here larger: an older, longer version) is answered 416, and must be fetched again, not kept
    (refused by a published checksum, or worse, recorded as the file's when none is published)."""
    base, handler = server
    handler.files["/train.json"] = body = json.dumps([{"question": f"q{i}"} for i in range(200)]).encode()
    res = Resource("data.retriever.tiny-train", f"{base}/train.json", ".json", sha256=sha256(body) if published else None)
    final = res.path(tmp_path)
    final.parent.mkdir(parents=True)
    part = final.parent / ("train.json" + PART)
    part.write_bytes(body + b" an older, longer version")
    assert fetch(res, tmp_path, show_progress=False).read_bytes() == body
    assert handler.ranges == [f"bytes={len(body) + 25}-", None]  # answered 416, then fetched whole
    assert not part.exists()
    if not published:
        assert RecordedChecksums(tmp_path).get(res) == sha256(body)


def test_pooch_s_availability_check_follows_redirects_to_the_file(server, tmp_path):
    """Would catch the HEAD request asked of another URL or not following redirects: a file that is
    there (directly or behind a redirect) is available; one behind a redirect to nothing is not."""
    url, handler = server
    handler.files["/a.tsv"] = b"x"
    check = ResumingDownloader(show_progress=False)
    assert check(f"{url}/a.tsv", tmp_path / "a.tsv", check_only=True) is True
    assert check(f"{url}/moved/a.tsv", tmp_path / "a.tsv", check_only=True) is True
    assert check(f"{url}/moved/missing.tsv", tmp_path / "m.tsv", check_only=True) is False
    assert check(f"{url}/missing.tsv", tmp_path / "m.tsv", check_only=True) is False
    assert not list(tmp_path.iterdir())  # a check downloads nothing


def test_two_downloads_recording_checksums_at_once_keep_both(tmp_path):
    """Would catch a ledger written from what it read at its start: two downloads that read an empty
    ledger and record one after the other both stay recorded, and a recorded URL that changed is
    not taken as the new one's checksum."""
    first, second = RecordedChecksums(tmp_path), RecordedChecksums(tmp_path)
    a, b = Resource("a", "http://h/a.tsv", ".tsv"), Resource("b", "http://h/b.tsv", ".tsv")
    first.record(a, "1" * 64)
    second.record(b, "2" * 64)
    assert json.loads((tmp_path / "checksums.json").read_text()) == {"a": {"url": a.url, "sha256": "1" * 64},
                                                                     "b": {"url": b.url, "sha256": "2" * 64}}
    ledger = RecordedChecksums(tmp_path)
    assert ledger.get(a) == "1" * 64 and ledger.get(Resource("a", "http://h/a2.tsv", ".tsv")) is None
    first.record(a, "3" * 64)  # first's own entry is the newer one; b's is kept from the file
    assert RecordedChecksums(tmp_path).values == {"a": {"url": a.url, "sha256": "3" * 64}, "b": {"url": b.url, "sha256": "2" * 64}}


# -- issue 46, mutation testing: what the downloader does with each answer a real server may give --
def _download_log(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "taser.pipeline.download"]


def _cut(handler, path: str, body: bytes, res: Resource, tmp_path) -> int:
    """A first download of `path` cut after a third of `body`; returns the bytes kept in its part."""
    handler.files[path], handler.cut_after[path] = body, len(body) // 3
    with pytest.raises(Exception):  # noqa: B017 (the connection drops: requests' error, whichever it is)
        fetch(res, tmp_path, show_progress=False)
    return (res.path(tmp_path).parent / (path.rsplit("/", 1)[-1] + PART)).stat().st_size


def test_a_resume_asks_for_the_rest_under_the_parts_validator_and_says_where_it_continues(server, tmp_path, caplog):
    """Would catch a resume without If-Range, or with another value than the ETag the part came with
    (a file changed between the two runs would be spliced), and a wrong "continuing" line."""
    base, handler = server
    res = Resource("data.retriever.tiny-train", f"{base}/train.json", ".json")
    kept = _cut(handler, "/train.json", PAYLOAD, res, tmp_path)
    with caplog.at_level("INFO", logger="taser.pipeline.download"):
        assert fetch(res, tmp_path, show_progress=False).read_bytes() == PAYLOAD
    assert handler.ranges == [None, f"bytes={kept}-"] and handler.if_ranges == [None, f'"{hashlib.sha1(PAYLOAD).hexdigest()}"']
    assert _download_log(caplog)[0] == f"{res.url}: continuing from byte {kept}"
    assert sorted(p.name for p in res.path(tmp_path).parent.iterdir()) == ["tiny-train.json"]  # no part, no validator left


@pytest.mark.parametrize("validator", ["etag", "last-modified", "no-validator"])
def test_a_file_changed_since_the_cut_is_fetched_whole_not_spliced(server, tmp_path, validator):
    """Would catch the part's validator (ETag, else Last-Modified) not kept or not sent: the server
    would send the new file's rest after the old file's start. Without any validator the splice
    cannot be seen by HTTP alone: the part is resumed, and the file has no part or validator left."""
    base, handler = server
    if validator != "etag":
        handler.modes["/train.json"] = {validator}
    res = Resource("data.retriever.tiny-train", f"{base}/train.json", ".json")
    kept = _cut(handler, "/train.json", PAYLOAD, res, tmp_path)
    handler.files["/train.json"] = changed = PAYLOAD.replace(b"passage", b"Passage") + b"0\tmore\tTitle\n"  # republished
    got = fetch(res, tmp_path, show_progress=False).read_bytes()
    if validator == "no-validator":
        assert handler.if_ranges[-1] is None and got == PAYLOAD[:kept] + changed[kept:]  # what HTTP without validators gives
    else:
        assert handler.if_ranges[-1] is not None and got == changed and handler.ranges[-1] == f"bytes={kept}-"
    assert sorted(p.name for p in res.path(tmp_path).parent.iterdir()) == ["tiny-train.json"]


@pytest.mark.parametrize("mode", ["ignores-ranges", "restarts-at-0"])
def test_a_server_that_sends_the_whole_file_to_a_resume_gives_the_whole_file_once(server, tmp_path, caplog, mode):
    """Would catch the part appended to when the server answers a Range request with the whole file
    (200, or 206 from byte 0): the file would hold its first third twice."""
    base, handler = server
    handler.modes["/psgs.tsv"] = {mode}
    res = Resource("data.wikipedia_split.tiny", f"{base}/psgs.tsv", ".tsv", sha256=sha256(PAYLOAD))
    kept = _cut(handler, "/psgs.tsv", PAYLOAD, res, tmp_path)
    with caplog.at_level("INFO", logger="taser.pipeline.download"):
        assert fetch(res, tmp_path, show_progress=False).read_bytes() == PAYLOAD
    assert handler.ranges[-1] == f"bytes={kept}-"
    assert _download_log(caplog)[0] == (f"{res.url}: the server sends the whole file (it ignores ranges, or it changed); "
                                        "downloading again from the start")


@pytest.mark.parametrize("published", [True, False])
def test_a_part_already_whole_is_kept_without_a_second_download(server, tmp_path, published):
    """Would catch a 416 whose Content-Range says the part is whole (a run killed after the last byte,
    before the rename) fetched again, or such a part not recognised (the header misread)."""
    base, handler = server
    handler.files["/train.json"] = body = json.dumps([{"question": f"q{i}"} for i in range(200)]).encode()
    res = Resource("data.retriever.tiny-train", f"{base}/train.json", ".json", sha256=sha256(body) if published else None)
    final = res.path(tmp_path)
    final.parent.mkdir(parents=True)
    (final.parent / ("train.json" + PART)).write_bytes(body)
    assert fetch(res, tmp_path, show_progress=False).read_bytes() == body
    assert handler.ranges == [f"bytes={len(body)}-"]  # one request, answered 416: nothing sent again


@pytest.mark.parametrize("bare", [False, True])
def test_a_part_that_does_not_fit_says_the_servers_size(server, tmp_path, caplog, bare):
    """Would catch a wrong "does not fit" line: it names the server's size from Content-Range, or "?"
    when the 416 has none (and the part is fetched again either way)."""
    base, handler = server
    handler.files["/train.json"] = body = b"[1, 2, 3]"
    if bare:
        handler.modes["/train.json"] = {"bare-416"}
    res = Resource("data.retriever.tiny-train", f"{base}/train.json", ".json")
    res.path(tmp_path).parent.mkdir(parents=True)
    (res.path(tmp_path).parent / ("train.json" + PART)).write_bytes(body + b" longer")
    with caplog.at_level("INFO", logger="taser.pipeline.download"):
        assert fetch(res, tmp_path, show_progress=False).read_bytes() == body
    size = "?" if bare else str(len(body))
    assert _download_log(caplog)[0] == f"{res.url}: the partial file does not fit the server's ({size} bytes there); downloading again"


def test_a_file_without_content_length_and_one_behind_a_redirect_download(server, tmp_path):
    """Would catch a missing Content-Length read as an error (a chunked or close-delimited answer),
    and a GET that does not follow redirects (GitHub releases, mirrors): the redirect page would be
    saved as the file."""
    base, handler = server
    handler.files["/a.json"], handler.modes["/a.json"] = b'{"a": 1}', {"no-length"}
    handler.files["/b.json"] = b'{"b": 2}'
    assert fetch(Resource("a", f"{base}/a.json", ".json"), tmp_path, show_progress=False).read_bytes() == b'{"a": 1}'
    assert fetch(Resource("b", f"{base}/moved/b.json", ".json"), tmp_path, show_progress=False).read_bytes() == b'{"b": 2}'


def test_a_stalled_server_times_out_in_the_check_and_the_download(server, tmp_path):
    """Would catch a request without the downloader's timeout: a stalled server would hang the run."""
    import requests

    base, handler = server
    handler.files["/slow.json"], handler.modes["/slow.json"] = b"[]", {"stalls"}
    downloader = ResumingDownloader(show_progress=False, timeout=STALL_S / 4)
    with pytest.raises(requests.Timeout):
        downloader(f"{base}/slow.json", tmp_path / "slow.json", check_only=True)
    with pytest.raises(requests.Timeout):
        downloader(f"{base}/slow.json", tmp_path / "slow.json")


def test_the_progress_lines_name_the_file_its_size_and_where_a_resume_starts(server, tmp_path, caplog):
    """Would catch the download's progress (on by default; log lines off a terminal) with a wrong
    name, total, unit or starting point, or shown when turned off."""
    from tqdm import tqdm

    base, handler = server
    res = Resource("data.wikipedia_split.tiny", f"{base}/psgs.tsv", ".tsv")
    with caplog.at_level("INFO", logger="taser.progress"):
        kept = _cut(handler, "/psgs.tsv", PAYLOAD, res, tmp_path)
        assert not [r for r in caplog.records if r.name == "taser.progress"]  # show_progress=False: no lines
        fetch(res, tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "taser.progress"]
    size = tqdm.format_sizeof
    assert lines[0].startswith(f"psgs.tsv: {size(kept)}/{size(len(PAYLOAD))} ({100 * kept / len(PAYLOAD):.0f}%)")  # starts where the part ends
    assert lines[-1].startswith(f"psgs.tsv: {size(len(PAYLOAD))}/{size(len(PAYLOAD))} (100%)") and lines[-1].endswith("B/s]")


def test_fetch_takes_a_resource_by_name(tmp_path):
    """Would catch a name not looked up in the registry (`fetch("data...")` as the scripts call it)."""
    from taser.data.resources import resource

    final = resource("data.retriever.qas.nq-test").path(tmp_path)
    final.parent.mkdir(parents=True)
    final.write_text("who?\t['me']\n")
    assert fetch("data.retriever.qas.nq-test", tmp_path, show_progress=False) == final  # present: nothing fetched


def test_the_ledger_keeps_newer_entries_of_others_and_is_written_for_hand_editing(tmp_path):
    """Would catch a ledger write that puts back this process's stale copy of another entry, a ledger
    under a data_dir not made yet, and a file not sorted and indented (users edit it by hand: the
    checksum refusal tells them to remove an entry)."""
    a, b = Resource("a", "http://h/a.tsv", ".tsv"), Resource("b", "http://h/b.tsv", ".tsv")
    where = tmp_path / "not" / "made"
    early = RecordedChecksums(where)
    early.record(a, "1" * 64)
    late = RecordedChecksums(where)  # reads a = 1...
    early.record(a, "3" * 64)  # ...which another process then changes
    late.record(b, "2" * 64)
    expected = {"a": {"sha256": "3" * 64, "url": a.url}, "b": {"sha256": "2" * 64, "url": b.url}}
    assert (where / "checksums.json").read_text() == json.dumps(expected, indent=2, sort_keys=True)
