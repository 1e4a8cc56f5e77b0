"""Isolation of the sandbox: bubblewrap namespaces around each worker, one narrowed view per block.

Two backends, chosen by ``SABRE_SANDBOX`` (``RuntimePool(sandbox=...)``):

``bwrap``
    Every worker process runs inside bubblewrap: new user, PID, IPC, UTS, network (nothing but its
    own loopback: helpers that need the network run in the parent) and cgroup namespaces, its own
    session, killed with the server. Its root is an empty tmpfs made read-only, holding read-only
    binds of /usr (and the /bin, /lib links), a short list of /etc files, the Python installation,
    the virtualenv and the ``app`` package (not the project directory: it may hold a ``.env``), a
    fresh /proc, a minimal /dev, and the workspaces directory read-write at its own path. The
    environment is built from scratch (``--clearenv``).

    A worker serves many conversations, so the child forked for each block narrows its view
    before any code of the block runs. A worker forked by its zygote first makes a network and
    an IPC namespace of its own (``worker_namespaces``, in a user namespace of its own where it
    keeps no capability), which its children, one at a time, share. While idle (``after_fork``,
    single-threaded) each child creates its own user and mount namespaces (privileged inside
    them, and only there; the network and IPC ones too under a worker that has none), covers the
    workspaces directory with an empty tmpfs (keeping a directory fd on it), mounts a fresh /tmp
    and /dev/shm (each sized to the block's ``file_size_mb``: they are memory), forbids any further
    user namespace and empties its capability bounding set.
    When its block arrives (``enter``) it opens the conversation's directory through that fd one
    component at a time without following symbolic links, binds it back at its own path, makes
    the cover read-only and drops every capability of every thread. The kernel locks the mounts
    the child inherited from the worker, so the code cannot unmount the cover to see the other
    conversations; it cannot ptrace the worker (another user namespace); with Landlock ABI 6 its
    signals (``kill -1`` included) and abstract unix sockets reach only its own processes, not
    the worker nor any other process of the namespace; SysV IPC, /tmp and /dev/shm die with the
    child; and the worker kills whatever the block left running before it forks the next child.

    When the server runs as root the sandbox must not: a process of host uid 0 ignores
    RLIMIT_NPROC (a fork bomb would take the machine) even inside a user namespace. The pool
    then gives bubblewrap a user namespace it made itself (``create_userns``) that maps host
    root, for bubblewrap's own set-up, and an unprivileged identity (``nobody``), which the
    worker switches to before it imports anything; conversation directories are chowned to it.

``process``
    A plain child process of a worker, for machines where bubblewrap cannot run (it logs a
    warning). Limits, the clean environment and no-new-privileges still apply. When the server
    runs as root, each block switches to the unprivileged identity before its code runs (so it
    cannot read the server's /proc, signal the server or the workers, write system files, or
    escape RLIMIT_NPROC); idle children stay root until then, out of reach of other blocks'
    signals. If that identity cannot reach Python or the workspaces by their paths (Python
    installed under /root), the worker makes itself a mount namespace in which it can. Otherwise
    blocks run as the server's user, and the server makes itself non-dumpable so that its
    /proc/<pid>/environ and memory stay unreadable. Not covered by this backend: the network,
    other conversations' files, /tmp, processes that leave the block's session, and (without
    root) the server's own files and kill -1.

Both: where the host lets the server make cgroups (``cgroups``), each worker runs in one of its
own, so the kernel bounds the memory and tasks of a block's whole process tree, and the worker
counts the tree's OOM kills and CPU time (``cgroup_meter``); elsewhere the limits bind each
process of a block alone. ``watch_forks`` tells a block that died of its process limit
(``limit: processes N``) from one that merely got an EAGAIN.

The package, by side: ``host`` (the server's: bubblewrap's command line, the root server's user
namespace), ``confine`` (the sandbox's: a worker's set-up, a child's narrowing and ``enter``),
``identity`` (who blocks run as when the server is root), ``cgroups`` (the server's: a cgroup per
worker) and ``cgroup_meter`` (the worker's reading of it), ``linux`` (the system calls both use),
``probe`` (the start-up check) and ``backends`` (the words). Everything the sandbox imports from
here is standard library only.
"""

from app.runtime.isolation.backends import Backend, SandboxMode
from app.runtime.isolation.cgroup_meter import CgroupMeter
from app.runtime.isolation.cgroups import Cgroups, CgroupsUnavailable, WorkerCgroup, open_cgroups
from app.runtime.isolation.confine import (
    after_fork,
    allow_reading,
    backend,
    block_tmp,
    check_worker_namespaces,
    configure_worker,
    enter,
    fork_refused,
    hides_processes,
    remove_block_tmp,
    thread_started,
    tmpfs_bytes,
    watch_forks,
    worker_namespaces,
)
from app.runtime.isolation.host import bwrap_argv, create_userns, find_bwrap, raise_descriptor_limit
from app.runtime.isolation.identity import (
    Identity,
    adopt,
    conversation_identity,
    make_traversable,
    reachable,
    sandbox_identity,
)
from app.runtime.isolation.linux import (
    capability_sets,
    children,
    drop_capabilities,
    host_pid,
    kill_tree,
    set_dumpable,
)

__all__ = [
    "Backend",
    "CgroupMeter",
    "Cgroups",
    "CgroupsUnavailable",
    "Identity",
    "SandboxMode",
    "WorkerCgroup",
    "adopt",
    "after_fork",
    "allow_reading",
    "backend",
    "block_tmp",
    "bwrap_argv",
    "capability_sets",
    "check_worker_namespaces",
    "children",
    "configure_worker",
    "conversation_identity",
    "create_userns",
    "drop_capabilities",
    "enter",
    "find_bwrap",
    "fork_refused",
    "hides_processes",
    "host_pid",
    "kill_tree",
    "make_traversable",
    "open_cgroups",
    "raise_descriptor_limit",
    "reachable",
    "remove_block_tmp",
    "sandbox_identity",
    "set_dumpable",
    "thread_started",
    "tmpfs_bytes",
    "watch_forks",
    "worker_namespaces",
]
