"""diffattn.data.synthetic: the multi-needle and MQAR generators."""

import pytest
import torch

from diffattn.data.synthetic import NEEDLE, QUERY, SyntheticVocab, mqar_batch, needle_batch


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def test_vocab_ranges_are_disjoint_and_sized():
    v = SyntheticVocab(num_keys=5, num_values=7, num_filler=11)
    assert (v.first_key, v.first_value, v.first_filler, v.size) == (3, 8, 15, 26)
    assert v.is_value(torch.tensor([7, 8, 14, 15])).tolist() == [False, True, True, False]


@pytest.mark.parametrize("needles,queried", [(1, 1), (2, 2), (4, 2), (6, 2)])
def test_needle_batch_answer_is_the_value_of_the_queried_key(needles, queried):
    v = SyntheticVocab()
    b = needle_batch(20, length=64, needles=needles, queried=queried, depth=None, generator=_g(), vocab=v)
    assert b.ids.shape == (20, 64) and b.answer_pos.shape == b.answers.shape == b.answer_span.shape == (20, queried)
    assert b.context == 64 - 3 * queried
    for i in range(20):
        ids = b.ids[i]
        ctx = ids[:b.context]
        assert int((ctx == NEEDLE).sum()) == needles  # exactly N needles, none in the distractors
        needle_at = (ctx == NEEDLE).nonzero().flatten()
        keys = ctx[needle_at + 1]
        assert len(set(keys.tolist())) == needles  # distinct keys
        for r in range(queried):
            p = int(b.answer_pos[i, r])
            assert int(ids[p - 1]) == QUERY
            key = int(ids[p])
            assert int(ids[p + 1]) == int(b.answers[i, r])
            j = (keys == key).nonzero().flatten()
            assert len(j) == 1  # the queried key stands in exactly one needle ...
            value = int(ctx[needle_at[j[0]] + 2])
            assert value == int(b.answers[i, r])  # ... and the answer is that needle's value
            assert int(b.answer_span[i, r]) == int(needle_at[j[0]]) + 2
            assert bool(v.is_value(b.answers[i, r]))


@pytest.mark.parametrize("depth,slot", [(0.0, 0), (0.5, 10), (1.0, 20)])
def test_needle_depth_places_the_first_queried_needle(depth, slot):
    # length 66 with 1 query: a context of 63 tokens = 21 slots of 3; depth d puts the needle at slot round(20 d)
    b = needle_batch(5, length=66, needles=4, queried=1, depth=depth, generator=_g(1))
    assert (b.answer_span[:, 0] == 3 * slot + 2).all()
    assert (b.ids[:, 3 * slot] == NEEDLE).all()


def test_needle_depth_with_a_leading_remainder():
    # context 64 - 6 = 58 tokens: 19 slots and 1 leading distractor token
    b = needle_batch(3, length=64, needles=2, queried=2, depth=1.0, generator=_g())
    assert (b.answer_span[:, 0] == 1 + 3 * 18 + 2).all()
    assert not (b.ids[:, 0] == NEEDLE).any()


def test_generators_are_deterministic_per_seed():
    a = needle_batch(4, length=40, needles=3, queried=2, depth=0.25, generator=_g(7))
    b = needle_batch(4, length=40, needles=3, queried=2, depth=0.25, generator=_g(7))
    c = needle_batch(4, length=40, needles=3, queried=2, depth=0.25, generator=_g(8))
    assert torch.equal(a.ids, b.ids) and torch.equal(a.answers, b.answers)
    assert not torch.equal(a.ids, c.ids)
    m1, m2 = mqar_batch(4, pairs=5, generator=_g(3)), mqar_batch(4, pairs=5, generator=_g(3))
    assert torch.equal(m1.ids, m2.ids) and torch.equal(m1.answers, m2.answers)


def test_mqar_batch_queries_every_key_once_with_its_value():
    v = SyntheticVocab(num_keys=16, num_values=16)
    b = mqar_batch(10, pairs=6, generator=_g(), vocab=v)
    assert b.ids.shape == (10, 24) and b.answers.shape == (10, 6) and b.context == 12
    assert b.answer_pos[0].tolist() == [12, 14, 16, 18, 20, 22]
    for i in range(10):
        ids = b.ids[i].tolist()
        pairs = dict(zip(ids[0:12:2], ids[1:12:2]))
        assert len(pairs) == 6  # distinct keys
        assert sorted(ids[12::2]) == sorted(pairs)  # every key queried once
        for r in range(6):
            p = int(b.answer_pos[i, r])
            assert pairs[ids[p]] == ids[p + 1] == int(b.answers[i, r])
            assert ids[int(b.answer_span[i, r])] == int(b.answers[i, r])
            assert ids[int(b.answer_span[i, r]) - 1] == ids[p]


@pytest.mark.parametrize("kwargs,match", [
    (dict(n=0), "n must be an integer >= 1, got 0"),
    (dict(needles=3, queried=4), r"queried must be <= needles \(3\), got 4"),
    (dict(length=10, needles=3, queried=2), r"length must leave .*>= 15 for needles=3.*got 10"),
    (dict(depth=1.5), r"depth must be None or a number in \[0, 1\], got 1.5"),
    (dict(needles=40, queried=1, length=200), r"needles must be <= vocab.num_keys \(32"),
    (dict(generator=0), "generator must be a torch.Generator"),
])
def test_needle_batch_bad_arguments(kwargs, match):
    args = dict(n=2, length=64, needles=2, queried=1, depth=0.5, generator=_g())
    args.update(kwargs)
    n = args.pop("n")
    with pytest.raises((ValueError, TypeError), match=match):
        needle_batch(n, **args)


def test_mqar_and_vocab_bad_arguments():
    with pytest.raises(ValueError, match="pairs must be an integer >= 1, got 0"):
        mqar_batch(2, pairs=0, generator=_g())
    with pytest.raises(ValueError, match=r"pairs must be <= vocab.num_keys \(4"):
        mqar_batch(2, pairs=5, generator=_g(), vocab=SyntheticVocab(num_keys=4))
    with pytest.raises(ValueError, match="num_filler must be an integer >= 1, got 0"):
        SyntheticVocab(num_filler=0)
