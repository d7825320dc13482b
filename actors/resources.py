"""A subtask actor's request to Ray (:class:`Resources`), merged over the operators it chains."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resources:
    """What one subtask asks Ray for. The default is a tiny CPU fraction, so a
    2-core laptop can run many subtasks beside a Spark executor."""

    num_cpus: float = 0.01
    memory: int | None = None  # bytes
    custom: tuple[tuple[str, float], ...] = ()

    def ray_options(self) -> dict:
        options: dict = {"num_cpus": self.num_cpus}
        if self.memory:
            options["memory"] = self.memory
        if self.custom:
            options["resources"] = dict(self.custom)
        return options

    def merged(self, other: "Resources") -> "Resources":
        """Per resource, the larger of the two (chained operators share one subtask)."""
        custom = dict(self.custom)
        for name, amount in other.custom:
            custom[name] = max(custom.get(name, 0.0), amount)
        return Resources(max(self.num_cpus, other.num_cpus),
                         max(self.memory or 0, other.memory or 0) or None,
                         tuple(sorted(custom.items())))
