"""Human-normalised Atari scores and the Atari-5 estimate of the 57-game median.

Random and human scores: the standard 57-game table (Badia et al. 2020, "Agent57"; the
figures of DQN Zoo's ``atari_data.py``): each the mean undiscounted
return of a uniformly random agent and of a professional human tester, episodes started
after 1-30 no-ops and capped at 108,000 frames. The human-normalised score (HNS) of a
return is ``100 (score - random) / (human - random)``, in percent.

Atari-5 (Aitchison, Sweetser and Hutter 2023, "Atari-5: Distilling the Arcade Learning
Environment down to Five Games", ICML): the 57-game median HNS predicted from five games
by a regression in log space, ``10^(sum_g w_g log10(1 + max(HNS_g, 0))) - 1``; within
about 10% of the true median on the paper's held-out algorithms. Its weights have no
intercept and do not sum to 1 (0.9653).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# game (ALE name) -> (random, human)
RANDOM_HUMAN: dict[str, tuple[float, float]] = {
    "Alien": (227.8, 7127.7),
    "Amidar": (5.8, 1719.5),
    "Assault": (222.4, 742.0),
    "Asterix": (210.0, 8503.3),
    "Asteroids": (719.1, 47388.7),
    "Atlantis": (12850.0, 29028.1),
    "BankHeist": (14.2, 753.1),
    "BattleZone": (2360.0, 37187.5),
    "BeamRider": (363.9, 16926.5),
    "Berzerk": (123.7, 2630.4),
    "Bowling": (23.1, 160.7),
    "Boxing": (0.1, 12.1),
    "Breakout": (1.7, 30.5),
    "Centipede": (2090.9, 12017.0),
    "ChopperCommand": (811.0, 7387.8),
    "CrazyClimber": (10780.5, 35829.4),
    "Defender": (2874.5, 18688.9),
    "DemonAttack": (152.1, 1971.0),
    "DoubleDunk": (-18.6, -16.4),
    "Enduro": (0.0, 860.5),
    "FishingDerby": (-91.7, -38.7),
    "Freeway": (0.0, 29.6),
    "Frostbite": (65.2, 4334.7),
    "Gopher": (257.6, 2412.5),
    "Gravitar": (173.0, 3351.4),
    "Hero": (1027.0, 30826.4),
    "IceHockey": (-11.2, 0.9),
    "Jamesbond": (29.0, 302.8),
    "Kangaroo": (52.0, 3035.0),
    "Krull": (1598.0, 2665.5),
    "KungFuMaster": (258.5, 22736.3),
    "MontezumaRevenge": (0.0, 4753.3),
    "MsPacman": (307.3, 6951.6),
    "NameThisGame": (2292.3, 8049.0),
    "Phoenix": (761.4, 7242.6),
    "Pitfall": (-229.4, 6463.7),
    "Pong": (-20.7, 14.6),
    "PrivateEye": (24.9, 69571.3),
    "Qbert": (163.9, 13455.0),
    "Riverraid": (1338.5, 17118.0),
    "RoadRunner": (11.5, 7845.0),
    "Robotank": (2.2, 11.9),
    "Seaquest": (68.4, 42054.7),
    "Skiing": (-17098.1, -4336.9),
    "Solaris": (1236.3, 12326.7),
    "SpaceInvaders": (148.0, 1668.7),
    "StarGunner": (664.0, 10250.0),
    "Surround": (-10.0, 6.5),
    "Tennis": (-23.8, -8.3),
    "TimePilot": (3568.0, 5229.2),
    "Tutankham": (11.4, 167.6),
    "UpNDown": (533.4, 11693.2),
    "Venture": (0.0, 1187.5),
    "VideoPinball": (16256.9, 17667.9),
    "WizardOfWor": (563.5, 4756.5),
    "YarsRevenge": (3092.9, 54576.9),
    "Zaxxon": (32.5, 9173.3),
}

# Aitchison et al. 2023: the five games and their regression weights.
ATARI5_WEIGHTS: dict[str, float] = {
    "BattleZone": 0.3820,
    "DoubleDunk": 0.0679,
    "NameThisGame": 0.3108,
    "Phoenix": 0.1241,
    "Qbert": 0.0805,
}
ATARI5 = tuple(ATARI5_WEIGHTS)

# Reference scores on the Atari-5 games, each with what it is and where it comes from.
REFERENCES: dict[str, dict] = {
    "dopamine_dqn_10m": {
        "label": "Dopamine DQN, 10M frames",
        "source": "Dopamine's JAX baselines (Nature CNN, sticky actions 0.25, training "
                  "return, mean of 5 seeds)",
        "scores": {"BattleZone": 15395.0, "DoubleDunk": -17.6, "NameThisGame": 5553.0,
                   "Phoenix": 4229.0, "Qbert": 1245.0},
    },
    "dopamine_rainbow_10m": {
        "label": "Dopamine Rainbow, 10M frames",
        "source": "Dopamine's JAX baselines (Nature CNN, sticky actions 0.25, training "
                  "return, mean of 5 seeds)",
        "scores": {"BattleZone": 17016.0, "DoubleDunk": -19.5, "NameThisGame": 8468.0,
                   "Phoenix": 4665.0, "Qbert": 5154.0},
    },
    "impala_deep_200m": {
        "label": "IMPALA (deep), 200M frames",
        "source": "Espeholt et al. 2018, per-game scores of IMPALA (deep) (57-game median "
                  "191.8%)",
        "scores": {"BattleZone": 20885.0, "DoubleDunk": -0.33, "NameThisGame": 21537.0,
                   "Phoenix": 210996.0, "Qbert": 351200.0},
    },
    "apex_22b": {
        "label": "Ape-X DQN, 22.8B frames",
        "source": "Horgan et al. 2018, per-game scores of Ape-X DQN (57-game median "
                  "434.1%)",
        "scores": {"BattleZone": 98895.0, "DoubleDunk": 23.5, "NameThisGame": 25783.0,
                   "Phoenix": 224491.0, "Qbert": 302391.0},
    },
}


def human_normalized(game: str, score: float) -> float:
    """``100 (score - random) / (human - random)``: the score's HNS in percent."""
    if game not in RANDOM_HUMAN:
        raise KeyError(f"no random and human score for {game!r}; the table has the 57 games "
                       f"of Badia et al. 2020 by ALE name (e.g. {', '.join(ATARI5)})")
    random, human = RANDOM_HUMAN[game]
    return 100.0 * (score - random) / (human - random)


def atari5_estimate(scores: Mapping[str, float]) -> float:
    """The Atari-5 estimate (percent) of the 57-game median HNS from raw scores on the five
    games: ``10^(sum_g w_g log10(1 + max(HNS_g, 0))) - 1`` (Aitchison et al. 2023)."""
    missing = [game for game in ATARI5 if game not in scores]
    if missing:
        raise KeyError(f"the Atari-5 estimate needs a score on each of {', '.join(ATARI5)}; "
                       f"missing {', '.join(missing)}")
    log_sum = sum(weight * math.log10(1.0 + max(human_normalized(game, scores[game]), 0.0))
                  for game, weight in ATARI5_WEIGHTS.items())
    return 10.0 ** log_sum - 1.0
