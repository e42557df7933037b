"""Background streams: the long work on a Spark (the image build and its ship, the downloads, the weight files, the
copies to the worker) started in the background so that it overlaps, and awaited before anything reads it.

pyinfra runs an operation on both Sparks, then the next: a long operation holds everything after it. A stream
instead is started by its operation and runs on the Spark, detached from the ssh session, while the run goes on
(operations/remote/stream_runner.py); it waits on the Spark for the streams whose output it reads (`after`), so
each piece of work starts as soon as its inputs are whole. `streams_finished` waits for all of a run's streams,
relaying their progress lines and ending with each stream's time and the critical path
(operations/remote/stream_wait.py). A stream ends with the run that started it (its watchdog), keeping what is
whole; the next run starts it again and each command resumes.

Whether a stream starts is decided as its work's own operations decide (`stream_started`): it runs what they
yield now, and nothing when they find the Spark converged, so a second run changes nothing and --dry lists the
streams that would start. When a stream it reads starts in the same run, the work cannot be read from the Spark
yet: it then runs its commands as a fresh start does.
"""

from operations.streams.ops import Stream, background, stream_action, stream_started, streams_awaited, streams_finished

__all__ = ["Stream", "background", "stream_action", "stream_started", "streams_awaited", "streams_finished"]
