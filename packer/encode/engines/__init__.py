"""The encode engines, by name: one module each, with `encode_batch(tok, texts, dtype) -> (flat ids, lengths)`.

`hf` (HuggingFace `tokenizers`) is the reference: every other engine must give its ids exactly.
"""

from packer.encode.engines import hf

ENGINES = {"hf": hf}
