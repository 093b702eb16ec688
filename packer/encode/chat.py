"""Chat templates: a conversation -> its rendered text and the character spans of its trained turns.

    messages  [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    template  ChatML-style:  <|im_start|>ROLE\\nCONTENT<|im_end|>\\n   (generation prompt <|im_start|>assistant\\n)

    text      <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n
    spans                                                       [------------------)   (41, 60)
                                                                Hello!<|im_end|>\\n

The template is rendered as transformers' `apply_chat_template` renders it (a sandboxed Jinja
environment with trim_blocks and lstrip_blocks, `raise_exception`, `tojson`, `strftime_now`,
loop controls, the tokenizer's bos_token / eos_token / ... as variables), and the trained spans
come from the template itself, one of two ways:

- `{% generation %} ... {% endgeneration %}` blocks, where the template has them: each block's
  output is a span (train_roles is then not read: the template says what the model generates).
- Otherwise, prefixes: for a trained turn k, the text of turns 0..k-1 with the generation prompt
  (for an assistant turn; without it for other roles) must be a prefix of the text of turns 0..k,
  which must be a prefix of the whole conversation's text; the span is what lies between. A
  template for which a prefix is not a prefix (one that rewrites earlier turns once later ones
  exist) is refused: TemplateRefused names the record and the first difference. Where the
  template's syntax shows that its loop renders each turn from that turn alone (ChatML, Llama 3:
  packer/encode/chat_turns.py), those prefix texts are cut from one rendering of the conversation,
  marked where the loop takes each turn, instead of rendered one by one (a conversation of n turns
  renders once, not about n times), and checked the same way.

A record the template itself rejects (raise_exception: "roles must alternate", an undefined
variable) is a RecordError with reason template_error: skipped and counted, like any bad record.
"""

from __future__ import annotations

import functools
import json
import re
from datetime import datetime

from packer.encode.chat_turns import content_verbatim, renders_turn_by_turn

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


class TemplateRefused(ValueError):
    """The template cannot give exact trained spans: the build stops (one line: record, turn, difference)."""


class RecordError(ValueError):
    """One record cannot be used (`reason` is its skip reason)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


def _generation_extension():
    import jinja2
    from jinja2.ext import Extension

    class Generation(Extension):
        """{% generation %}...{% endgeneration %}: record the character span of the block's output
        in the text rendered so far (as transformers' AssistantTracker does)."""

        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            environment.extend(generation_tracking=None)

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_track"), [], [], body).set_lineno(lineno)

        def _track(self, caller):
            out = caller()
            tracking = self.environment.generation_tracking  # [characters rendered so far, spans]
            if tracking is not None:
                tracking[1].append((tracking[0], tracking[0] + len(out)))
            return out

    return Generation


@functools.lru_cache(maxsize=8)
def compile_template(source: str):
    """The template compiled in transformers' environment (see the module docstring)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_generation_extension(), jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"the chat template is not valid Jinja (line {e.lineno}: {e.message}); fix it or give "
                         "another with --chat-template FILE") from None


@functools.lru_cache(maxsize=8)
def _renders_turn_by_turn(source: str, names: frozenset) -> bool:
    """chat_turns.renders_turn_by_turn, once per template (a parse: ~1 ms, and a ChatTemplate is made per unit)."""
    return renders_turn_by_turn(compile_template(source).environment, source, names)


@functools.lru_cache(maxsize=8)
def _content_verbatim(source: str) -> bool:
    """chat_turns.content_verbatim, once per template."""
    return content_verbatim(compile_template(source).environment, source)


@functools.lru_cache(maxsize=1)
def _context_class():
    """jinja2's Context (and its EvalContext), built as Context.__init__ builds them but from values
    made once per template: the globals' names (a frozenset, only read), no copy of an empty block
    table: 1.0 of its 2.0 us a render."""
    from jinja2.runtime import Context, EvalContext

    class _EvalContext(EvalContext):
        def __init__(self, environment, autoescape: bool):
            self.environment, self.autoescape, self.volatile = environment, autoescape, False

    class _Context(Context):
        def __init__(self, environment, parent: dict, name, blocks: dict, globals_keys: frozenset):
            self.parent, self.vars, self.environment = parent, {}, environment
            escape = environment.autoescape
            self.eval_ctx = _EvalContext(environment, escape(name) if callable(escape) else escape)
            self.exported_vars, self.name, self.globals_keys = set(), name, globals_keys
            self.blocks = {k: [v] for k, v in blocks.items()} if blocks else {}

    return _Context


@functools.lru_cache(maxsize=1)
def _template_errors() -> tuple[type[Exception], ...]:
    """What a rendering raises on a conversation the template rejects (jinja2 imported when needed)."""
    import jinja2

    return jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError


class ChatTemplate:
    """One compiled template with the tokenizer's special-token strings; renders conversations and
    finds their trained spans (module docstring)."""

    def __init__(self, source: str, specials: dict[str, str], roles: tuple[str, ...]):
        self.template = compile_template(source)
        self.specials = dict(specials)
        self.roles = frozenset(roles)
        self.has_generation = GENERATION.search(source) is not None
        self._variables = {**self.template.globals, "tools": None, "documents": None, **self.specials}
        self._global_names = frozenset(self.template.globals)  # what Context keeps of `globals`: set(globals)
        self._render_func = self.template.root_render_func
        self._new_context = _context_class()
        # packer/encode/chat_turns.py: one rendering gives every prefix rendering
        self._turn_by_turn = not self.has_generation and _renders_turn_by_turn(
            source, frozenset({*self.specials, "tools", "documents"}))
        # a content may be rendered as a stand-in, then put back (packer/encode/chat_long.py)
        self.content_verbatim = self._turn_by_turn and _content_verbatim(source)
        self._ends: tuple[str, str] | None = None  # no turns rendered, without and with the generation prompt

    def _context(self, messages: list, add_generation_prompt: bool):
        """The context Template.render / generate make (_context_class), minus their per-call merge
        of the globals into the variables (done once, in __init__)."""
        template = self.template
        return self._new_context(template.environment, {**self._variables, "messages": messages,
                                                        "add_generation_prompt": add_generation_prompt},
                                 template.name, template.blocks, self._global_names)

    def render(self, messages: list, add_generation_prompt: bool = False) -> str:
        """Template.render with the context of _context: the same text, 2.5x faster on a 9-turn
        ChatML conversation (4.1 against 10.2 us, 2026-12-01), which matters where a conversation
        renders once per trained turn twice (spans: 26.8 us; 8.3 us cut from one marked rendering)."""
        return "".join(self._render_func(self._context(messages, add_generation_prompt)))

    def _render_tracked(self, messages: list) -> tuple[str, list[tuple[int, int]]]:
        blocks, spans = [], []
        env = self.template.environment
        env.generation_tracking = tracking = [0, spans]
        try:
            for block in self._render_func(self._context(messages, False)):
                blocks.append(block)
                tracking[0] += len(block)
        finally:
            env.generation_tracking = None
        return "".join(blocks), spans

    def spans(self, messages: list, where: str, turns: bool = False):
        """(text, [(start, end), ...] character spans to train, in order, not overlapping); with
        `turns`, also (where each turn starts in the text, where the last ends): turn_bounds."""
        import jinja2

        marks = None
        try:
            if self.has_generation:
                text, spans = self._render_tracked(messages)
                spans = [(a, b) for a, b in spans if b > a]
            elif self._turn_by_turn:
                text, marks = self._render_marked(messages)
            else:
                text = self.render(messages)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as e:
            raise RecordError("template_error", f"{type(e).__name__}: {e}") from None
        if not self.has_generation:
            spans = self._cut_spans(messages, text, marks, where) if marks is not None else None
            if spans is None:
                spans = self._prefix_spans(messages, text, where)
        if not turns:
            return text, spans
        return text, spans, self.turn_bounds(messages, text, where, marks)

    def turn_bounds(self, messages: list, text: str, where: str, marks: list[int] | None = None):
        """(where each turn starts in the conversation's text, where the last one ends): what lies
        before the first turn and after the last is the template's own text. Where the template
        renders turn by turn (packer/encode/chat_turns.py), turn k is what its loop writes for message
        k (`marks`, _render_marked). Otherwise turn k is what rendering turns 0..k adds to rendering
        turns 0..k-1 (without the generation prompt), so it starts at the length of that rendering,
        which must be a prefix of the text (else TemplateRefused), and the last turn ends the text.

            <|im_start|>system\\nBe brief<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n   -> ([0, 38], 68)
        """
        if marks is not None and len(marks) == len(messages) + 1:
            return marks[:-1], marks[-1]
        starts = []
        for k in range(len(messages)):
            head = self._prefix(messages[:k], False, where, k) if k else self._empty_rendering()
            if not text.startswith(head) or (starts and len(head) < starts[-1]):
                raise TemplateRefused(
                    f"{where}: the chat template renders turns 0..{k - 1} as text that is not a prefix of the whole "
                    f"conversation, so where turn {k} starts (its tokens' role) cannot be found exactly; build "
                    "without --store-roles, or use a template that renders earlier turns the same whatever follows")
            starts.append(len(head))
        return starts, len(text)

    def _empty_rendering(self) -> str:
        """The text of no turns ("" where the template reads messages[0])."""
        try:
            return self.render([], False)
        except _template_errors():
            return ""

    def _render_marked(self, messages: list) -> tuple[str, list[int]]:
        """The conversation's text and, for each turn and the end, where the template's loop took it
        (packer/encode/chat_turns.py: marks[k] is the length of the text before turn k)."""
        chunks, marks, size = [], [], [0]

        def turns():
            for message in messages:
                marks.append(size[0])
                yield message
            marks.append(size[0])

        for chunk in self._render_func(self._context(turns(), False)):
            chunks.append(chunk)
            size[0] += len(chunk)
        return "".join(chunks), marks

    def _cut_spans(self, messages: list, text: str, marks: list[int], where: str) -> list[tuple[int, int]] | None:
        """_prefix_spans with each prefix rendering cut from `text` (packer/encode/chat_turns.py):
        turns < k rendered = text[:marks[k]] + the ending; None when the loop did not take every turn
        once or the text before it differs from that of no turns (not the shape: render them)."""
        if self._ends is None:
            try:
                self._ends = self.render([], False), self.render([], True)
            except _template_errors():  # not expected of outputs of constants: then render the prefixes
                self._turn_by_turn = False
                return None
        before, (bare, prompted) = marks[0], self._ends
        if len(marks) != len(messages) + 1 or not (bare.startswith(text[:before]) and prompted.startswith(text[:before])):
            return None
        bare, prompted = bare[before:], prompted[before:]
        spans, n_bare = [], len(bare)
        for k, message in enumerate(messages):
            role = message["role"]
            if role not in self.roles:
                continue
            end = prompted if role == "assistant" else bare
            start, stop = marks[k], marks[k + 1]
            head_in_turn = text.startswith(end, start, stop) if len(end) <= stop - start else \
                (text[start:stop] == end[:stop - start] and bare.startswith(end[stop - start:]))
            if not head_in_turn:
                self._require_prefix(text[:start] + end, text[:stop] + bare, where, k, "the turns before it" + (
                    " + the generation prompt" if role == "assistant" else ""), "the conversation up to it")
            if not text.startswith(bare, stop):
                self._require_prefix(text[:stop] + bare, text, where, k, "the conversation up to it",
                                     "the whole conversation")
            if stop + n_bare > start + len(end):
                spans.append((start + len(end), stop + n_bare))
        return spans

    def _prefix_spans(self, messages: list, text: str, where: str) -> list[tuple[int, int]]:
        """Each trained turn's span from two prefix renderings; a rendering two turns need (the turn
        before a trained non-assistant one) is made once, and that of all the turns is `text`."""
        spans, roles, n = [], self.roles, len(messages)
        last_turn, turn = -2, ""  # the last turn rendered to (without the generation prompt), its text
        for k, message in enumerate(messages):
            role = message["role"]
            if role not in roles:
                continue
            assistant = role == "assistant"
            head = turn if last_turn == k - 1 and not assistant else self._prefix(messages[:k], assistant, where, k)
            last_turn, turn = k, text if k == n - 1 else self._prefix(messages[:k + 1], False, where, k)
            if not turn.startswith(head):
                self._require_prefix(head, turn, where, k, "the turns before it" + (" + the generation prompt" if
                                     assistant else ""), "the conversation up to it")
            if not text.startswith(turn):
                self._require_prefix(turn, text, where, k, "the conversation up to it", "the whole conversation")
            if len(turn) > len(head):
                spans.append((len(head), len(turn)))
        return spans

    def _prefix(self, messages: list, generation_prompt: bool, where: str, k: int) -> str:
        try:
            return self.render(messages, add_generation_prompt=generation_prompt)
        except _template_errors() as e:
            if not messages and not generation_prompt:
                return ""  # many templates read messages[0]: no turn before the first renders as nothing
            raise TemplateRefused(f"{where}: the chat template fails on the first {k} turns of the conversation "
                                  f"({type(e).__name__}: {e}), so the span of turn {k} cannot be found; "
                                  "use a template with {% generation %} blocks (--chat-template FILE)") from None

    @staticmethod
    def _require_prefix(short: str, long: str, where: str, k: int, short_name: str, long_name: str):
        if long.startswith(short):
            return
        at = next((i for i, (a, b) in enumerate(zip(short, long)) if a != b), min(len(short), len(long)))
        raise TemplateRefused(
            f"{where}: the chat template breaks the prefix property at turn {k}: the text of {short_name} is not a "
            f"prefix of the text of {long_name} (they differ at character {at}: {short[at:at + 40]!r} vs "
            f"{long[at:at + 40]!r}), so its trained tokens cannot be found exactly; use a template that renders "
            "earlier turns the same whatever follows, or one with {% generation %} blocks (--chat-template FILE)")
