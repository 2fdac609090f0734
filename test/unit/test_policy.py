import pytest

from sglang_adaptive.policy import (
    AlternatePolicy,
    PolicyConfig,
    ThresholdPolicy,
    make_policy,
    plain_kv_reserve,
)


def test_threshold_speculates_up_to_n_requests():
    policy = ThresholdPolicy(16)
    assert [policy.speculate(bs) for bs in (1, 16, 17, 128)] == [True, True, False, False]
    assert ThresholdPolicy(0).speculate(1) is False


def test_threshold_rejects_negative():
    with pytest.raises(ValueError):
        ThresholdPolicy(-1)


def test_alternate_pattern_and_purity():
    policy = AlternatePolicy(2)
    seen = []
    for _ in range(8):
        # Asked several times per step (memory check, retraction, prepare): same answer.
        answers = {policy.speculate(bs) for bs in (1, 7, 64)}
        assert len(answers) == 1
        seen.append(answers.pop())
        policy.on_launch(seen[-1])
    assert seen == [True, True, False, False, True, True, False, False]


def test_make_policy():
    assert make_policy(PolicyConfig("threshold", threshold=3)).threshold == 3
    assert make_policy(PolicyConfig("alternate", alternate_period=7)).period == 7
    assert not PolicyConfig().enabled and PolicyConfig("threshold", 1).enabled
    with pytest.raises(ValueError):
        make_policy(PolicyConfig("threshold"))
    with pytest.raises(ValueError, match="no switching policy for 'goodput-someday'"):
        make_policy(PolicyConfig("goodput-someday"))
    # 'off' builds no adaptive worker, so there is no policy to make for it.
    with pytest.raises(ValueError, match="no switching policy for 'off'"):
        make_policy(PolicyConfig())


@pytest.mark.parametrize(
    "last_width, overlap, reserve",
    [(1, True, 2), (4, True, 5), (1, False, 1), (4, False, 1)],
)
def test_plain_reserve_covers_in_flight_batch(last_width, overlap, reserve):
    assert plain_kv_reserve(last_width, overlap) == reserve
