"""One model call, whatever the dialect: render once, schedule once, call, record once.

``Gateway.chat`` and ``Gateway.chat_stream`` take a typed ``ChatRequest`` and give a
``ChatResult``; the turn is committed to the journal before the result (or, when streaming,
the final event) is handed back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from rollyard.core.clock import Clock
from rollyard.core.errors import EngineUnavailable, InvalidRequest, NotFound
from rollyard.core.program import Program, ProgramPhase, ProgramState
from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import Outcome
from rollyard.engines.base import Completion
from rollyard.gateway.body_prefix import BodyPrefix, Seen
from rollyard.gateway.divided import Divided, Generated, continues, run_divided
from rollyard.gateway.guard import GuardedBackend
from rollyard.gateway.metrics import GatewayMetrics
from rollyard.gateway.pd import PrefillStage
from rollyard.gateway.pool import EnginePool
from rollyard.gateway.programs import ProgramTable
from rollyard.gateway.recorder import SqliteJournal
from rollyard.gateway.renderer import ConversationState, Renderer, RenderPlan
from rollyard.gateway.sampling import context_limit, sampling_for
from rollyard.gateway.streaming import StreamedText, TextStreamer
from rollyard.gateway.turn_record import build_turn
from rollyard.gateway.types import ChatRequest, ChatResult, Message
from rollyard.sched import Pause, Restore, Start

log = logging.getLogger(__name__)


class Gateway:
    def __init__(
        self,
        pool: EnginePool,
        renderer: Renderer,
        programs: ProgramTable,
        journal: SqliteJournal,
        clock: Clock,
        metrics: GatewayMetrics,
        model_name: str,
        strict_model: bool = False,
        divided: Divided | None = None,
    ) -> None:
        self.pool, self.renderer, self.programs, self.journal = pool, renderer, programs, journal
        self.clock, self.metrics = clock, metrics
        self.model_name, self.strict_model = model_name, strict_model
        self.divided = divided  # None: every generation runs in one piece
        self.pd: PrefillStage | None = None  # prefill engines take long first prompts (engine.role)
        live = {p.id for p in programs.all() if not p.state.is_over}
        self.conversations: dict[str, ConversationState] = journal.load_conversations(only=live)
        self._locks: dict[str, asyncio.Lock] = {}
        # each program's last chat body, so the next is parsed from where it differs
        self.body_prefixes: dict[str, BodyPrefix | Seen] = {}
        programs.on_create(
            lambda p: pool.scheduler.register(p.id, p.group_id, p.group_size, context_tokens=p.context_tokens)
        )
        programs.on_terminate(lambda p: pool.forget(p.id))
        programs.on_terminate(self._ended)
        pool.on_decision(self._mirror_decision)

    def forget(self, program_id: str) -> None:
        """Free a finished program's in-memory state (its turns stay in the journal)."""
        self.conversations.pop(program_id, None)
        self._locks.pop(program_id, None)
        self.body_prefixes.pop(program_id, None)

    def _ended(self, program: Program) -> None:
        """A program finished: free its state now, or, while a turn of it is in flight, when that
        turn has been journaled (its record builds on the state: freed early, it took index 0
        again and failed the journal's unique key, a 500 that lost the engine's work)."""
        if not self.busy(program.id):
            self.forget(program.id)

    async def finish(
        self, program_id: str, state: ProgramState, status: str | None, outcome: Outcome | None = None
    ) -> Program:
        """End a program, then wait until its turn in flight (if any) is journaled.

        The order: the finish takes effect at once (the program's key gets 409 for new requests,
        and requests queued behind the turn in flight get 409 before the engine runs); the turn
        at the engine completes and is journaled; then this returns, so a trajectory read after
        it holds every turn that was answered."""
        lock = self._locks.get(program_id)
        program = self.programs.finish(program_id, state, status, outcome)
        if lock is not None:
            async with lock:  # the turn in flight, then each queued request's refusal
                pass
            if not self.busy(program_id):
                self.forget(program_id)
        return program

    def busy(self, program_id: str) -> bool:
        """A request of this program is being served (its turn lock is held)."""
        lock = self._locks.get(program_id)
        return lock is not None and lock.locked()

    def _mirror_decision(self, d: Pause | Restore) -> None:
        """Show the scheduler's pauses in the program table (``GET /programs``, /metrics)."""
        try:
            p = self.programs.get(d.program_id)
        except NotFound:
            return
        if not p.state.is_over:
            p.state = ProgramState.PAUSED if isinstance(d, Pause) else ProgramState.ACTIVE

    # public ---------------------------------------------------------------
    def check_model(self, request: ChatRequest) -> None:
        if request.model and request.model != self.model_name:
            if self.strict_model:
                raise InvalidRequest(
                    f"unknown model {request.model!r}; this gateway serves {self.model_name!r}"
                )
            request.ignored["model"] = request.model

    async def count_tokens(self, program: Program, request: ChatRequest) -> int:
        state = self.conversations.get(program.id)
        return len((await self.renderer.arender(request, state)).prompt_ids)

    async def chat(self, program: Program, request: ChatRequest) -> ChatResult:
        result: ChatResult | None = None
        async for item in self.chat_stream(program, request):
            if isinstance(item, ChatResult):
                result = item  # (a streamed request's text, unread, is read by the turn itself)
        assert result is not None
        return result

    async def chat_stream(
        self, program: Program, request: ChatRequest
    ) -> AsyncIterator[StreamedText | ChatResult]:
        """The text while generating (when ``request.stream``: one ``StreamedText`` per engine
        call, each to be read before the next item is asked for), then the recorded result."""
        self.programs.require_active(program)
        self.check_model(request)
        if not request.messages:
            raise InvalidRequest("messages must not be empty")
        limit = context_limit(program, self.pool.max_model_len)
        entered = self.clock.now()
        try:
            async with self._locks.setdefault(program.id, asyncio.Lock()):
                self.programs.require_active(program)  # finished while this request waited its turn
                state = self.conversations.get(program.id)
                plan = await self.renderer.arender(request, state, limit, in_place=True)
                async with aclosing(self._run(program, request, plan, entered)) as items:
                    async for item in items:
                        yield item
        finally:
            self._after_turn(program)

    def _after_turn(self, program: Program) -> None:
        """Free the state of a program that finished while this turn ran, if none other runs."""
        if program.state.is_over and not self.busy(program.id):
            self.forget(program.id)

    async def complete_raw(
        self,
        program: Program,
        prompt: str | list[int],
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        seed: int | None,
        model: str,
    ) -> dict[str, Any]:
        """``/v1/completions``: the prompt as given (ids, or text tokenized without a template)."""
        self.programs.require_active(program)
        request = ChatRequest([], max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
        request.model, request.api = model, "openai_completions"
        self.check_model(request)
        if isinstance(prompt, str):
            self.renderer.check_fits(prompt, context_limit(program, self.pool.max_model_len))
        ids = list(prompt) if isinstance(prompt, list) else await self.renderer.aencode(prompt)
        if not ids:
            raise InvalidRequest("prompt must not be empty")
        entered = self.clock.now()
        try:
            async with self._locks.setdefault(program.id, asyncio.Lock()):
                self.programs.require_active(program)  # finished while this request waited its turn
                prev = self.conversations.get(program.id)
                head = prev.prompt() + prev.completion_ids if prev else []
                ext = prev is not None and ids[: len(head)] == head
                plan = RenderPlan(ids, len(head) if ext else 0, ext, None if ext else "raw_completion")
                result = None
                async for item in self._run(program, request, plan, entered):
                    result = item
        finally:
            self._after_turn(program)
        assert isinstance(result, ChatResult)
        return {
            "id": result.request_id,
            "created": result.created,
            "model": result.model,
            "text": self.renderer.tok.decode(result.completion_ids),
            "token_ids": result.completion_ids,
            "finish_reason": result.finish_reason.value,
            "prompt_tokens": result.prompt_tokens,
        }

    async def _run(
        self, program: Program, request: ChatRequest, plan: RenderPlan, entered: float
    ) -> AsyncIterator[StreamedText | ChatResult]:
        """Schedule, generate (in one piece, or in chunks under divided rollout), record once."""
        submitted = self.clock.now()
        params = sampling_for(
            request, program, len(plan.prompt_ids), context_limit(program, self.pool.max_model_len)
        )
        streamer = TextStreamer(self.renderer.tok)
        pd_s = 0.0  # engine time on a prefill engine (engine.role), before the decode engine's
        first_turn = program.id not in self.conversations
        if (
            self.pd is not None
            and self.pd.applies(first_turn, len(plan.prompt_ids))
            and await self.pd.prefill(plan.prompt_ids, params) is not None  # decode loads its KV
        ):
            pd_s = self.clock.now() - submitted  # a skipped prefill's time is the gateway's

        def call(ids: list[int], p: SamplingParams, chunk: int, before: int, left_after: int) -> Any:
            return self._generate(program, request, ids, p, streamer, chunk, before, left_after)

        if self.divided is not None and self.divided.applies(params):
            items = run_divided(call, plan.prompt_ids, params, self.divided.chunk_tokens)
        else:
            items = call(plan.prompt_ids, params, 0, 0, 0)
        gen: Generated | None = None
        async with aclosing(items):  # closed with this turn: its engine call's accounting
            async for item in items:
                if isinstance(item, Generated):
                    gen = item
                else:
                    yield item
        assert gen is not None
        if gen.dispatch.priority is not None:  # the policy ranked it (seer: 0 = probe or starved)
            gen.notes["priority"] = gen.dispatch.priority
        result = await self._record(program, request, plan, params, gen, submitted)
        now = self.clock.now()
        engine_s = gen.engine_s + pd_s
        result.engine_s, result.gateway_s = engine_s, now - entered - engine_s
        self.metrics.finished(request.api, now - submitted, engine_s)
        yield result

    async def _generate(
        self,
        program: Program,
        request: ChatRequest,
        prompt_ids: list[int],
        params: SamplingParams,
        streamer: TextStreamer,
        chunk: int = 0,
        before: int = 0,
        left_after: int = 0,
    ) -> AsyncIterator[StreamedText | Generated]:
        """One engine call, retried once when its connection fails before any of its text
        reached the caller (tokens still held back, e.g. a partial character, are dropped).

        Nothing generated was shown or recorded then, so the retry is safe and the journal stays
        exact; it goes wherever the scheduler sends it (the same engine when that one is still
        healthy). The engine is routed around only when its breaker holds it out (its health
        probe failed, or failures repeated): one dropped connection does not take it away from
        every other program. Under divided rollout this is one chunk: ``before`` tokens were
        generated already and ``left_after`` may follow, so the scheduler is told whether the
        request goes on."""
        completion: Completion | None = None
        engine_s = 0.0
        dispatch: Start | None = None
        for attempt in range(2):
            dispatch = await self.pool.acquire(
                program.id, len(prompt_ids), params.max_tokens + left_after, chunk=chunk
            )
            started = self.clock.now()
            program.phase, program.engine = ProgramPhase.REASONING, dispatch.engine
            mark = streamer.mark()
            try:
                backend = self.pool.backends[dispatch.engine]
                if request.stream:
                    completion = None
                    deltas = backend.stream(prompt_ids, params)
                    top = bool(params.top_logprobs)
                    streamed = StreamedText(deltas, streamer, len(prompt_ids), backend.name, top)
                    try:
                        yield streamed  # read by the response's frames, piece by piece
                        completion = await streamed.result()  # the call's error raised here
                    finally:
                        await streamed.aclose()
                else:
                    completion = await backend.generate(prompt_ids, params)
                break
            except EngineUnavailable as e:
                backend = self.pool.backends[dispatch.engine]
                usable = await backend.verdict() if isinstance(backend, GuardedBackend) else False
                if not usable:
                    self.pool.mark_down(dispatch.engine, e.message)
                shown = not streamer.rewind(mark)  # text of this attempt reached the caller
                if attempt == 1 or shown or not self.pool.scheduler.healthy_engines():
                    self.metrics.requests.labels(request.api, "engine_unavailable").inc()
                    raise
                log.info("engine call retried engine=%s reason=%s", dispatch.engine, e.message[:200])
                self.metrics.retries.inc()
            finally:
                engine_s += self.clock.now() - started
                final = not continues(completion, params.max_tokens, left_after)
                if final:
                    program.phase = ProgramPhase.ACTING
                out = before + len(completion.token_ids) if completion and final else None
                self.pool.release(dispatch, out, final=final)
        assert completion is not None and dispatch is not None
        yield Generated(completion, dispatch, started, engine_s)

    # recording ------------------------------------------------------------
    async def _record(
        self,
        program: Program,
        request: ChatRequest,
        plan: RenderPlan,
        params: SamplingParams,
        gen: Generated,
        submitted: float,
    ) -> ChatResult:
        prev = self.conversations.get(program.id)
        rec = build_turn(
            self.renderer, request, plan, params, gen, prev, submitted, self.clock.now(), self.model_name
        )
        if rec.rewrote:
            self.metrics.rewrites.inc()
        if rec.malformed:
            self.metrics.malformed.inc()
        program.context_tokens = rec.turn.total_tokens
        self.pool.scheduler.observe(program.id, context_tokens=rec.turn.total_tokens)
        # The state moves first: a client that disconnects mid-commit does not stop the commit
        # (the journal shields it), so the next turn must already build on this one.
        self.conversations[program.id] = rec.state
        try:
            await self.journal.record_turn(program, rec.turn, rec.segment, rec.events, rec.state)
        except Exception:
            if prev is None:
                self.conversations.pop(program.id, None)
            else:
                self.conversations[program.id] = prev
            raise
        self.metrics.counted_tokens(len(plan.prompt_ids), plan.reused_tokens, rec.result.completion_tokens)
        return rec.result

    def previous_messages(self, program: Program, response_id: str) -> list[Message]:
        """The conversation a Responses ``previous_response_id`` continues (only the latest is kept)."""
        state = self.conversations.get(program.id)
        if state is None or state.response_id != response_id:
            raise InvalidRequest(
                f"previous_response_id {response_id!r} is not this program's latest response; "
                "send the full input"
            )
        return [*state.messages, state.returned]
