"""Where a chat template comes from: --chat-template FILE, else chat_template.jinja or tokenizer_config.json's
chat_template beside tokenizer.json; and the special tokens' texts a template may name.

    chat_template_of("tok/tokenizer.json")  ->  (the template source, "tok/tokenizer_config.json")
"""

from __future__ import annotations

import hashlib
import json

from packer.config import BuildConfig
from packer.encode.tokenizer import (
    BOS_CANDIDATES,
    CONFIG_FILES,
    MAX_JSON_DEPTH,
    TokenizerInfo,
    json_depth,
    load_tokenizer,
    read_config_file,
)
from packer.io import fs

TEMPLATE_FILE = "chat_template.jinja"  # transformers >= 4.43 saves the template beside tokenizer_config.json
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _template_in(data: dict, loc) -> str | None:
    """A tokenizer_config.json's chat_template: a string, or a list of {"name", "template"} ("default" chosen)."""
    found = data.get("chat_template")
    if found is None or isinstance(found, str):
        return found
    if isinstance(found, list):
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
        raise ValueError(f"{fs.redact(loc)}: chat_template lists templates {sorted(map(str, named))} but none named "
                         "\"default\"; give the one to use with --chat-template FILE")
    raise ValueError(f"{fs.redact(loc)}: chat_template must be a string or a list of {{name, template}}, "
                     f"got {type(found).__name__}; fix the file or give one with --chat-template FILE")


def chat_template_of(tokenizer_json: str, template_file: str | None = None) -> tuple[str, str]:
    """(Jinja template, where it came from) for chat records.

    `template_file` (--chat-template) first: a tokenizer_config.json-style JSON object holding
    "chat_template", or the template itself (a .jinja file). Else, beside a file named
    tokenizer.json: chat_template.jinja, then tokenizer_config.json's chat_template."""
    if template_file is not None:
        loc = fs.location(template_file)
        if not loc.is_file():
            raise FileNotFoundError(f"--chat-template {fs.redact(template_file)}: no such file (give a .jinja "
                                    "template or a tokenizer_config.json holding chat_template)")
        text = loc.read_text()
        if json_depth(text.encode("utf-8")) > MAX_JSON_DEPTH:
            raise ValueError(f"--chat-template {fs.redact(template_file)}: nested more than {MAX_JSON_DEPTH} levels "
                             "deep: damaged; give the template itself or a tokenizer_config.json holding one")
        try:
            data = json.loads(text)
        except ValueError:
            return text, fs.redact(template_file)
        if isinstance(data, dict) and (found := _template_in(data, loc)) is not None:
            return found, fs.redact(template_file)
        raise ValueError(f"--chat-template {fs.redact(template_file)} is JSON without a chat_template string; "
                         "give the template itself or a tokenizer_config.json holding one")
    loc = fs.location(tokenizer_json)
    if loc.name == "tokenizer.json":
        if (loc.parent / TEMPLATE_FILE).is_file():
            return (loc.parent / TEMPLATE_FILE).read_text(), TEMPLATE_FILE
        config = read_config_file(loc.parent / "tokenizer_config.json")
        if config is not None and (found := _template_in(config, loc.parent / "tokenizer_config.json")) is not None:
            return found, "tokenizer_config.json"
    raise ValueError(f"no chat template for {fs.redact(tokenizer_json)} (neither {TEMPLATE_FILE} nor a chat_template "
                     "in tokenizer_config.json beside it); give one with --chat-template FILE")


def template_specials(info: TokenizerInfo) -> dict[str, str]:
    """The special-token strings a chat template sees (bos_token, eos_token, ...), as transformers
    passes them: what tokenizer_config.json / special_tokens_map.json name, else the tokens this
    build chose (eos) or the first BOS_CANDIDATES the tokenizer has (bos)."""
    loc = fs.location(info.path)
    specials: dict[str, str] = {}
    if loc.name == "tokenizer.json":
        for name in CONFIG_FILES[::-1]:  # tokenizer_config.json last: it wins, as in transformers >= 4.34
            data = read_config_file(loc.parent / name) or {}
            for key in SPECIAL_KEYS:
                value = data.get(key)
                content = value.get("content") if isinstance(value, dict) else value
                if isinstance(content, str) and content:
                    specials[key] = content
    if "eos_token" not in specials and info.eos_token:
        specials["eos_token"] = info.eos_token
    if "bos_token" not in specials:
        tok = load_tokenizer(info.path)
        bos = info.bos_token or next((c for c in BOS_CANDIDATES if tok.token_to_id(c) is not None), None)
        if bos:
            specials["bos_token"] = bos
    return specials


def chat_template_manifest(info: TokenizerInfo, config: BuildConfig, used: bool) -> dict:
    """The manifest's tokenizer "chat_template" entry of a build that rendered chats (`used`), so
    the template that decided the masks is on record ({} otherwise: other builds keep their bytes):

        {"chat_template": {"source": "tokenizer_config.json", "sha256": "5d41402a..."}}
    """
    if not used:
        return {}
    source, where = chat_template_of(info.path, config.chat_template)
    return {"chat_template": {"source": where, "sha256": hashlib.sha256(source.encode("utf-8")).hexdigest()}}
