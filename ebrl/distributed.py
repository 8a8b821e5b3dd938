"""Which process of a run this is, and joining the others through `jax.distributed`.

A run that spans processes (one per host, or several on one machine) is
multi-controller SPMD: every process runs the same program, acts on its own
envs and local devices, and takes part in one learner whose mesh holds every
process's training devices (ebrl/learner.py). JAX's coordination service
joins them; on CPU their collectives go through gloo.

Joining must happen before anything starts a JAX backend, so the launchers call
`initialize` first. A process started without the three flags, outside any
cluster JAX recognises, is a run of one process exactly as without this module.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import time

from ebrl.errors import UserError

# A lost process must stop the others well inside a minute: the coordination service declares a
# process dead after this many seconds without its heartbeat, and every survivor's next
# collective or heartbeat check then fails.
HEARTBEAT_TIMEOUT_S = 20
# Set for each task by srun, mpirun / Open MPI and MPICH's launchers: only then is a cluster asked.
_CLUSTER_TASK_VARIABLES = ("SLURM_PROCID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_ADDRESS = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]+)$")


@dataclasses.dataclass(frozen=True)
class ProcessIdentity:
  """What the launch flags say about this process's place in a run; all None: not told."""

  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  local_device_ids: tuple[int, ...] | None = None
  connect_timeout_s: int = 300
  # Where process 0's coordination service listens (host:port). None: the coordinator address itself,
  # so a localhost run listens on loopback only and a multi-host run on the one interface its peers
  # dial; never every interface unless asked ("[::]:port"), since the service is unauthenticated.
  coordinator_bind: str | None = None

  @property
  def given(self) -> bool:
    return any(v is not None for v in (self.coordinator_address, self.num_processes, self.process_id))


def check(identity: ProcessIdentity) -> None:
  """A UserError naming the first bad value; nothing is contacted."""
  named = {"--coordinator_address": identity.coordinator_address, "--num_processes": identity.num_processes,
           "--process_id": identity.process_id}
  if identity.given and any(v is None for v in named.values()):
    missing = ", ".join(k for k, v in named.items() if v is None)
    raise UserError(f"a run over several processes needs --coordinator_address, --num_processes and --process_id "
                    f"together; missing {missing}")
  if identity.local_device_ids is not None and not identity.given:
    raise UserError("--local_device_ids chooses this process's devices in a run over several processes; give "
                    "--coordinator_address, --num_processes and --process_id with it")
  bind = identity.coordinator_bind
  if bind is not None and not _is_host_port(bind):
    raise UserError(f"--coordinator_bind={bind!r} is not host:port (a port in 1-65535), e.g. 10.0.0.1:12345 for "
                    "one interface or [::]:12345 for every interface (anyone who can reach it can join the run)")
  if not identity.given:
    return
  if not _is_host_port(identity.coordinator_address):
    raise UserError(f"--coordinator_address={identity.coordinator_address!r} is not host:port (a port in 1-65535), "
                    "e.g. 10.0.0.1:12345 or localhost:12345")
  if identity.num_processes < 1:
    raise UserError(f"--num_processes={identity.num_processes} must be at least 1")
  if not 0 <= identity.process_id < identity.num_processes:
    raise UserError(f"--process_id={identity.process_id} must be in [0, {identity.num_processes - 1}] for "
                    f"--num_processes={identity.num_processes}")
  if identity.local_device_ids is not None and (
      not identity.local_device_ids or min(identity.local_device_ids) < 0
      or len(set(identity.local_device_ids)) != len(identity.local_device_ids)):
    raise UserError(f"--local_device_ids={','.join(map(str, identity.local_device_ids))} must be distinct device "
                    "indices >= 0")
  if identity.connect_timeout_s < 1:
    raise UserError(f"--connect_timeout_s={identity.connect_timeout_s} must be at least 1")


def detected_cluster() -> str | None:
  """The cluster environment JAX would join on its own (SLURM, Open MPI, MPICH), or None. Without
  a launcher's per-task variables nothing is imported: a plain launch stays as quick to start (and
  to report a mistake) as before."""
  if not any(v in os.environ for v in _CLUSTER_TASK_VARIABLES):
    return None
  try:
    from jax._src import clusters  # pylint: disable=g-import-not-at-top
  except ImportError:  # A JAX without the module: nothing is detected, flags still work.
    return None
  for env in clusters.ClusterEnv._cluster_types:  # pylint: disable=protected-access
    try:
      if env.is_env_present() and env.__name__ not in ("GkeTpuCluster", "GceTpuCluster", "SingleSliceGceTpuCluster",
                                                       "MultisliceGceTpuCluster"):
        # A one-task allocation (a plain `salloc` shell) is a run of one process.
        if env.get_process_count() > 1:
          return env.__name__
    except Exception:  # pylint: disable=broad-except  # A half-set environment is no cluster.
      continue
  return None


def free_port() -> int:
  """A port on localhost nothing listens on now (for a coordinator started moments later)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _is_host_port(address: str) -> bool:
  """host:port with a port in 1-65535."""
  match = _ADDRESS.match(address)
  return bool(match) and 0 < int(match["port"]) < 65536


def _host_port(address: str) -> tuple[str, int]:
  match = _ADDRESS.match(address)
  return match["host"].strip("[]"), int(match["port"])


def bind_address(identity: ProcessIdentity) -> str:
  """host:port process 0's coordination service listens on: --coordinator_bind, or the coordinator
  address itself (JAX's own default is every interface, "[::]:port")."""
  return identity.coordinator_bind or identity.coordinator_address


def _check_can_listen(address: str) -> None:
  """Process 0 runs the coordinator at `address` (its bind address): an address this host cannot
  listen on (a port taken, a host not its own) is one line, where JAX would abort the process."""
  host, port = _host_port(address)
  try:
    for family, kind, proto, _, sockaddr in socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM):
      with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # As the service binds: TIME_WAIT is no conflict.
        s.bind(sockaddr)
  except OSError as e:
    raise UserError(f"process 0 runs the coordinator at {address}, but this host cannot listen there "
                    f"({(e.strerror or str(e)).lower()}); choose a free port (or --coordinator_bind, an "
                    "address of this host)") from None


def _wait_for_coordinator(identity: ProcessIdentity) -> None:
  """Returns once something listens at the coordinator's address (process 0 starts it), or raises
  a UserError after identity.connect_timeout_s."""
  host, port = _host_port(identity.coordinator_address)
  deadline = time.monotonic() + identity.connect_timeout_s
  while True:
    try:
      with socket.create_connection((host, port), timeout=1.0):
        return
    except OSError as e:
      if time.monotonic() >= deadline:
        raise UserError(f"process {identity.process_id} could not join the run at {identity.coordinator_address} "
                        f"within {identity.connect_timeout_s} s: {(e.strerror or str(e)).lower()} (is process 0 "
                        "started, with the same --coordinator_address?)") from None
      time.sleep(0.2)


def initialize(identity: ProcessIdentity, max_processes: int | None = None) -> int:
  """Joins the run's other processes (flags, or a detected cluster); returns how many processes the
  run has. One process without flags: nothing happens, and JAX's backend is left untouched. A
  caller whose runs cannot yet span more than `max_processes` gets a UserError before anything is
  contacted."""
  check(identity)
  cluster = None if identity.given else detected_cluster()
  if max_processes is not None and ((identity.num_processes or 1) > max_processes or cluster is not None):
    asked = f"--num_processes={identity.num_processes}" if identity.given else f"a {cluster} job of several tasks"
    raise UserError(f"{asked}: this launcher's runs span one process for now; start it as one process "
                    "(launch.train trains over several; launch.bench --processes=1,2 compares process counts)")
  if not identity.given and cluster is None:
    return 1
  if identity.given and identity.num_processes == 1:
    return 1
  if identity.given:  # JAX aborts the process when it cannot connect: the address is tried here first.
    if identity.process_id == 0:  # The coordinator will listen there, in this process.
      _check_can_listen(bind_address(identity))
    else:
      _wait_for_coordinator(identity)
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # A lost process must not abort the others with JAX's fatal log: with recoverability the
  # survivors go on, notice the loss themselves (ebrl/peer_watch.py) and exit with one line.
  jax.config.update("jax_enable_recoverability", True)
  import atexit  # pylint: disable=g-import-not-at-top
  from ebrl import process_group  # pylint: disable=g-import-not-at-top
  atexit.register(process_group.leave_at_exit)  # After JAX's registration: runs before its clean-up.
  kwargs = dict(initialization_timeout=identity.connect_timeout_s, heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  try:
    if identity.given:
      jax.distributed.initialize(identity.coordinator_address, identity.num_processes, identity.process_id,
                                 local_device_ids=list(identity.local_device_ids) if identity.local_device_ids
                                 else None, coordinator_bind_address=bind_address(identity), **kwargs)
    else:  # A detected cluster: JAX finds the coordinator; it listens on every interface unless told.
      jax.distributed.initialize(coordinator_bind_address=identity.coordinator_bind, **kwargs)
  except RuntimeError as e:
    where = identity.coordinator_address or f"the {cluster} job's coordinator"
    first = next((l.strip() for l in str(e).splitlines() if l.strip()), type(e).__name__)
    raise UserError(f"process {identity.process_id if identity.given else '?'} could not join the run at {where} "
                    f"within {identity.connect_timeout_s} s: {first[:200]}") from None
  return jax.process_count()
