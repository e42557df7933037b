"""A meeting point of the two Sparks in the run.

pyinfra orders the operations of different hosts by their depth in each host's own sequence, not by source line,
so an operation only one Spark runs can overtake the other Spark's earlier work (the worker would verify the Engram
tables before the head has sent them). An operation both Sparks run at one call site is a barrier: nothing after it
starts before everything before it has finished on both.
"""

from pyinfra import host
from pyinfra.api import operation


@operation()
def both_sparks_reached(step: str):
    """Changes nothing: both Sparks have finished `step`."""
    host.noop(f"{step}: done on both Sparks")
    if False:  # a generator that yields nothing
        yield
