"""The tokenizer the renderer uses: the model directory's ``tokenizer.json``, loaded once."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from rollyard.core.errors import ConfigError
from rollyard.engines.chat_template import IM_END


class Tokenizer(Protocol):
    eos_id: int
    vocab_size: int  # 0 when unknown

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class FastTokenizer:
    """``tokenizers.Tokenizer`` without transformers: fast to load, markers kept as tokens."""

    def __init__(self, model_dir: str | Path) -> None:
        from tokenizers import Tokenizer as _Tok

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"no tokenizer.json in {model_dir}; pass the model directory the engine serves")
        self._tok = _Tok.from_file(str(path))
        eos = self._tok.token_to_id(IM_END)
        if eos is None:
            raise ConfigError(f"tokenizer in {model_dir} has no {IM_END} token; not a rollyard chat model")
        self.eos_id: int = eos
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)
