"""MinAtar (Young & Tian 2019): its five 10x10 games stepped as one batch in this process.

The ``minatar`` package's ``Environment`` is driven directly (``act(a) -> (reward,
terminal)``, ``state()``, ``reset()``), not through its gymnasium wrappers, with the
paper's settings as defaults: all 6 actions, sticky actions with probability 0.1
(Section 3, after Machado et al. 2018), difficulty ramping on. Names: "MinAtar-Breakout"
(also the package's gym ids "MinAtar/Breakout-v0", all actions, and "-v1", the minimal
set), for Asterix, Breakout, Freeway, Seaquest and SpaceInvaders.

:class:`MinAtarGames` is the stepping core only; ``distrl.envs.MinAtarEnvs`` puts it
behind the :class:`~distrl.envs.VectorEnv` interface (call order, episode statistics).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from distrl.validation import ConfigError

# Our name -> the package's module name (minatar.environments.<name>).
MINATAR_GAMES = {
    "Asterix": "asterix",
    "Breakout": "breakout",
    "Freeway": "freeway",
    "Seaquest": "seaquest",
    "SpaceInvaders": "space_invaders",
}
# Young & Tian 2019, Section 3: sticky actions as Machado et al. 2018 propose, but 0.1.
MINATAR_STICKY_ACTION_PROBABILITY = 0.1
MINATAR_FRAME = (10, 10)  # every game's grid, height x width
_NUM_ACTIONS = 6  # the package's full set: no-op, left, up, right, down, fire

_PREFIX = re.compile(r"minatar[-/]", re.IGNORECASE)
_VERSION = re.compile(r"-v(\d+)$")
_GAMES_BY_KEY = {name.lower(): module for name, module in MINATAR_GAMES.items()}


def is_minatar(env_id: str) -> bool:
    """True if ``env_id`` names MinAtar ("MinAtar-Breakout", "MinAtar/Breakout-v1"), even a
    game it lacks: :func:`minatar_game` then says which games there are."""
    return _PREFIX.match(env_id) is not None


def minatar_game(env_id: str) -> tuple[str, int | None]:
    """The package's game name and the gym id's version of a MinAtar ``env_id``.

    "MinAtar-SpaceInvaders" -> ("space_invaders", None); "MinAtar/Breakout-v1" ->
    ("breakout", 1). Case and underscores do not matter ("minatar-space_invaders").

    Raises:
        ConfigError: naming env.id and the five games, if it names none of them or a
            version other than the package's v0 (all actions) and v1 (minimal set).
    """
    games = ", ".join(f"MinAtar-{name}" for name in MINATAR_GAMES)
    name = _PREFIX.sub("", env_id, count=1)
    version = None
    match = _VERSION.search(name)
    if match:
        version = int(match.group(1))
        name = name[: match.start()]
    game = _GAMES_BY_KEY.get(name.replace("_", "").lower())
    if not is_minatar(env_id) or game is None or version not in (None, 0, 1):
        raise ConfigError(
            f"env.id: {env_id!r} names no MinAtar game; expected one of {games} "
            "(or MinAtar/<Game>-v0, all actions, or -v1, the minimal set)"
        )
    return game, version


# The package is an extra (pyproject.toml: minatar), not a core requirement.
MINATAR_INSTALL = 'pip install --no-build-isolation -e ".[minatar]"'


def require_minatar(env_id: str) -> None:
    """Import the ``minatar`` package, or say in one line how to install it.

    Raises:
        ConfigError: naming ``env_id`` and the install command, if the package is absent.
    """
    try:
        import minatar  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != "minatar":  # the package is there but something it imports is not
            raise
        raise ConfigError(
            f"env.id {env_id!r} needs the minatar package, which is not installed; "
            f"install it with {MINATAR_INSTALL} (in the repository), or pip install minatar"
        ) from None


def _minatar_environment(**kwargs: Any) -> Any:
    """Build one ``minatar.Environment``; one seam so tests see exactly what reaches it.

    Imported here, not at the top: the package imports matplotlib and seaborn (about a
    second), which only processes that play MinAtar should pay.
    """
    import minatar

    return minatar.Environment(**kwargs)


class MinAtarGames:
    """``num_envs`` games of one MinAtar title, stepped in a Python loop.

    Autoreset in the same step: where a game ended (terminal, or ``max_episode_steps``
    steps reached: truncated), the observation returned is the next game's first.

    Args:
        game: the package's name ("breakout", "space_invaders", ...).
        num_envs: batch size ``N``.
        sticky_action_probability: chance that a step repeats the previous action
            instead (the package draws it from the game's own random stream).
        difficulty_ramping: the games speed up as play goes on (Asterix, Seaquest,
            SpaceInvaders; Breakout and Freeway have no ramping).
        full_action_space: True: the 6 actions; False: the game's minimal set, action
            ``k`` being ``minimal_action_set()[k]``.
        max_episode_steps: a game is cut (truncated) after this many steps.
    """

    def __init__(
        self,
        game: str,
        num_envs: int,
        sticky_action_probability: float,
        difficulty_ramping: bool,
        full_action_space: bool,
        max_episode_steps: int,
    ) -> None:
        self.games = [
            _minatar_environment(env_name=game, sticky_action_prob=sticky_action_probability,
                                 difficulty_ramping=difficulty_ramping)
            for _ in range(num_envs)
        ]
        first = self.games[0]
        actions = range(_NUM_ACTIONS) if full_action_space else first.minimal_action_set()
        self.action_set = np.array(actions, np.int64)  # our action k -> the package's
        self.num_envs = num_envs
        self.num_channels = int(first.n_channels)
        self.observation_shape = (self.num_channels, *MINATAR_FRAME)
        self.max_episode_steps = int(max_episode_steps)
        # The package hands out bool [10, 10, C] grids; they are copied here game by game,
        # then transposed to [N, C, 10, 10] in one numpy call per step.
        self._grids = np.zeros((num_envs, *MINATAR_FRAME, self.num_channels), np.uint8)
        self._steps = np.zeros(num_envs, np.int64)  # steps into each env's current game

    def _observations(self) -> np.ndarray:
        # A new array each step: callers keep observations across steps (the n-step and
        # sequence writers hold them as tensors sharing this memory).
        observations = np.empty((self.num_envs, *self.observation_shape), np.uint8)
        np.copyto(observations, self._grids.transpose(0, 3, 1, 2))
        return observations

    def reset(self, seed: int | None) -> np.ndarray:
        """Start a new game in every env; with ``seed``, env ``i`` first draws from a
        ``RandomState(seed + i)`` (game and sticky actions share it). Returns ``[N, C, 10,
        10]`` uint8."""
        for i, game in enumerate(self.games):
            if seed is not None:
                game.seed(seed + i)
            game.reset()  # the package's constructor already reset once, from an unseeded state
            self._grids[i] = game.state()
        self._steps[:] = 0
        return self._observations()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One step of every game with ``actions`` ``[N]`` (indices into the action set).

        Returns:
            ``(observations [N, C, 10, 10] uint8, rewards [N] float32, terminated [N]
            bool, truncated [N] bool)``; where either flag is set the observation is
            already the next game's.
        """
        package_actions = self.action_set[actions].tolist()
        self._steps += 1
        cut = (self._steps >= self.max_episode_steps).tolist()
        rewards = []
        terminals = []
        for i, game in enumerate(self.games):
            reward, terminal = game.act(package_actions[i])
            rewards.append(reward)
            terminals.append(terminal)
            if terminal or cut[i]:
                game.reset()
                self._steps[i] = 0
            self._grids[i] = game.state()
        terminated = np.array(terminals, bool)
        truncated = np.array(cut, bool) & ~terminated
        return self._observations(), np.array(rewards, np.float32), terminated, truncated


def make_minatar_games(
    env_id: str,
    num_envs: int,
    sticky_action_probability: float | None,
    difficulty_ramping: bool,
    full_action_space: bool | None,
    max_episode_steps: int,
) -> MinAtarGames:
    """The games ``env_id`` names, the paper's settings where an argument is None.

    Args:
        env_id: "MinAtar-Breakout", "MinAtar/Breakout-v1", ... (see :func:`minatar_game`).
        num_envs: batch size.
        sticky_action_probability: None: 0.1 (Young & Tian 2019, Section 3).
        difficulty_ramping: on in the paper.
        full_action_space: None: all 6 actions (the paper), or as a gym id's version
            says (v0 all, v1 minimal). A value contradicting the version is refused.
        max_episode_steps: steps before a game is truncated.

    Raises:
        ConfigError: an unknown game, an action set the id's version contradicts, or
            the minatar package not installed (an extra: ``pip install -e ".[minatar]"``).
    """
    game, version = minatar_game(env_id)
    require_minatar(env_id)
    if version is not None:
        full_for_version = version == 0
        if full_action_space is not None and bool(full_action_space) != full_for_version:
            raise ConfigError(
                f"env.full_action_space={full_action_space} contradicts env.id {env_id!r}: "
                f"v0 uses all actions, v1 the minimal set; drop the version or the setting"
            )
        full_action_space = full_for_version
    if sticky_action_probability is None:
        sticky_action_probability = MINATAR_STICKY_ACTION_PROBABILITY
    return MinAtarGames(
        game,
        num_envs,
        sticky_action_probability=float(sticky_action_probability),
        difficulty_ramping=bool(difficulty_ramping),
        full_action_space=True if full_action_space is None else bool(full_action_space),
        max_episode_steps=max_episode_steps,
    )
