"""Chat records with store_roles: each token's role id, from the turn it starts in (turns cut where the
template's loop takes each message, or by prefix renderings), the template's own tokens and unnamed roles
given their own ids, a template that rewrites earlier turns refused."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
from conftest import SAMPLE, TOKENIZER

from packer.config import BuildConfig, role_table
from packer.encode.chat import ChatTemplate, TemplateRefused
from packer.encode.records import RecordEncoder
from packer.encode.text import encode_texts
from packer.encode.tokenizer import load_tokenizer, tokenizer_info

CHATML = json.loads((SAMPLE / "tokenizer_config.json").read_text())["chat_template"]
SPECIALS = {"eos_token": "<|endoftext|>", "bos_token": None}
ROLES = role_table()


def _records(n=None) -> list[dict]:
    with open(SAMPLE / "chat.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f][:n]


def test_turn_starts_hand_case():
    template = ChatTemplate(CHATML, SPECIALS, ("assistant",))
    messages = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"}]
    text, spans, (starts, end) = template.spans(messages, "r", turns=True)
    assert text == "<|im_start|>system\nBe brief<|endoftext|>\n<|im_start|>user\nHi<|endoftext|>\n"
    assert starts == [0, text.index("<|im_start|>user")] == [0, 41] and end == len(text) and spans == []


def test_turns_cut_from_one_rendering_equal_those_rendered_prefix_by_prefix():
    template = ChatTemplate(CHATML, SPECIALS, ("assistant",))
    assert template._turn_by_turn  # the ChatML template: cut from the marks
    n_turns = 0
    for k, record in enumerate(_records(40)):
        messages = record["messages"]
        text, _, (starts, end) = template.spans(messages, f"record {k}", turns=True)
        assert (starts, end) == template.turn_bounds(messages, text, f"record {k}")  # no marks: rendered
        assert all(text.startswith(f"<|im_start|>{m['role']}\n", s) for m, s in zip(messages, starts))
        n_turns += len(messages)
    assert n_turns > 200


def _encoder(**config):
    config = BuildConfig(input_kind="chat", store_roles=True, **config)
    return RecordEncoder("chat", tokenizer_info(TOKENIZER, config), config, encode_texts)


class _Skips(collections.Counter):
    def add(self, reason, where):
        self[reason] += 1


def test_every_token_has_the_role_of_the_turn_it_starts_in():
    """Each run of one role id decodes to one whole turn: "<|im_start|>ROLE\\n...<|endoftext|>\\n" of that role."""
    records = _records(30)
    encoded = _encoder().encode([(f"r{k}", r) for k, r in enumerate(records)], _Skips())
    tok = load_tokenizer(TOKENIZER)
    names = {i: name for name, i in ROLES.items()}
    starts = np.concatenate([[0], np.cumsum(encoded.lengths)])
    assert len(encoded.roles) == len(encoded.ids) and len(starts) == len(records) + 1
    for k, record in enumerate(records):
        ids, roles = encoded.ids[starts[k]:starts[k + 1]], encoded.roles[starts[k]:starts[k + 1]]
        cuts = np.flatnonzero(np.diff(roles)) + 1
        runs = list(zip(np.split(ids, cuts), np.split(roles, cuts)))
        assert [names[int(r[0])] for _, r in runs] == [m["role"] for m in record["messages"]]
        for (run, r), message in zip(runs, record["messages"]):
            text = tok.decode(run.tolist(), skip_special_tokens=False)
            assert text == f"<|im_start|>{message['role']}\n{message['content']}<|endoftext|>\n"


@pytest.mark.parametrize("generation", [False, True], ids=["turn-by-turn", "generation-blocks"])
def test_template_tokens_and_unnamed_roles_get_their_own_ids(tmp_path, generation):
    """The template's own text (here its bos) is `template`, a role the table lacks `other`; turns are cut where
    the loop takes each message (turn by turn) or by prefix renderings (generation blocks)."""
    content = "{{ m.content + '\\n' }}"
    body = "{% if m.role == 'assistant' %}{% generation %}" + content + "{% endgeneration %}{% else %}" + content \
        + "{% endif %}" if generation else content
    path = tmp_path / "t.jinja"
    path.write_text("{{ bos_token }}{% for m in messages %}{{ m.role + ':\\n' }}" + body + "{% endfor %}",
                    encoding="utf-8")
    config = BuildConfig(input_kind="chat", store_roles=True, chat_template=str(path), bos_token="<|endoftext|>",
                         bos=True)
    encoder = RecordEncoder("chat", tokenizer_info(TOKENIZER, config), config, encode_texts)
    assert encoder.template._turn_by_turn is not generation
    record = {"messages": [{"role": "developer", "content": "x"}, {"role": "user", "content": "hi"},
                           {"role": "assistant", "content": "yo"}]}
    encoded = encoder.encode([("r", record)], _Skips())
    tok = load_tokenizer(TOKENIZER)
    names = {i: name for name, i in ROLES.items()}
    cuts = np.flatnonzero(np.diff(encoded.roles)) + 1
    runs = [(names[int(r[0])], tok.decode(ids.tolist(), skip_special_tokens=False))
            for ids, r in zip(np.split(encoded.ids, cuts), np.split(encoded.roles, cuts))]
    assert runs == [("template", "<|endoftext|>"), ("other", "developer:\nx\n"), ("user", "user:\nhi\n"),
                    ("assistant", "assistant:\nyo\n")]


def test_a_template_that_rewrites_earlier_turns_is_refused_only_with_store_roles(tmp_path):
    """Generation blocks give the trained spans without the prefix property; roles need it."""
    template = tmp_path / "last.jinja"
    template.write_text("{% for m in messages %}{% if loop.last %}[LAST]{% endif %}{% if m.role == 'assistant' %}"
                        "{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n"
                        "{% endfor %}", encoding="utf-8")
    record = ("r", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
    for store_roles in (False, True):
        config = BuildConfig(input_kind="chat", store_roles=store_roles, chat_template=str(template))
        encoder = RecordEncoder("chat", tokenizer_info(TOKENIZER, config), config, encode_texts)
        if not store_roles:
            assert encoder.encode([record], _Skips()).roles is None
            continue
        with pytest.raises(TemplateRefused, match="r: the chat template renders turns 0..0 .* --store-roles"):
            encoder.encode([record], _Skips())
