"""HTTP serving of a weight store, and relays that fan it out: N regions pull from the trainer once.

    python -m flywheel.weights.relay --store runs/x/weights --port 8470            # origin
    python -m flywheel.weights.relay --upstream http://origin:8470 --port 8471 \\
        --bandwidth-mbps 100 --streams 8                                         # a region's relay
    Subscriber("http://relay:8471", engine).start()

Routes: `GET /versions` (JSON list), `GET /manifests/<v>`, `GET /chunks/<id>`, `GET /stats`.
Why so: manifests and chunks are immutable and content-addressed, so a relay caches them forever
(chunks in an LRU bounded by `cache_mb`) and only `/versions` is forwarded each time. A relay
verifies each chunk's hash before caching it, fetches each missing chunk once however many
subscribers ask at the same moment (single flight), uses at most `streams` upstream requests at a
time, and paces its egress with a token bucket (`bandwidth_mbps`, 0 = unlimited) shared by all
responses. The server prints `serving on http://HOST:PORT` once bound (port 0 picks a free one).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import threading
import time
import urllib.parse
from collections import OrderedDict

from aiohttp import ClientSession, ClientTimeout, web

from flywheel.background import BackgroundLoop
from flywheel.weights.store import StoreError, WeightStore, check_manifest, chunk_id


class HttpStore:
    """Read side of a store served over HTTP (thread-safe: one keep-alive connection per thread)."""

    def __init__(self, url: str, timeout_s: float = 30.0):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"relay URL '{url}' must look like http://host:port")
        self.url = url.rstrip("/")
        self._parsed = parsed
        self._host = parsed.hostname
        self.timeout_s = timeout_s
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"HttpStore({self.url!r})"

    def _conn(self) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is None:
            cls = http.client.HTTPSConnection if self._parsed.scheme == "https" else http.client.HTTPConnection
            c = self._local.conn = cls(self._host, self._parsed.port, timeout=self.timeout_s)
        return c

    def _get(self, path: str) -> bytes:
        full = self._parsed.path.rstrip("/") + path
        for attempt in range(2):
            conn = self._conn()
            try:
                conn.request("GET", full)
                resp = conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException) as err:
                conn.close()
                self._local.conn = None
                if attempt:
                    raise StoreError(f"GET {self.url}{path} failed: {err}") from err
                continue
            if resp.status == 404:
                raise StoreError(f"{self.url}{path} not found")
            if resp.status != 200:
                raise StoreError(f"GET {self.url}{path} answered {resp.status}: {body[:200]!r}")
            return body
        raise AssertionError("unreachable")

    def list_versions(self) -> list[int]:
        return [int(v) for v in json.loads(self._get("/versions"))]

    def latest_version(self) -> int | None:
        v = self.list_versions()
        return v[-1] if v else None

    def read_manifest(self, version: int) -> dict:
        try:
            m = json.loads(self._get(f"/manifests/{int(version)}"))
        except ValueError as err:
            raise StoreError(f"manifest {version} from {self.url} is not JSON: {err}") from None
        check_manifest(m)
        return m

    def get_chunk(self, cid: str) -> bytes:
        return self._get(f"/chunks/{cid}")


class TokenBucket:
    """Egress pacing shared by all responses: `rate` bytes/s with one second of burst."""

    def __init__(self, rate_bps: float):
        self.rate = rate_bps
        self.tokens = rate_bps
        self.t = time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        async with self.lock:
            now = time.monotonic()
            self.tokens = min(self.rate, self.tokens + (now - self.t) * self.rate)
            self.t = now
            self.tokens -= n
            if self.tokens < 0:
                await asyncio.sleep(-self.tokens / self.rate)


class RelayServer:
    """Serve a local store (`store=`) or relay an upstream server (`upstream=`) over HTTP."""

    def __init__(self, *, store: str | WeightStore | None = None, upstream: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, bandwidth_mbps: float = 0.0, streams: int = 8,
                 cache_mb: float = 4096.0, slice_kb: int = 64):
        if (store is None) == (upstream is None):
            raise ValueError("give exactly one of store= (serve a store) or upstream= (relay a server)")
        if streams < 1 or bandwidth_mbps < 0:
            raise ValueError("streams must be >= 1 and bandwidth_mbps >= 0")
        self.store = WeightStore(store) if isinstance(store, str) else store
        self.upstream = upstream.rstrip("/") if upstream else None
        self.host, self.port = host, port
        self.bandwidth_mbps, self.streams = bandwidth_mbps, streams
        self.cache_bytes = int(cache_mb * (1 << 20))
        self.slice = slice_kb << 10
        self.stats = {"num_requests": 0, "bytes_out": 0, "num_upstream_chunks": 0, "bytes_upstream": 0,
                      "num_cache_hits": 0}
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cached = 0
        self._manifests: dict[int, bytes] = {}
        self._inflight: dict[str, asyncio.Future] = {}
        self._background = BackgroundLoop("weights-relay")
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    # --- upstream / store access
    async def _upstream_get(self, path: str) -> bytes:
        assert self._session is not None and self.upstream is not None, "relay mode only"
        async with self._sem:
            async with self._session.get(self.upstream + path) as r:
                body = await r.read()
                if r.status == 404:
                    raise web.HTTPNotFound(text=f"{path} not found upstream")
                if r.status != 200:
                    raise web.HTTPBadGateway(text=f"upstream answered {r.status} for {path}")
                return body

    async def _local(self, fn, *args):
        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
        except StoreError as err:
            raise web.HTTPNotFound(text=str(err)) from None
        except ValueError as err:
            raise web.HTTPBadRequest(text=str(err)) from None

    async def _chunk(self, cid: str) -> bytes:
        if cid in self._cache:
            self._cache.move_to_end(cid)
            self.stats["num_cache_hits"] += 1
            return self._cache[cid]
        if self.store is not None:
            return await self._local(self.store.get_chunk, cid)
        if cid in self._inflight:
            return await asyncio.shield(self._inflight[cid])
        fut = asyncio.get_running_loop().create_future()
        self._inflight[cid] = fut
        try:
            data = await self._upstream_get(f"/chunks/{cid}")
            if chunk_id(data) != cid:  # never cache (or serve) bytes that fail their hash
                data = await self._upstream_get(f"/chunks/{cid}")
                if chunk_id(data) != cid:
                    raise web.HTTPBadGateway(text=f"chunk {cid} from upstream fails its hash")
            self.stats["num_upstream_chunks"] += 1
            self.stats["bytes_upstream"] += len(data)
            self._cache[cid] = data
            self._cached += len(data)
            while self._cached > self.cache_bytes and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cached -= len(old)
            fut.set_result(data)
            return data
        except BaseException as err:
            fut.set_exception(err)
            fut.exception()  # mark retrieved
            raise
        finally:
            del self._inflight[cid]

    # --- handlers
    async def _send(self, request: web.Request, body: bytes, content_type: str) -> web.StreamResponse:
        self.stats["num_requests"] += 1
        resp = web.StreamResponse(headers={"Content-Type": content_type, "Content-Length": str(len(body))})
        await resp.prepare(request)
        for i in range(0, len(body), self.slice):
            part = body[i:i + self.slice]
            await self._bucket.take(len(part))
            await resp.write(part)
        self.stats["bytes_out"] += len(body)
        await resp.write_eof()
        return resp

    async def _versions(self, request: web.Request) -> web.StreamResponse:
        if self.store is not None:
            body = json.dumps(await self._local(self.store.list_versions)).encode()
        else:
            body = await self._upstream_get("/versions")
        return await self._send(request, body, "application/json")

    async def _manifest(self, request: web.Request) -> web.StreamResponse:
        try:
            v = int(request.match_info["v"])
        except ValueError:
            raise web.HTTPBadRequest(text="version must be an integer") from None
        if v not in self._manifests:
            if self.store is not None:
                body = await self._local(self.store.read_manifest_bytes, v)
            else:
                body = await self._upstream_get(f"/manifests/{v}")
            self._manifests[v] = body
        return await self._send(request, self._manifests[v], "application/json")

    async def _chunk_handler(self, request: web.Request) -> web.StreamResponse:
        return await self._send(request, await self._chunk(request.match_info["id"]), "application/octet-stream")

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response({**self.stats, "cached_bytes": self._cached, "num_cached": len(self._cache)})

    # --- lifecycle
    async def start_async(self) -> str:
        self._bucket = TokenBucket(self.bandwidth_mbps * 1e6)
        self._sem = asyncio.Semaphore(self.streams)
        self._session = ClientSession(timeout=ClientTimeout(total=120)) if self.upstream else None
        app = web.Application()
        app.add_routes([web.get("/versions", self._versions), web.get("/manifests/{v}", self._manifest),
                        web.get("/chunks/{id}", self._chunk_handler), web.get("/stats", self._stats)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{self.port}"
        return self.url

    async def stop_async(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def start(self) -> str:
        """Serve from a background thread; returns the URL."""
        return self._background.start(self.start_async, self.stop_async)

    def stop(self) -> None:
        self._background.stop(timeout_s=None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flywheel.weights.relay", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--store", help="weight store directory or fsspec URL to serve")
    src.add_argument("--upstream", help="URL of the server to relay")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8470, help="0 picks a free port")
    p.add_argument("--bandwidth-mbps", type=float, default=0.0, help="egress cap in MB/s; 0 = unlimited")
    p.add_argument("--streams", type=int, default=8, help="parallel upstream fetches")
    p.add_argument("--cache-mb", type=float, default=4096.0, help="chunk cache size (relay mode)")
    args = p.parse_args(argv)
    server = RelayServer(store=args.store, upstream=args.upstream, host=args.host, port=args.port,
                         bandwidth_mbps=args.bandwidth_mbps, streams=args.streams, cache_mb=args.cache_mb)

    async def serve() -> None:
        url = await server.start_async()
        print(f"serving on {url}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop_async()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
