"""Human-normalised scores and the Atari-5 estimate: hand-computed cases and the papers'
published figures (Aitchison et al. 2023's check: the five scores predict the median)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from atari_scores import (  # noqa: E402
    ATARI5_WEIGHTS,
    RANDOM_HUMAN,
    REFERENCES,
    atari5_estimate,
    human_normalized,
)


def test_the_table_has_the_57_games_with_human_above_random():
    assert len(RANDOM_HUMAN) == 57
    assert all(human > random for random, human in RANDOM_HUMAN.values())
    assert RANDOM_HUMAN["Qbert"] == (163.9, 13455.0)


def test_human_normalized_score_hand_computed():
    # Qbert: random 163.9, human 13,455 -> (6,809.45 - 163.9) / 13,291.1 = 50%
    assert human_normalized("Qbert", 163.9 + 13291.1 / 2) == pytest.approx(50.0)
    assert human_normalized("Pong", -20.7) == 0.0
    assert human_normalized("DoubleDunk", -16.4) == pytest.approx(100.0)
    assert human_normalized("DoubleDunk", -19.7) == pytest.approx(-50.0)


def test_an_unknown_game_is_refused_by_name():
    with pytest.raises(KeyError, match="no random and human score for 'Pongg'"):
        human_normalized("Pongg", 0.0)


def test_atari5_estimate_hand_computed():
    # Every game at human level: 10^(sum w log10(101)) - 1 = 101^0.9653 - 1.
    human = {game: RANDOM_HUMAN[game][1] for game in ATARI5_WEIGHTS}
    assert atari5_estimate(human) == pytest.approx(101 ** 0.9653 - 1)
    # Below random counts as 0: every game at random or worse gives 0.
    worse = {game: RANDOM_HUMAN[game][0] - 5 for game in ATARI5_WEIGHTS}
    assert atari5_estimate(worse) == 0.0
    # One game alone: Qbert at 999% HNS, the others at random: 1000^0.0805 - 1.
    one = {game: RANDOM_HUMAN[game][0] for game in ATARI5_WEIGHTS}
    random, human_score = RANDOM_HUMAN["Qbert"]
    one["Qbert"] = random + 9.99 * (human_score - random)
    assert atari5_estimate(one) == pytest.approx(1000 ** 0.0805 - 1)


@pytest.mark.parametrize("reference, expected", [
    ("impala_deep_200m", 226.0),  # against its 57-game median of 191.8%
    ("apex_22b", 475.0),  # against 434.1%
    ("dopamine_dqn_10m", 35.0),
    ("dopamine_rainbow_10m", 39.0),
])
def test_atari5_estimate_of_the_published_scores(reference, expected):
    assert atari5_estimate(REFERENCES[reference]["scores"]) == pytest.approx(expected, abs=0.6)


def test_a_missing_game_is_named():
    scores = dict(REFERENCES["dopamine_dqn_10m"]["scores"])
    del scores["Phoenix"]
    with pytest.raises(KeyError, match="missing Phoenix"):
        atari5_estimate(scores)


def test_the_weights_are_the_papers():
    assert math.isclose(sum(ATARI5_WEIGHTS.values()), 0.9653)
