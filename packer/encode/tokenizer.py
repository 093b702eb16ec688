"""Find a tokenizer, load it configured for packing (once, never changed afterwards), and choose its special tokens.

Configured for packing means three settings, whatever the tokenizer.json says:

    encode_special_tokens = True   "<|endoftext|>" inside a document is text, not the eos id
    no_truncation()                many tokenizer.json files ship `truncation: {max_length: 128}` ...
    no_padding()                   ... and padding on: every document would be cut or padded silently

A tokenizer.json that ships truncation or padding on is not refused: both are turned off on load
(every token kept, none added) and TokenizerInfo.shipped_truncation / shipped_padding say what the
file had, for the build summary and the manifest. `model_max_length`, `padding_side` and
`truncation_side` in tokenizer_config.json only steer transformers' own __call__: never read.
`encode_special_tokens` is not part of the tokenizer's JSON, so a pickled or `from_str` copy loses
it: code that receives a tokenizer object calls `configured_copy` (or `configure` on its own copy).

Special tokens, as HF ships a tokenizer (a directory, or a hub-cache snapshot):

    DIR/tokenizer.json             the tokenizer itself (the only file a build copies)
    DIR/tokenizer_config.json      {"eos_token": "<｜end▁of▁sentence｜>", "add_bos_token": true,
                                    "bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>"}, ...}
    DIR/special_tokens_map.json    {"eos_token": {"content": "</s>", "lstrip": false, ...}, "pad_token": "<pad>"}

Each of eos, bos and pad is chosen once, by the first of these that names it (its source):

    "flag"                     --eos-token / --bos-token (BuildConfig.eos_token / bos_token)
    "tokenizer_config.json"    eos_token / bos_token / pad_token, a string or {"content": ...};
    "special_tokens_map.json"  between the two files transformers' order: a tokenizer_config.json
                               with `added_tokens_decoder` (written by transformers >= 4.34) first,
                               an older one after special_tokens_map.json (which then overrides it)
    "guess"                    the first of EOS_CANDIDATES / BOS_CANDIDATES the tokenizer has (last resort)

Config files are read only beside a file named tokenizer.json (another name is a tokenizer on its
own). A named token the tokenizer does not have is an error naming the file and the key
(transformers would append it to the vocabulary; packer cannot grow the model's embedding), except
pad, which no shard holds: a missing pad token is a warning, and pad falls back to eos.
A post-processor in tokenizer.json (TemplateProcessing "[CLS] $A [SEP]", "<s> $A") is never
applied (encode_texts uses add_special_tokens=False): documents get exactly the bos/eos chosen here.

Whether to add them: `--bos/--no-bos` (BuildConfig.bos True/False) decides; bos None means "as
tokenizer_config.json's add_bos_token says, else off" (the default that turns BOS on for Llama-2 or
DeepSeek tokenizers while a tokenizer without config files builds as before). EOS is on unless
--no-eos: `add_eos_token: false`, which Llama-2, Mistral, Gemma and DeepSeek ship, says that
transformers' tokenizer(text) leaves a prompt open; packed documents still need their end marked
(the model learns where a document stops), so add_eos_token is not read: it never turns EOS off.

Tokenizers with no EOS. A tokenizer whose config files name none and that has none of
EOS_CANDIDATES stops the build: "name one with --eos-token, or --no-eos". WordPiece (BERT) names
no eos_token, only sep_token; "[SEP]" stays the last guess, because "[CLS] doc [SEP]" per document,
concatenated, is what transformers' run_mlm example packs for BERT-style pretraining, and builds
that used it keep their bytes. The summary says "guess" when it was used: for a causal LM, name a
real end-of-text token instead.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import os
import warnings
from dataclasses import dataclass

import numpy as np

from packer.config import BuildConfig
from packer.io import fs

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
_ROLES = {"eos": ("end-of-text", EOS_CANDIDATES), "bos": ("begin-of-text", BOS_CANDIDATES)}


@dataclass(frozen=True)
class TokenizerInfo:
    """What the manifest records about a tokenizer, and the special ids a build uses.

    shipped_truncation / shipped_padding: what the tokenizer.json itself set (its truncation
    max_length, whether it padded), turned off by load_tokenizer; for the build summary.
    engine / engine_reason: the encode engine this build runs and why (packer/encode/engines).
    eos_token / bos_token / pad_token: the strings chosen, with their *_source (see the module
    docstring: "flag", "tokenizer_config.json", "special_tokens_map.json", "guess"; pad also "eos",
    its fallback, or "none": id 0); None when off. bos_added_by: what turned BOS on ("flag" or
    "tokenizer_config.json" for its add_bos_token), None when off.

        sample_data/tokenizer.json, BuildConfig():  eos "<|endoftext|>" id 0 "guess", bos off, pad id 0 "eos"
        a DeepSeek-style directory, BuildConfig(bos=None):
            eos "<｜end▁of▁sentence｜>" "tokenizer_config.json", bos "<｜begin▁of▁sentence｜>" added_by "tokenizer_config.json"
    """

    path: str
    sha256: str
    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    shipped_truncation: int | None = None
    shipped_padding: bool = False
    eos_token: str | None = None
    eos_source: str | None = None
    bos_token: str | None = None
    bos_source: str | None = None
    bos_added_by: str | None = None
    pad_token: str | None = None
    pad_id: int | None = None
    pad_source: str | None = None
    engine: str = "hf"
    engine_reason: str = "asked for"

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.vocab_size <= 2**16 else np.uint32)


def resolve_tokenizer(name_or_path: str) -> str:
    """A tokenizer.json path or URI, a directory holding one, or a hub name already in the local HF
    cache ("gpt2", "org/name"; looked up offline, never downloaded) -> the tokenizer.json path."""
    if fs.is_uri(name_or_path):  # s3://, gs://, file://, ... (packer/io/fs.py): read, never downloaded to disk
        loc = fs.location(name_or_path)  # a Path or a RemotePath: the same two questions of either
        for candidate in (loc, loc / "tokenizer.json"):
            if candidate.is_file():
                return str(candidate)
        raise FileNotFoundError(f"tokenizer not found: {fs.redact(name_or_path)} (neither a tokenizer.json nor a directory holding one)")
    if os.path.isfile(name_or_path):
        return name_or_path
    if os.path.isfile(os.path.join(name_or_path, "tokenizer.json")):
        return os.path.join(name_or_path, "tokenizer.json")
    home = os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface"))
    cache = os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub"))
    repo = os.path.join(cache, "models--" + name_or_path.replace("/", "--"))
    ref = os.path.join(repo, "refs", "main")
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            candidate = os.path.join(repo, "snapshots", f.read().strip(), "tokenizer.json")
        if os.path.isfile(candidate):
            return candidate
    found = sorted(glob.glob(os.path.join(glob.escape(repo), "snapshots", "*", "tokenizer.json")))
    if found:
        return found[-1]
    if os.path.isdir(name_or_path):
        raise FileNotFoundError(
            f"tokenizer not found: {name_or_path} is a directory without tokenizer.json (packer reads the fast "
            "tokenizer file; transformers writes one: AutoTokenizer.from_pretrained(DIR).save_pretrained(NEW_DIR))"
        )
    raise FileNotFoundError(
        f"tokenizer not found: {name_or_path} (not a file, and not in the local HF cache {cache}; "
        "give the path of a local tokenizer.json, e.g. sample_data/tokenizer.json; nothing is downloaded)"
    )


def configure(tok):
    """Set `tok` up for packing (see the module docstring), in place; return it."""
    tok.encode_special_tokens = True
    tok.no_truncation()
    tok.no_padding()
    return tok


def configured_copy(tok):
    """A copy of a `tokenizers.Tokenizer`, configured for packing; `tok` itself is left as it was."""
    from tokenizers import Tokenizer

    if not isinstance(tok, Tokenizer):
        hint = " (for a transformers tokenizer, pass its .backend_tokenizer)" if hasattr(tok, "backend_tokenizer") else ""
        raise ValueError(f"tokenizer must be a path to a tokenizer.json or a tokenizers.Tokenizer; "
                         f"got {type(tok).__name__}{hint}")
    return configure(Tokenizer.from_str(tok.to_str()))


def load_tokenizer(path: str):
    """Load a tokenizer (path or cached hub name, see resolve_tokenizer) once per process, configured
    for packing. Shared by every caller in the process: never change the object it returns."""
    return _loaded(path)[0]


@functools.lru_cache(maxsize=4)
def _loaded(path: str):
    """(the configured tokenizer, (truncation max_length or None, padding on) as its file set them, the
    file's bytes). The file is read once a process: the tokenizer, the manifest's sha256 and a fast
    engine's ranks (byte_level.ranked_vocab_at) are all made from these bytes (3 reads before, 2026-12-05)."""
    from tokenizers import Tokenizer

    path = resolve_tokenizer(path)
    data = fs.location(path).read_bytes() if fs.is_uri(path) else _read_local(path)
    try:
        tok = Tokenizer.from_buffer(data)  # as from_file parses it (from_str's decode and re-encode: 3-9 ms more)
    except Exception as e:  # tokenizers raises a plain Exception on bad JSON ("expected ident at line 1 column 2")
        raise ValueError(f"{fs.redact(path)}: {_why_not_a_tokenizer(path, e)}; give a tokenizer.json "
                         "(HuggingFace tokenizers' file), a directory holding one, or a hub name") from None
    truncation = tok.truncation  # read before configure turns both off: no parse of the JSON of our own
    shipped = (truncation["max_length"] if truncation else None), tok.padding is not None
    return configure(tok), shipped, data


def tokenizer_bytes(path: str) -> bytes:
    """The bytes of the tokenizer.json at `path` as this process loaded them (load_tokenizer, once a
    process): hand them to byte_level.ranked_vocab_at(..., data=) rather than reading the file again."""
    return _loaded(path)[2]


def _read_local(path: str) -> bytes:
    """A plain path's bytes, read without resolving it to a place first (a name is not resolved twice)."""
    with open(path, "rb") as f:
        return f.read()


def _why_not_a_tokenizer(path: str, error: Exception) -> str:
    """Why tokenizers could not load the file: not JSON (where), JSON that is no tokenizer, or its own words."""
    data = fs.location(path).read_bytes()
    why = json_problem(data)
    if why is not None:
        return why
    spec = json.loads(data.decode("utf-8"))
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
        what = "an object" if isinstance(spec, dict) else f"a JSON {type(spec).__name__}"
        keys = f" (keys: {', '.join(list(spec)[:8])})" if isinstance(spec, dict) and spec else ""
        return f"valid JSON, but not a tokenizer: {what}{keys} without the \"model\" object a tokenizer.json has"
    return f"not a tokenizer tokenizers can load ({fs.redact_text(error)})"


@functools.lru_cache(maxsize=8)
def load_encoder(path: str, engine: str):
    """Encode engine `engine`'s encoder (packer/encode/engines; the name a TokenizerInfo holds) for
    the tokenizer at `path`, once per process, shared as load_tokenizer's object is."""
    from packer.encode.engines import make_encoder

    tok, _, data = _loaded(path)
    return make_encoder(path, engine, tok, data)


def checked_engine(path: str, choice: str = "auto"):
    """choose_engine's Choice for the tokenizer at `path`, with a fast engine's encoder made here, which
    probes it against tokenizers (packer/encode/engines make_encoder): one that gives other ids runs
    hf under auto, and stops the build in one line when named."""
    from packer.encode.engines import Choice, ProbeError, choose_engine, offer_bytes

    offer_bytes(path, choice, _loaded(path)[2])  # the bytes read once: the rule checks the file from them
    engine = choose_engine(path, choice)
    if engine.name == "hf":
        return engine
    try:
        load_encoder(path, engine.name)
    except ProbeError as e:
        choose_engine.cache_clear()  # the verdict it chose by was dropped: the next choice checks the file
        if choice != "auto":
            raise ValueError(f"--encode-engine {choice} cannot encode {fs.redact(path)} exactly: {e.why}; "
                             "use --encode-engine auto (it falls back to hf) or hf") from None
        return Choice("hf", f"auto: {engine.name}: {e.why}")
    return engine


def special_id(tok, name: str | None, candidates, what: str, fix: str) -> int:
    """The id of token `name`, or (no name) of the first of `candidates` the tokenizer has.
    `fix` ends the error message: how the caller names the token or turns it off."""
    if tok is None:
        raise ValueError(f"a {what} token id is needed, but no tokenizer was given; {fix}")
    for candidate in (name,) if name else candidates:
        token_id = tok.token_to_id(candidate)
        if token_id is not None:
            return token_id
    if name:
        raise ValueError(f"the tokenizer has no token {name!r}; {fix}")
    raise ValueError(f"cannot find a {what} token in the tokenizer (tried {', '.join(candidates)}); {fix}")


MAX_JSON_DEPTH = 100  # a tokenizer's config files nest 3 or 4 levels, its tokenizer.json 5: deeper is damaged or hostile


def json_depth(data: bytes) -> int:
    """How deep brackets nest in JSON text, strings skipped (a linear scan: no recursion)."""
    import re

    depth = deepest = 0
    for ch in re.findall(rb"[\[\]{}]", re.sub(rb'"[^"\\]*(?:\\.[^"\\]*)*"', b"", data)):
        depth += 1 if ch in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def json_problem(data: bytes) -> str | None:
    """Why `data` is not JSON, in one phrase ("not JSON (line 1, column 2: Expecting value)", "JSON nested
    100,000 levels deep ..."), or None; checked without recursing into it."""
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        return f"JSON nested {depth:,} levels deep (more than {MAX_JSON_DEPTH}: damaged)"
    try:
        json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"not UTF-8 text (byte {e.start})"
    except json.JSONDecodeError as e:
        return f"not JSON (line {e.lineno}, column {e.colno}: {e.msg})"
    except (ValueError, RecursionError) as e:
        return f"not JSON ({type(e).__name__})"
    return None


def read_config_file(loc) -> dict | None:
    if not loc.is_file():
        return None
    raw = loc.read_bytes()
    why = json_problem(raw)
    if why is not None:
        raise ValueError(f"{fs.redact(loc)}: {why}; fix or remove it (packer reads its "
                         "eos_token, bos_token, pad_token and add_bos_token)")
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{fs.redact(loc)}: expected a JSON object, got {type(data).__name__}; fix or remove it")
    return data


def _declared_value(value, key: str, loc):
    """A config file's value for `key` -> a token string / a bool, or None when it names nothing."""
    if value is None:
        return None
    if key.startswith("add_"):
        if isinstance(value, bool):
            return value
        raise ValueError(f"{fs.redact(loc)}: {key} must be true or false, got {value!r:.60}; fix the file")
    content = value.get("content") if isinstance(value, dict) else value
    if isinstance(content, str):
        return content or None
    raise ValueError(f"{fs.redact(loc)}: {key} must be a token string or {{\"content\": TOKEN}}, "
                     f"got {value!r:.60}; fix the file, or name the token with a flag (--eos-token, --bos-token)")


def declared_specials(tokenizer_json: str) -> dict[str, tuple[str | bool, str]]:
    """What the config files beside a tokenizer.json say, each with the file that says it:

        {"eos_token": ("<｜end▁of▁sentence｜>", "tokenizer_config.json"), "add_bos_token": (True, "tokenizer_config.json"),
         "pad_token": ("<pad>", "special_tokens_map.json")}

    Keys: eos_token, bos_token, pad_token, add_bos_token; a key no file names is absent (null and
    "" count as not named). The file order is transformers' (module docstring)."""
    loc = fs.location(tokenizer_json)
    if loc.name != "tokenizer.json":
        return {}
    files = {name: read_config_file(loc.parent / name) for name in CONFIG_FILES}
    tokenizer_config = files["tokenizer_config.json"]
    modern = tokenizer_config is not None and "added_tokens_decoder" in tokenizer_config
    order = CONFIG_FILES if modern else CONFIG_FILES[::-1]
    declared = {}
    for key in ("eos_token", "bos_token", "pad_token", "add_bos_token"):
        for name in order:
            value = _declared_value((files[name] or {}).get(key), key, loc.parent / name)
            if value is not None:
                declared[key] = (value, name)
                break
    return declared


def _choose(tok, role: str, flag: str | None, declared: dict, path: str, on_by: str | None = None) -> tuple[str, int, str]:
    """(token, id, source) of role "eos" or "bos": the flag, else the config files, else the guesses.
    `on_by`: the config file that turned the role on, named in the error."""
    what, candidates = _ROLES[role]
    fix = f"name one it has with --{role}-token, or turn it off with --no-{role}"
    if on_by in CONFIG_FILES:
        fix += f" (it is on because {on_by} sets add_{role}_token)"
    if flag:
        return flag, special_id(tok, flag, candidates, what, fix), "flag"
    if f"{role}_token" in declared:
        token, file = declared[f"{role}_token"]
        token_id = tok.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{fs.redact(fs.location(path).parent / file)} names {role}_token {token!r}, which "
                             f"{fs.redact(path)} does not have; fix the file, {fix}")
        return token, token_id, file
    for candidate in candidates:
        token_id = tok.token_to_id(candidate)
        if token_id is not None:
            return candidate, token_id, "guess"
    beside = f"no {role}_token in {' or '.join(CONFIG_FILES)} beside it, " if fs.location(path).name == "tokenizer.json" else ""
    raise ValueError(f"cannot find the {what} token in {fs.redact(path)} ({beside}none of {', '.join(candidates)}); {fix}")


def _bos_added_by(bos: bool | None, declared: dict) -> str | None:
    if bos is not None:
        return "flag" if bos else None
    said, file = declared.get("add_bos_token", (False, None))
    return file if said else None


def _pad(tok, declared: dict, eos: tuple | None, path: str) -> tuple[str | None, int, str]:
    """(token, id, source) of pad: the config files' pad_token, else eos, else id 0 ("none")."""
    if "pad_token" in declared:
        token, file = declared["pad_token"]
        token_id = tok.token_to_id(token)
        if token_id is not None:
            return token, token_id, file
        warnings.warn(f"{fs.redact(fs.location(path).parent / file)} names pad_token {token!r}, which "
                      f"{fs.redact(path)} does not have; padding uses {'the eos id' if eos else 'id 0'} instead",
                      stacklevel=3)
    return (eos[0], eos[1], "eos") if eos else (None, 0, "none")


def tokenizer_info(path: str, config: BuildConfig) -> TokenizerInfo:
    """The tokenizer at `path` (see resolve_tokenizer) and the eos/bos/pad a build with `config`
    uses (module docstring). config.eos / config.bos may be None: eos on; bos as the tokenizer says."""
    path = resolve_tokenizer(path)
    tok, (truncation, padding), data = _loaded(path)
    declared = declared_specials(path)
    eos = _choose(tok, "eos", config.eos_token, declared, path) if config.eos is not False else None
    bos_added_by = _bos_added_by(config.bos, declared)
    bos = _choose(tok, "bos", config.bos_token, declared, path, bos_added_by) if bos_added_by else None
    pad_token, pad_id, pad_source = _pad(tok, declared, eos, path)
    eos_token, eos_id, eos_source = eos or (None, None, None)
    bos_token, bos_id, bos_source = bos or (None, None, None)
    sha256 = hashlib.sha256(data).hexdigest()
    engine = checked_engine(path, config.encode_engine)
    return TokenizerInfo(path, sha256, tok.get_vocab_size(with_added_tokens=True),
                         eos_id, bos_id, truncation, padding, eos_token=eos_token, eos_source=eos_source,
                         bos_token=bos_token, bos_source=bos_source, bos_added_by=bos_added_by,
                         pad_token=pad_token, pad_id=pad_id, pad_source=pad_source, engine=engine.name,
                         engine_reason=engine.reason)


def resolved_config(config: BuildConfig, info: TokenizerInfo) -> BuildConfig:
    """`config` as the build ran it: eos / bos True or False as used (never None), and eos_token /
    bos_token set where a tokenizer config file chose them (a guess or a flag leaves them as given).
    What the manifest, the resume fingerprint and the already-complete check should compare: an
    edited tokenizer_config.json then reads as a different build (tokenizer.json's sha256 misses it)."""
    named = {f"{role}_token": token for role, token, source in
             (("eos", info.eos_token, info.eos_source), ("bos", info.bos_token, info.bos_source))
             if source in CONFIG_FILES}
    return dataclasses.replace(config, eos=info.eos_id is not None, bos=info.bos_id is not None, **named)


def specials_manifest(info: TokenizerInfo) -> dict:
    """The manifest's tokenizer "specials" entry, only when a tokenizer config file chose something
    (otherwise eos/bos come from config.eos_token / bos_token or the guesses, as before: {} keeps
    those builds' bytes). Roles that are off are left out:

        {"specials": {"eos": {"token": "<｜end▁of▁sentence｜>", "id": 1, "source": "tokenizer_config.json"},
                      "bos": {"token": "<｜begin▁of▁sentence｜>", "id": 0, "source": "tokenizer_config.json",
                              "added_by": "tokenizer_config.json"},
                      "pad": {"token": "<｜end▁of▁sentence｜>", "id": 1, "source": "tokenizer_config.json"}}}
    """
    sources = (info.eos_source, info.bos_source, info.bos_added_by, info.pad_source)
    if not any(source in CONFIG_FILES for source in sources):
        return {}
    specials = {}
    if info.eos_id is not None:
        specials["eos"] = {"token": info.eos_token, "id": info.eos_id, "source": info.eos_source}
    if info.bos_id is not None:
        specials["bos"] = {"token": info.bos_token, "id": info.bos_id, "source": info.bos_source,
                           "added_by": info.bos_added_by}
    specials["pad"] = {"token": info.pad_token, "id": info.pad_id, "source": info.pad_source}
    return {"specials": specials}


def describe_specials(specials: dict) -> str:
    """The manifest's "specials" entry (specials_manifest) as one line for the build summary:

        eos <｜end▁of▁sentence｜> (id 1, from tokenizer_config.json); bos <｜begin▁of▁sentence｜> (id 0,
        from tokenizer_config.json; on: its add_bos_token); pad = eos
    """
    parts = []
    for role in ("eos", "bos"):
        s = specials.get(role)
        if s is None:
            parts.append(f"{role} off")
            continue
        on = {None: "", "flag": "; on: --bos"}.get(s.get("added_by"), "; on: its add_bos_token")
        parts.append(f"{role} {s['token']} (id {s['id']}, from {s['source']}{on})")
    pad = specials.get("pad", {})
    if pad.get("source") == "eos":
        parts.append("pad = eos")
    elif pad.get("source") == "none":
        parts.append("pad id 0")
    elif pad:
        parts.append(f"pad {pad['token']} (id {pad['id']}, from {pad['source']})")
    return "; ".join(parts)
