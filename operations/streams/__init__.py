"""Background streams: the long work on a Spark (the image build and its ship, the downloads, the weight files, the
copies to the worker) started in the background so that it overlaps, and awaited before anything reads it.

pyinfra runs an operation on both Sparks, then the next: a long operation holds everything after it. A stream
instead is started by its operation as a systemd unit on the Spark, `sparkfold-<name>` (operations/remote/
stream_runner.py), while the run goes on; it waits on the Spark for the streams whose output it reads (`after`), so
each piece of work starts as soon as its inputs are whole. `streams_finished` waits for all of a run's streams,
relaying their progress lines from the journal and ending with each stream's time and the critical path
(operations/remote/stream_wait.py).

A stream is the system's, not the ssh session's: a cut connection or a killed run leaves it going, and the next run
adopts it when its work is the same (the digest of its commands); other work of that name (an input changed) stops
it and starts afresh, each command resuming what is whole. stop.py stops them all (`streams_stopped`). What a start
does is one pure decision (stream_unit.stream_action) from the unit's state (operations/remote/stream_unit.py).

Whether a stream starts is decided as its work's own operations decide (`stream_started`): it runs what they
yield now, and nothing when they find the Spark converged, so a second run changes nothing and --dry lists the
streams that would start. When a stream it reads starts in the same run, the work cannot be read from the Spark
yet: it then runs its commands as a fresh start does.
"""

from operations.streams.ops import (
    Stream,
    background,
    stream_plan,
    stream_started,
    streams_awaited,
    streams_ended,
    streams_finished,
    streams_stopped,
)

__all__ = ["Stream", "background", "stream_plan", "stream_started", "streams_awaited", "streams_ended",
           "streams_finished", "streams_stopped"]
