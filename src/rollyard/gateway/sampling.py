"""What sampling a request actually gets: the trainer's policy wins over the agent's ask.

Tool forcing: ``tool_choice: required`` (or a named function) is implemented with vLLM
structured outputs: the grammar from ``engines.tool_grammar`` admits exactly one call to one of
the allowed tools, its arguments valid against that tool's JSON schema and short enough to end
within the turn's ``max_tokens``. This changes the distribution the tokens were sampled from;
the turn is flagged ``constrained_decoding`` so RL code can tell.
"""

from __future__ import annotations

from rollyard.core.errors import ContextLengthExceeded, InvalidRequest
from rollyard.core.program import Program
from rollyard.core.sampling import SamplingParams
from rollyard.engines.tool_grammar import tool_call_grammar
from rollyard.gateway.types import ChatRequest


def context_limit(program: Program, engine_max_len: int) -> int:
    return min(program.context_limit or engine_max_len, engine_max_len)


def sampling_for(request: ChatRequest, program: Program, prompt_len: int, limit: int) -> SamplingParams:
    """Merge program policy and request; raise ``ContextLengthExceeded`` when nothing fits."""
    room = limit - prompt_len
    if room < 1:
        raise ContextLengthExceeded(
            f"the prompt has {prompt_len} tokens; this program's context limit is {limit} tokens"
        )
    pol = program.sampling
    temperature = pol.temperature if pol.temperature is not None else request.temperature
    top_p = pol.top_p if pol.top_p is not None else request.top_p
    max_tokens = min(pol.max_tokens or request.max_tokens or room, room)
    grammar = None
    if request.tool_choice == "required" or request.tool_name:
        tools = request.tools
        if request.tool_name:
            tools = [t for t in tools if t.name == request.tool_name]
            if not tools:
                raise InvalidRequest(f"tool_choice names {request.tool_name!r}, which is not in tools")
        if not tools:
            raise InvalidRequest("tool_choice requires a tool call but no tools were given")
        grammar = tool_call_grammar([(t.name, t.parameters) for t in tools], max_tokens)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=-1 if request.top_k is None else request.top_k,
        seed=request.seed,
        grammar=grammar,
        top_logprobs=request.top_logprobs,
        logprobs=True,
        ignore_eos=pol.ignore_eos,
    )
