"""Chat templates whose loop renders each turn from that turn alone: one rendering gives all the prefix renderings.

    {% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + eos_token + '\\n' }}
    {% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}

    text      P | turn 0 | turn 1 | ... | turn n-1 | end(False)    P: before the loop; end(gp): after it
    marks     ^ len(P)  ^ where the loop takes each next message ... ^ where it ends
    messages[:k] rendered, with add_generation_prompt=gp  ==  text[:marks[k]] + end(gp)

That holds for a template of this shape (checked on its syntax tree; anything else is "no", and
the turns are rendered one prefix at a time, packer/encode/chat.py):

- outputs of constants and special tokens (bos_token, ...), at most one `{% set x = messages %}`,
  then one `{% for message in messages %}` (or x) without else, filter or recursion, then outputs
  of constants and special tokens, bare or in `{% if add_generation_prompt %}` ... `{% else %}`;
- the loop's body: outputs, ifs and sets, reading only the message, loop.index / index0 / first,
  special tokens, constants, and names the body itself set unconditionally before (nothing flows
  from one turn to the next, nothing looks ahead: no loop.last, no messages); calling only pure
  filters and tests, and raise_exception.

Then rendering messages[:k] runs P, the same first k turns and the ending, with nothing else to
tell them apart: its text is the one above, and the prefix property (the turns before a turn are a
prefix of the conversation up to it) is checked on those texts as on rendered ones.
"""

from __future__ import annotations

PURE_FILTERS = frozenset({"trim", "upper", "lower", "title", "capitalize", "replace", "string", "default", "d",
                          "length", "count", "tojson", "int", "float"})
PURE_TESTS = frozenset({"defined", "undefined", "none", "string", "number", "mapping", "sequence", "iterable",
                        "boolean", "true", "false", "integer", "float", "eq", "ne", "equalto", "sameas", "in",
                        "lt", "le", "gt", "ge", "odd", "even"})
LOOP_ATTRIBUTES = frozenset({"index", "index0", "first"})  # what a turn may know of the loop: its own position


def renders_turn_by_turn(environment, source: str, specials) -> bool:
    """Whether the template has the shape of the module docstring (its text per prefix is cut from
    one rendering). `specials`: the names the tokenizer's special tokens are given under."""
    from jinja2 import nodes

    body = environment.parse(source).body
    specials = frozenset(specials) - _stored_names(body, nodes)
    loops = [i for i, node in enumerate(body) if isinstance(node, nodes.For)]
    if len(loops) != 1:
        return False
    before, loop, after = body[:loops[0]], body[loops[0]], body[loops[0] + 1:]
    alias = [n for n in before if isinstance(n, nodes.Assign)]
    if len(alias) > 1 or (alias and not (isinstance(alias[0].target, nodes.Name) and _is_name(alias[0].node, "messages"))):
        return False
    sources = {"messages", *(a.target.name for a in alias)}
    if not (isinstance(loop.target, nodes.Name) and isinstance(loop.iter, nodes.Name) and loop.iter.name in sources
            and not loop.else_ and loop.test is None and not loop.recursive and loop.target.name not in sources):
        return False
    constant = _Reads(nodes, specials)
    if not all(isinstance(n, nodes.Assign) or _constant_output(n, constant, nodes) for n in before):
        return False
    if not all(_constant_output(n, constant, nodes) or _generation_prompt(n, constant, nodes) for n in after):
        return False
    return _Reads(nodes, specials, loop.target.name).statements(loop.body)


def _stored_names(body, nodes) -> frozenset:
    return frozenset(n.name for n in _walk(body, nodes) if isinstance(n, nodes.Name) and n.ctx != "load")


def _walk(items, nodes):
    for item in items:
        yield item
        yield from item.find_all(nodes.Node)


def _is_name(node, name: str) -> bool:
    return type(node).__name__ == "Name" and node.name == name and node.ctx == "load"


def _constant_output(node, reads, nodes) -> bool:
    return isinstance(node, nodes.Output) and all(reads.expression(n) for n in node.nodes)


def _generation_prompt(node, reads, nodes) -> bool:
    """{% if add_generation_prompt %} constant outputs {% else %} constant outputs {% endif %}"""
    return (isinstance(node, nodes.If) and _is_name(node.test, "add_generation_prompt") and not node.elif_
            and all(_constant_output(n, reads, nodes) for n in [*node.body, *node.else_]))


class _Reads:
    """The loop body's check: which names an expression may read (the message, names set earlier in
    this turn, special tokens), and the statements and expressions allowed."""

    def __init__(self, nodes, specials: frozenset, message: str | None = None):
        self.nodes, self.specials, self.message, self.defined = nodes, specials, message, set()

    def statements(self, body, conditional: bool = False) -> bool:
        n = self.nodes
        for node in body:
            if isinstance(node, n.Output):
                ok = all(self.expression(e) for e in node.nodes)
            elif isinstance(node, n.If):
                ok = self.expression(node.test) and self.statements(node.body, True) and self.statements(node.else_, True) \
                    and all(self.expression(e.test) and self.statements(e.body, True) for e in node.elif_)
            elif isinstance(node, n.Assign) and isinstance(node.target, n.Name):
                name = node.target.name
                ok = self.expression(node.node) and name not in (self.message, "loop") and name not in self.specials \
                    and (name in self.defined or not conditional)  # a value set in an if was set before it
                self.defined.add(name)
            else:
                ok = False
            if not ok:
                return False
        return True

    def expression(self, node) -> bool:
        n = self.nodes
        if isinstance(node, (n.Const, n.TemplateData)):
            return True
        if isinstance(node, n.Name):
            return node.ctx == "load" and (node.name in self.specials or node.name in self.defined
                                           or (self.message is not None and node.name == self.message))
        if isinstance(node, n.Getattr) and _is_name(node.node, "loop"):
            return self.message is not None and node.attr in LOOP_ATTRIBUTES
        if isinstance(node, (n.Filter, n.Test)):
            names = PURE_FILTERS if isinstance(node, n.Filter) else PURE_TESTS
            return (node.name in names and node.dyn_args is None and node.dyn_kwargs is None
                    and (node.node is None or self.expression(node.node)) and self._all([*node.args, *node.kwargs]))
        if isinstance(node, n.Call):
            return (_is_name(node.node, "raise_exception") and node.dyn_args is None and node.dyn_kwargs is None
                    and self._all([*node.args, *node.kwargs]))
        if isinstance(node, (n.Getitem, n.Getattr, n.BinExpr, n.UnaryExpr, n.Compare, n.Operand, n.CondExpr, n.Concat,
                             n.List, n.Tuple, n.Dict, n.Pair, n.Keyword, n.Slice)):
            return self._all(list(node.iter_child_nodes()))
        return False

    def _all(self, items) -> bool:
        return all(self.expression(e) for e in items)


def content_verbatim(environment, source: str) -> bool:
    """Whether, in a template of renders_turn_by_turn's shape, each message's content reaches the text
    only as itself: read as message['content'] or message.content, and only inside an output, joined
    to the rest by + or ~ (never tested, filtered, set, sliced or passed on), and the message never
    read but by a constant key. Then a conversation rendered with a content swapped for a stand-in
    is its text with the stand-in where the content goes (packer/encode/chat_long.py relies on it).

        {{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + eos_token }}    yes
        {{ message['content'] | trim }}      {% if '<think>' in message.content %}            no"""
    from jinja2 import nodes

    loop = next((n for n in environment.parse(source).body if isinstance(n, nodes.For)), None)
    if loop is None or not isinstance(loop.target, nodes.Name):
        return False
    name, joined = loop.target.name, set()
    for output in _walk(loop.body, nodes):
        if isinstance(output, nodes.Output):
            todo = list(output.nodes)
            while todo:  # the output's + / ~ chain: a content read at its leaves goes in as itself
                e = todo.pop()
                if isinstance(e, nodes.Add):
                    todo += [e.left, e.right]
                elif isinstance(e, nodes.Concat):
                    todo += e.nodes
                elif _content_read(e, name):
                    joined.add(id(e))
    for parent in _walk(loop.body, nodes):
        for child in parent.iter_child_nodes():
            if not _is_name(child, name):
                continue
            key = parent.attr if isinstance(parent, nodes.Getattr) else \
                parent.arg.value if isinstance(parent, nodes.Getitem) and isinstance(parent.arg, nodes.Const) else None
            if not isinstance(key, str) or key in _DICT_METHODS or (key == "content" and id(parent) not in joined):
                return False
    return True


_DICT_METHODS = frozenset(dir(dict))  # message.get('content'), .items(): the content read another way


def _content_read(node, name: str) -> bool:
    kind = type(node).__name__
    if kind == "Getattr":
        return node.attr == "content" and _is_name(node.node, name)
    return kind == "Getitem" and _is_name(node.node, name) and type(node.arg).__name__ == "Const" \
        and node.arg.value == "content"
