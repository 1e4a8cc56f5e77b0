"""The sandbox child (everything that runs in it; standard library only, no pydantic or asyncio):
runs one block of untrusted Python in a fresh fork of a warm worker.

While idle, the child prepares everything that does not depend on the block (its own session,
output capture, signal handlers) and runs a dry block through the whole code path, so the real
block pays no first-use costs (copy-on-write faults, caches); then it tells the parent it is ready
and blocks on its request pipe. When a block arrives it applies the limits, restores the
namespace, runs the code, answers helper calls from the journal or over the pipe, runs the
sandbox-side helpers (``app.runtime.library``) and journals those with effects, captures the
figures left open, snapshots the namespace, reports, and exits; or, when the pool asked it to
``keep`` and the block left no thread running, stays live for its conversation's next block, which
then runs in the namespace it has (the snapshot is still sent after every block).

Pickles are only ever loaded here, never in the parent: a snapshot comes from an earlier child of
the same conversation.
"""
