"""The tokenizer the renderer uses: the model directory's ``tokenizer.json``, loaded once."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from rollyard.core.errors import ConfigError
from rollyard.engines.chat_template import IM_END

_GIL_FREE_CHARS = 4096


class Tokenizer(Protocol):
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class FastTokenizer:
    """``tokenizers.Tokenizer`` without transformers: fast to load, markers kept as tokens."""

    def __init__(self, model_dir: str | Path) -> None:
        from tokenizers import Tokenizer as _Tok
        from tokenizers import decoders

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"no tokenizer.json in {model_dir}; pass the model directory the engine serves")
        self._tok = _Tok.from_file(str(path))
        eos = self._tok.token_to_id(IM_END)
        if eos is None:
            raise ConfigError(f"tokenizer in {model_dir} has no {IM_END} token; not a rollyard chat model")
        self.eos_id: int = eos
        # decode(a + b) == decode(a) + decode(b) whenever ``a`` ends on a whole character (a
        # byte-level decoder: ids to bytes, then UTF-8): streaming decodes each piece alone
        self.concatenative: bool = isinstance(self._tok.decoder, decoders.ByteLevel)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.vocab_size: int = len(vocab)
        # No token covers more text than this: a prompt of n chars has >= n / max_token_chars
        # tokens, so one that cannot fit the context is refused before it is tokenized.
        self.max_token_chars: int = max((len(t) for t in vocab), default=0)
        # one id's text, as decoded once: a streamed event holds one token, and its decode was a
        # call into the tokenizer per token (~2 us); an id's text never changes
        self._one: dict[int, str] = {}

    def encode(self, text: str) -> list[int]:
        if len(text) <= _GIL_FREE_CHARS:
            return self._tok.encode(text, add_special_tokens=False).ids
        # encode_batch releases the GIL (encode does not): a long text tokenized in a worker
        # thread then leaves the event loop free.
        return self._tok.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int]) -> str:
        if len(ids) != 1:
            return self._tok.decode(ids, skip_special_tokens=False)
        text = self._one.get(ids[0])
        if text is None:
            text = self._tok.decode(ids, skip_special_tokens=False)
            if 0 <= ids[0] < self.vocab_size:  # bounded by the vocabulary
                self._one[ids[0]] = text
        return text
