"""What sampling a request actually gets: the trainer's policy wins over the agent's ask.

Tool forcing: ``tool_choice: required`` (or a named function) is implemented with vLLM
structured outputs: the regex from ``chat_template.tool_call_regex`` admits exactly one
well-formed call to one of the allowed names, with a flat object of string arguments. This
changes the distribution the tokens were sampled from; the turn records the regex in its
``sampling`` so RL code can tell.
"""

from __future__ import annotations

from rollyard.core.errors import ContextLengthExceeded, InvalidRequest
from rollyard.core.program import Program
from rollyard.core.sampling import SamplingParams
from rollyard.engines.chat_template import tool_call_regex
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
    max_tokens = pol.max_tokens or request.max_tokens or room
    regex = None
    if request.tool_choice == "required" or request.tool_name:
        names = [t.name for t in request.tools]
        if request.tool_name:
            if request.tool_name not in names:
                raise InvalidRequest(f"tool_choice names {request.tool_name!r}, which is not in tools")
            names = [request.tool_name]
        if not names:
            raise InvalidRequest("tool_choice requires a tool call but no tools were given")
        regex = tool_call_regex(names)
    return SamplingParams(
        max_tokens=min(max_tokens, room),
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=-1 if request.top_k is None else request.top_k,
        seed=request.seed,
        regex=regex,
        logprobs=True,
        ignore_eos=pol.ignore_eos,
    )
