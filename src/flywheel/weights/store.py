"""The versioned weight store: content-addressed chunks and one manifest per version, on any fsspec URL.

    store = WeightStore("runs/x/weights")            # or "s3://bucket/run/weights", "memory://w"
    store.list_versions(); store.read_manifest(7); store.get_chunk(chunk_id)

Layout: `chunks/<id[:2]>/<id>` (id = sha256 of the chunk bytes, so a chunk is verified by its name
and identical chunks are stored once) and `versions/<version:012d>.json`. A manifest names, per
tensor, its dtype, shape, hash of the raw bytes (format 2: a chunk-tree sha256, weights/tensors.py), the element
count per chunk and two chunk lists:
`full` (an anchor: decodable alone) and `delta` (against the manifest's `base` version). Writers put
every chunk first and the manifest last; on a local disk the manifest goes to a hidden temporary file
and is renamed into place (atomic), on object stores a single PUT is atomic. So a reader that lists
`versions/` never sees a half-written version. Garbage collection keeps the newest `keep_versions`
manifests plus every manifest their base chains reach back to an anchor, then deletes chunks that no
remaining manifest references and that are older than `min_age_s` (a concurrent writer's chunks whose
manifest is not yet written are younger than that).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from typing import Any

import fsspec

MANIFEST_FORMAT = 2  # 2: tensor hashes are chunk-tree hashes (weights/tensors.py); 1 is still read
READ_FORMATS = (1, 2)


class StoreError(OSError):
    """The store could not be read or written (missing object, full or read-only disk, bad URL)."""


def chunk_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class WeightStore:
    """Chunks and manifests on an fsspec filesystem (a local directory when `url` has no protocol)."""

    def __init__(self, url: str):
        if not isinstance(url, str) or not url:
            raise ValueError("weight store URL must be a non-empty string (a directory or an fsspec URL)")
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        try:
            self.fs.makedirs(f"{self.root}/versions", exist_ok=True)
            self.fs.makedirs(f"{self.root}/chunks", exist_ok=True)
        except OSError as err:
            raise StoreError(f"cannot create the weight store at '{url}': {err}") from err

    def __repr__(self) -> str:
        return f"WeightStore({self.url!r})"

    # --- paths
    def _chunk_path(self, cid: str) -> str:
        if len(cid) != 64 or any(c not in "0123456789abcdef" for c in cid):
            raise ValueError(f"'{cid}' is not a chunk id (64 lowercase hex digits)")
        return f"{self.root}/chunks/{cid[:2]}/{cid}"

    def _manifest_path(self, version: int) -> str:
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        return f"{self.root}/versions/{version:012d}.json"

    # --- writing
    def _write_atomic(self, path: str, data: bytes) -> None:
        try:
            if self.local:
                d = os.path.dirname(path)
                os.makedirs(d, exist_ok=True)
                tmp = os.path.join(d, f".tmp-{uuid.uuid4().hex}")
                try:
                    with open(tmp, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, path)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            else:
                self.fs.pipe_file(path, data)
        except OSError as err:
            raise StoreError(f"cannot write '{path}' in weight store '{self.url}' "
                             f"(disk full or read-only?): {err}") from err

    def put_chunk(self, data: bytes) -> str:
        """Store a chunk under its content hash (once); returns the id."""
        cid = chunk_id(data)
        path = self._chunk_path(cid)
        if not self.fs.exists(path):
            self._write_atomic(path, data)
        return cid

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Publish a version: call only after all its chunks are stored."""
        version = manifest.get("version")
        if not isinstance(version, int):
            raise ValueError(f"a manifest needs an integer 'version', got {version!r}")
        path = self._manifest_path(version)
        if self.fs.exists(path):
            raise ValueError(f"version {version} already exists in '{self.url}'; versions are immutable")
        self._write_atomic(path, json.dumps(manifest, separators=(",", ":")).encode())

    # --- reading
    def list_versions(self) -> list[int]:
        try:
            names = self.fs.ls(f"{self.root}/versions", detail=False)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            base = name.rsplit("/", 1)[-1]
            if base.endswith(".json") and not base.startswith(".") and base[:-5].isdigit():
                out.append(int(base[:-5]))
        return sorted(out)

    def latest_version(self) -> int | None:
        versions = self.list_versions()
        return versions[-1] if versions else None

    def read_manifest(self, version: int) -> dict[str, Any]:
        path = self._manifest_path(version)
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            raise StoreError(f"version {version} is not in weight store '{self.url}'") from None
        try:
            manifest = json.loads(data)
        except ValueError as err:
            raise StoreError(f"manifest of version {version} in '{self.url}' is not valid JSON: {err}") from None
        check_manifest(manifest)
        return manifest

    def read_manifest_bytes(self, version: int) -> bytes:
        try:
            return self.fs.cat_file(self._manifest_path(version))
        except FileNotFoundError:
            raise StoreError(f"version {version} is not in weight store '{self.url}'") from None

    def get_chunk(self, cid: str) -> bytes:
        try:
            return self.fs.cat_file(self._chunk_path(cid))
        except FileNotFoundError:
            raise StoreError(f"chunk {cid[:12]}… is missing from weight store '{self.url}'") from None

    def drop_versions_after(self, version: int) -> list[int]:
        """Remove the manifests of versions newer than `version` (a trainer resumed from an older
        checkpoint republishes them); their chunks go at the next gc. Returns the versions removed."""
        dropped = [v for v in self.list_versions() if v > version]
        for v in reversed(dropped):  # newest first, so a reader never sees a gap below the newest
            try:
                self.fs.rm(self._manifest_path(v))
            except OSError as err:
                raise StoreError(f"cannot remove version {v} from weight store '{self.url}': {err}") from err
        return dropped

    # --- retention
    def gc(self, keep_versions: int, min_age_s: float = 60.0) -> dict[str, int]:
        """Delete old versions and unreferenced chunks; never what a kept manifest needs."""
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        versions = self.list_versions()
        manifests: dict[int, dict] = {}

        def load(v: int) -> dict | None:
            if v not in manifests:
                try:
                    manifests[v] = self.read_manifest(v)
                except StoreError:
                    return None
            return manifests[v]

        keep: set[int] = set()
        for v in versions[-keep_versions:]:
            cur: int | None = v
            while cur is not None and cur not in keep:
                m = load(cur)
                if m is None:
                    break
                keep.add(cur)
                cur = None if m["anchor"] else m["base"]
        num_manifests = 0
        for v in versions:
            if v not in keep:
                try:
                    self.fs.rm_file(self._manifest_path(v))
                    num_manifests += 1
                except FileNotFoundError:
                    pass
        live: set[str] = set()
        for v in keep:
            m = load(v)
            if m is not None:
                live.update(referenced_chunks(m))
        num_chunks = 0
        now = time.time()
        for path in self.fs.find(f"{self.root}/chunks"):
            name = path.rsplit("/", 1)[-1]
            if name in live or name.startswith("."):
                continue
            try:
                if now - _mtime(self.fs.info(path)) < min_age_s:
                    continue
                self.fs.rm_file(path)
                num_chunks += 1
            except FileNotFoundError:
                pass
        return {"num_manifests_deleted": num_manifests, "num_chunks_deleted": num_chunks, "num_versions_kept": len(keep)}


def _mtime(info: dict) -> float:
    for key in ("mtime", "created", "LastModified", "last_modified"):
        v = info.get(key)
        if v is None:
            continue
        if isinstance(v, (int, float)):
            return float(v)
        if hasattr(v, "timestamp"):
            return v.timestamp()
    return 0.0


def referenced_chunks(manifest: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for t in manifest["tensors"].values():
        for key in ("full", "delta"):
            for cid, _ in t.get(key) or []:
                out.add(cid)
    return out


def check_manifest(m: Any) -> None:
    """Refuse a manifest that is not well formed (a reader must not crash on it later)."""
    if not isinstance(m, dict) or m.get("format") not in READ_FORMATS:
        raise StoreError(f"not a flywheel manifest of format {' or '.join(map(str, READ_FORMATS))}")
    if not isinstance(m.get("version"), int) or not isinstance(m.get("tensors"), dict):
        raise StoreError("manifest lacks an int 'version' or a 'tensors' table")
    if not m.get("anchor") and not isinstance(m.get("base"), int):
        raise StoreError(f"manifest of version {m['version']} is neither an anchor nor has a base version")
    for name, t in m["tensors"].items():
        if not isinstance(t, dict) or not {"dtype", "shape", "hash", "chunk_elems"} <= set(t):
            raise StoreError(f"manifest entry for tensor '{name}' is incomplete")
        if m.get("anchor") and not t.get("full"):
            raise StoreError(f"anchor manifest lacks full chunks for tensor '{name}'")
