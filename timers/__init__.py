"""Timer service (flat-array heaps)."""

from raystream.timers.heap import TimerHeap
from raystream.timers.service import TimerService, TimerSnapshot

__all__ = ["TimerHeap", "TimerService", "TimerSnapshot"]
