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
    # Aitchison et al. 2023, the Atari-5 regression's weights (no intercept)
    assert ATARI5_WEIGHTS == {"BattleZone": 0.3820, "DoubleDunk": 0.0679,
                              "NameThisGame": 0.3108, "Phoenix": 0.1241, "Qbert": 0.0805}
    assert math.isclose(sum(ATARI5_WEIGHTS.values()), 0.9653)


def test_the_atari5_games_random_and_human_scores_are_the_standard_tables():
    # DQN Zoo's atari_data.py (Badia et al. 2020's table), game by game
    assert {game: RANDOM_HUMAN[game] for game in ATARI5_WEIGHTS} == {
        "BattleZone": (2360.0, 37187.5), "DoubleDunk": (-18.6, -16.4),
        "NameThisGame": (2292.3, 8049.0), "Phoenix": (761.4, 7242.6),
        "Qbert": (163.9, 13455.0)}


def test_dopamine_dqns_estimate_step_by_step():
    """Dopamine's DQN at 10M frames, by hand: HNS per game, then the weighted log."""
    scores = REFERENCES["dopamine_dqn_10m"]["scores"]
    hns = {game: human_normalized(game, score) for game, score in scores.items()}
    assert hns == pytest.approx({
        "BattleZone": 100 * (15395 - 2360) / 34827.5,  # 37.43
        "DoubleDunk": 100 * (-17.6 + 18.6) / 2.2,  # 45.45
        "NameThisGame": 100 * (5553 - 2292.3) / 5756.7,  # 56.64
        "Phoenix": 100 * (4229 - 761.4) / 6481.2,  # 53.50
        "Qbert": 100 * (1245 - 163.9) / 13291.1})  # 8.13
    # sum_g w_g log10(1 + HNS_g) = 0.6054 + 0.1132 + 0.5472 + 0.2155 + 0.0773 = 1.5586
    assert atari5_estimate(scores) == pytest.approx(10 ** 1.5586 - 1, abs=0.02)  # 35.19
