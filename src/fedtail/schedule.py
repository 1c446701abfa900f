"""The plan of a run's rounds, in one place: stage tasks, rounds of global optimisation, evaluations.

Rounds are communication rounds (one aggregation each), 1-based. Without stage tasks every round
trains the one task and is evaluated every ``eval_every`` rounds, at each of the final
``eval_final`` and at the last. With stage tasks (``--partition stages``, M stages per client,
GLDP's STHFL setting; M = 1 too):

- ``blocks``: rounds 1..R/M train stage 0, the next R/M stage 1, ... (``--rounds-per-stage``);
  the last round of every block is evaluated too;
- ``nested`` (default): round r trains stage (r − 1) mod M; M consecutive rounds make one round
  of global optimisation, whose clients are sampled once (Algorithm 1 of the GLDP paper) and
  which is evaluated at its end (every ``eval_every``-th one).

:class:`RoundPlan` answers every question the engine asks of the plan (``config.plan``); the
data each round's clients see is :class:`fedtail.engine.executors.Views`'s (by the plan's stage
and seen stages), the stage metrics are :mod:`fedtail.metrics.stages`'.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoundPlan:
    """What each round of a run does (``RunConfig.plan``)."""

    rounds: int
    stages: int | None = None  # M with stage tasks, None without
    mode: str | None = None  # --stage-schedule: "nested" (None: the default) or "blocks"
    rounds_per_stage: int | None = None
    eval_every: int = 1
    eval_final: int = 0

    # Rounds are communication rounds (one aggregation each), 1-based. With stage tasks:
    # - blocks: rounds 1..R/M train stage 0, the next R/M stage 1, ...;
    # - nested: round r trains stage (r − 1) mod M; M consecutive rounds make one round of
    #   global optimisation, whose clients are sampled once (Algorithm 1 of the GLDP paper).
    @property
    def has_stages(self) -> bool:
        """Whether the run has stage tasks (--partition stages, any M, M = 1 included)."""
        return self.stages is not None

    @property
    def num_stages(self) -> int:
        """M: stage tasks per client with --partition stages, else 1."""
        return self.stages if self.stages is not None else 1

    @property
    def schedule(self) -> str | None:
        """"nested" or "blocks" with stage tasks (None without)."""
        return (self.mode or "nested") if self.has_stages else None

    @property
    def stage_rounds(self) -> int:
        """Rounds per stage in a block (blocks); 1 with nested stages, the run's rounds without."""
        if self.schedule == "nested":
            return 1
        return self.rounds_per_stage or self.rounds // self.num_stages

    def stage_of(self, rnd: int) -> int:
        """The 0-based stage task trained in round ``rnd`` (1-based); 0 without stages."""
        if self.num_stages == 1:
            return 0
        if self.schedule == "nested":
            return (rnd - 1) % self.num_stages
        return (rnd - 1) // self.stage_rounds

    def seen_stages(self, rnd: int) -> int:
        """How many stage tasks have been trained by the end of round ``rnd`` (the evaluation's
        stages 0..this − 1): the stage + 1 with blocks; with nested stages the same in the first
        round of global optimisation and M after it."""
        if self.schedule == "nested":
            return min(rnd, self.num_stages)
        return self.stage_of(rnd) + 1

    def global_round(self, rnd: int) -> int:
        """The round of global optimisation of round ``rnd``: ⌈rnd / M⌉ with nested stages, else rnd."""
        return -(-rnd // self.num_stages) if self.schedule == "nested" else rnd

    def is_stage_end(self, rnd: int) -> bool:
        """Whether ``rnd`` ends a stage block (blocks), a round of global optimisation (nested), the run (no stages)."""
        if self.schedule == "nested":
            return rnd % self.num_stages == 0
        return rnd % self.stage_rounds == 0 if self.has_stages else rnd == self.rounds

    def evaluates(self, rnd: int) -> bool:
        """Whether round ``rnd`` is evaluated: every ``eval_every`` rounds, each of the final
        ``eval_final``, at every stage end and the last round; with nested stages at the end of every
        ``eval_every``-th round of global optimisation, of each of the final ``eval_final`` and of the
        last round (its clients have then trained all the round's stage tasks)."""
        final = self.eval_final
        if self.schedule == "nested":
            g, last = self.global_round(rnd), self.global_round(self.rounds)
            return self.is_stage_end(rnd) and (g % self.eval_every == 0 or g > last - final or rnd == self.rounds)
        return rnd % self.eval_every == 0 or rnd > self.rounds - final or self.is_stage_end(rnd) or rnd == self.rounds

    def has_later_stage(self, rnd: int) -> bool:
        """Whether some round after ``rnd`` trains another stage task (a client may need what it ends
        this stage with)."""
        if self.num_stages == 1:
            return False
        if self.schedule == "nested":
            return rnd < self.rounds
        return self.stage_of(rnd) < self.num_stages - 1
