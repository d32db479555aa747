"""Fetching a table's data and checkpoints (`taser.data.resources`) into `data_dir`, with a progress
bar, resuming a partial download, verifying a checksum, and never leaving a partial file under the
final name.

Pooch does the fetching and the hashing; its downloader here is requests with a Range request, so
a download that was cut continues from the bytes it has (`<file>.part`, kept between runs). The
checksum is the publisher's where one exists, else the one recorded at the first download
(`<data_dir>/checksums.json`); a file that does not match is removed and the run fails. A gzip
file is unpacked through a temporary file renamed into place, then removed.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
from pathlib import Path

import pooch
import requests

from taser.data.resources import Resource, resource
from taser.io import atomic_open
from taser.progress import progress as progress_bar

log = logging.getLogger(__name__)

CHECKSUMS = "checksums.json"
PART = ".part"
CHUNK = 1 << 16  # bytes written per read: a cut connection loses less than this


class ChecksumMismatch(ValueError):
    """A downloaded file whose SHA-256 is not the one published or recorded (it was removed)."""


class ResumingDownloader:
    """Pooch's downloader protocol: the bytes of `url` into `output_file`, continued from
    `<download name>.part` beside it when a previous run was cut."""

    def __init__(self, show_progress: bool = True, timeout: float = 60.0):
        self.show_progress, self.timeout = show_progress, timeout

    def __call__(self, url: str, output_file, pooch_instance=None, check_only: bool = False):
        if check_only:
            return requests.head(url, timeout=self.timeout, allow_redirects=True).ok
        part = Path(output_file).parent / (url.rsplit("/", 1)[-1] + PART)
        validator = part.with_name(part.name + ".etag")  # the file's version the part belongs to (If-Range)
        have = part.stat().st_size if part.is_file() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        if have and validator.is_file():
            headers["If-Range"] = validator.read_text().strip()
        with requests.get(url, headers=headers, stream=True, timeout=self.timeout, allow_redirects=True) as response:
            whole = response.headers.get("Content-Range", "").rsplit("/", 1)[-1]
            if have and response.status_code == 416 and whole.isdigit() and int(whole) == have:  # the part is already whole
                pass
            else:
                if have and response.status_code == 416:
                    log.info("%s: the partial file does not fit the server's (%s bytes there); downloading again", url, whole or "?")
                    part.unlink()
                    return self(url, output_file, pooch_instance, check_only)
                response.raise_for_status()
                start = response.headers.get("Content-Range", "").removeprefix("bytes ").split("-")[0]
                if have and (response.status_code != 206 or start != str(have)):
                    log.info("%s: the server sends the whole file (it ignores ranges, or it changed); downloading again from the start", url)
                    have = 0
                elif have:
                    log.info("%s: continuing from byte %d", url, have)
                tag = response.headers.get("ETag") or response.headers.get("Last-Modified")
                if tag:
                    validator.write_text(tag)
                total = int(response.headers.get("content-length", 0)) + have
                with open(part, "ab" if have else "wb") as f, progress_bar(total=total or None, initial=have, unit="B", unit_scale=True,
                                                                            desc=url.rsplit("/", 1)[-1], enabled=self.show_progress) as bar:
                    for chunk in response.iter_content(CHUNK):
                        f.write(chunk)
                        bar.update(len(chunk))
        shutil.move(str(part), str(output_file))  # pooch hashes it, then renames it into place
        validator.unlink(missing_ok=True)


class RecordedChecksums:
    """`<data_dir>/checksums.json`: {resource name: {"url", "sha256"}} of the first downloads."""

    def __init__(self, data_dir: str | os.PathLike):
        self.path = Path(data_dir) / CHECKSUMS
        self.values = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def get(self, res: Resource) -> str | None:
        entry = self.values.get(res.name)
        return entry["sha256"] if entry and entry.get("url") == res.url else None

    def record(self, res: Resource, sha256: str) -> None:
        if self.path.is_file():  # another download may have recorded its own since this one read the file
            self.values = {**json.loads(self.path.read_text()), **{k: v for k, v in self.values.items() if k == res.name}}
        self.values[res.name] = {"url": res.url, "sha256": sha256}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(self.path) as f:
            json.dump(self.values, f, indent=2, sort_keys=True)


def _unpack(archive: Path, final: Path) -> None:
    tmp = final.with_name(final.name + ".unpacking")
    with gzip.open(archive, "rb") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, CHUNK)
    tmp.replace(final)


def fetch(res: Resource | str, data_dir: str | os.PathLike, show_progress: bool = True) -> Path:
    """The resource's file under `data_dir` (downloaded, checked and unpacked unless it is there)."""
    res = resource(res) if isinstance(res, str) else res
    final = res.path(data_dir)
    if final.is_file():
        log.info("%s: present at %s", res.name, final)
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    ledger = RecordedChecksums(data_dir)
    known = res.sha256 or ledger.get(res)
    try:
        downloaded = Path(pooch.retrieve(res.url, known_hash=f"sha256:{known}" if known else None, fname=res.download_name, path=final.parent,
                                         downloader=ResumingDownloader(show_progress), progressbar=False))
    except ValueError as e:
        if "hash" not in str(e).lower():
            raise
        raise ChecksumMismatch(f"{res.name}: the file downloaded from {res.url} does not have the SHA-256 "
                               f"{'published' if res.sha256 else 'recorded at its first download in ' + str(ledger.path)} ({known}); "
                               "it was removed. If the publisher changed the file on purpose, remove its entry from "
                               f"{ledger.path} and download it again") from None
    if not known:
        digest = pooch.file_hash(str(downloaded))
        ledger.record(res, digest)
        log.info("%s: SHA-256 %s recorded in %s (checked at every later download)", res.name, digest, ledger.path)
    if res.gzip:
        _unpack(downloaded, final)
        downloaded.unlink()
    elif downloaded != final:
        downloaded.replace(final)
    log.info("%s: %s", res.name, final)
    return final
