"""Local prompts (ids and text), the shared prefix, dataset prompts with a salt, and the per-request plan."""

from __future__ import annotations

import json

import pytest

from workers.benchmark import prompts as pr
from workers.benchmark.bodies import prompt_ids
from workers.benchmark.dataset import load_dataset
from workers.benchmark.lengths import Fixed, FromDataset, UniformRange
from workers.benchmark.tokens import approx_tokens
from workers.errors import BenchbotError


def test_local_ids_without_prefix_are_todays_client_prompts():
    """Moving the client onto this module must not change a single prompt it sends."""
    for seed, index, n in ((0, 0, 1), (7, 3, 128), (123456, 99, 1024)):
        assert pr.local_token_ids(seed, index, n) == prompt_ids(seed, index, n)


def test_shared_prefix_ids_are_shared_and_the_rest_is_not():
    a = pr.local_token_ids(5, 0, 100, prefix_tokens=60)
    b = pr.local_token_ids(5, 1, 100, prefix_tokens=60)
    other_seed = pr.local_token_ids(6, 0, 100, prefix_tokens=60)
    assert len(a) == len(b) == 100
    assert a[:60] == b[:60]
    assert a[60:] != b[60:] and a[60] != b[60]  # requests part right after the prefix
    assert a[:60] != other_seed[:60]
    assert all(x in pr.ID_RANGE for x in a)
    assert pr.local_token_ids(0, 0, 10) != pr.local_token_ids(0, 1, 10)  # no prefix: nothing shared


def test_local_text_has_the_requested_length_and_a_shared_prefix():
    for n in (1, 7, 256, 2048):
        text = pr.local_text(3, 4, n)
        assert len(text.split()) == n
        assert approx_tokens(text) == n  # 4 bytes a word with its space: exact on the simulator's count
    a = pr.local_text(3, 0, 50, prefix_tokens=20).split()
    b = pr.local_text(3, 1, 50, prefix_tokens=20).split()
    assert a[:20] == b[:20] == pr.shared_prefix_text(3, 20).split()
    assert a[20:] != b[20:]
    assert pr.local_text(3, 0, 50) == pr.local_text(3, 0, 50)


@pytest.mark.parametrize("make", [pr.local_text, pr.local_token_ids])
def test_prefix_must_leave_each_request_something(make):
    with pytest.raises(BenchbotError, match="shorter than the shortest prompt"):
        make(1, 0, 10, 10)


def test_plan_local_ids_with_length_ranges():
    plan = pr.plan_prompts(200, 11, api="generate", input_len=UniformRange(16, 64), output_len=Fixed(32))
    assert [p.index for p in plan] == list(range(200))
    assert all(p.exact_input and p.token_ids is not None and len(p.token_ids) == p.input_tokens for p in plan)
    assert {p.output_tokens for p in plan} == {32}
    assert min(p.input_tokens for p in plan) >= 16 and max(p.input_tokens for p in plan) <= 64
    assert len({p.input_tokens for p in plan}) > 20
    again = pr.plan_prompts(200, 11, api="generate", input_len=UniformRange(16, 64), output_len=Fixed(32))
    assert plan == again


def test_plan_warmup_indices_never_repeat_measured_prompts():
    measured = pr.plan_prompts(4, 1, api="completions", input_len=Fixed(8), output_len=Fixed(4))
    warmup = pr.plan_prompts(2, 1, api="completions", input_len=Fixed(8), output_len=Fixed(4), first_index=4)
    assert [w.index for w in warmup] == [4, 5]
    assert not {w.token_ids for w in warmup} & {m.token_ids for m in measured}


def test_plan_chat_makes_text_messages():
    plan = pr.plan_prompts(3, 2, api="chat", input_len=Fixed(40), output_len=UniformRange(5, 9), prefix_tokens=10)
    for p in plan:
        assert not p.exact_input and p.token_ids is None
        ((role, content),) = p.messages
        assert role == "user" and len(content.split()) == 40
        assert content.startswith(pr.shared_prefix_text(2, 10) + " ")
        assert 5 <= p.output_tokens <= 9
        assert p.chat_messages() == [{"role": "user", "content": content}]


def test_plan_refuses_what_cannot_work():
    with pytest.raises(BenchbotError, match="needs a dataset"):
        pr.plan_prompts(1, 0, api="generate", input_len=FromDataset(), output_len=Fixed(4))
    with pytest.raises(BenchbotError, match=r"prefix=100 must be shorter than the shortest prompt \(in=64-512\)"):
        pr.plan_prompts(1, 0, api="generate", input_len=UniformRange(64, 512), output_len=Fixed(4), prefix_tokens=100)
    with pytest.raises(BenchbotError, match='unknown API "grpc"'):
        pr.plan_prompts(1, 0, api="grpc", input_len=Fixed(4), output_len=Fixed(4))


@pytest.fixture
def sharegpt(tmp_path):
    path = tmp_path / "share.jsonl"
    lines = []
    for i in range(8):
        lines.append(
            json.dumps(
                {
                    "conversations": [
                        {"from": "system", "value": "You are terse."},
                        {"from": "human", "value": f"question {i} " + "word " * (10 * i + 10)},
                        {"from": "gpt", "value": "reply " * (i + 1)},
                    ]
                }
            )
        )
    lines.append(json.dumps({"prompt": "a prompt without a reply " * 5}))
    path.write_text("\n".join(lines))
    return load_dataset(path)


def test_plan_dataset_chat_keeps_messages_salts_and_uses_reply_lengths(sharegpt):
    plan = pr.plan_prompts(8, 3, api="chat", input_len=FromDataset(), output_len=FromDataset(), dataset=sharegpt)
    by_line = {c.line: c for c in sharegpt.items}
    salts = set()
    for p in plan:
        conv = by_line[p.dataset_line]
        assert p.output_tokens == conv.reply_tokens  # out=dataset: the reference reply's length
        assert p.input_tokens == conv.input_tokens + pr.SALT_WORDS
        (sys_role, sys_text), (user_role, user_text) = p.messages
        assert (sys_role, user_role) == ("system", "user")
        assert user_text == conv.messages[1][1]
        salt = pr.salt(3, p.index)
        assert sys_text == f"{salt} You are terse."
        salts.add(salt)
    assert len(salts) == 8  # every request differs from its first words: no cache hit from earlier runs
    assert 9 not in {p.dataset_line for p in plan}  # out=dataset keeps only prompts with a reply


def test_plan_dataset_text_with_prefix_and_length_filter(sharegpt):
    lengths = sorted(c.input_tokens for c in sharegpt.items)
    lo, hi = lengths[2], lengths[5]
    plan = pr.plan_prompts(
        20,
        1,
        api="completions",
        input_len=UniformRange(lo, hi),
        output_len=Fixed(16),
        dataset=sharegpt,
        prefix_tokens=12,
    )
    prefix = pr.shared_prefix_text(1, 12)
    for p in plan:
        assert p.text is not None and p.text.startswith(prefix + " " + pr.salt(1, p.index) + " ")
        assert lo + 12 + pr.SALT_WORDS <= p.input_tokens <= hi + 12 + pr.SALT_WORDS
        assert p.output_tokens == 16 and p.token_ids is None
    unsalted = pr.plan_prompts(
        2, 1, api="generate", input_len=FromDataset(), output_len=Fixed(4), dataset=sharegpt, salted=False
    )
    assert unsalted[0].text == sharegpt.sample(2, 1)[0].prompt_text


def test_a_fixed_input_length_with_a_dataset_is_explained(sharegpt):
    with pytest.raises(
        BenchbotError,
        match=r"prompts bring their own length: use in=dataset, or a range such as "
        r"in=512-2048",
    ):
        pr.plan_prompts(2, 1, api="chat", input_len=Fixed(1024), output_len=Fixed(4), dataset=sharegpt)
